"""``multipart/form-data`` bodies (RFC 7578) of ``POST /openai/v1/files``, parsed with the
standard library's MIME parser (no extra dependency in the API Lambda's asset).

The body arrives whole (a Lambda proxy event), so parsing in memory is what there is; its size
is bounded before this runs (:data:`asyncinfer.openai_api.routes_files.MAX_MULTIPART_BYTES`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from email.message import Message
from email.parser import BytesParser
from email.policy import HTTP

from asyncinfer.core.errors import InvalidMultipart


@dataclass
class FilePart:
    """A file field: its ``filename`` (as the client sent it) and bytes."""

    filename: str
    data: bytes


@dataclass
class Form:
    """Parsed form: text ``fields`` (name -> last value) and ``files`` (name -> last file)."""

    fields: dict[str, str] = field(default_factory=dict)
    files: dict[str, FilePart] = field(default_factory=dict)


def parse(content_type: str, body: bytes) -> Form:
    """Parse ``body`` of the given ``Content-Type`` header value (which carries the boundary).

    Raises:
        InvalidMultipart: no boundary, not multipart, a part without a ``name``, or a text
            field that is not UTF-8.
    """
    if "boundary=" not in content_type.lower():
        raise InvalidMultipart(
            "multipart/form-data without a boundary",
            [{"field": "Content-Type", "message": "needs a boundary parameter"}],
        )
    head = f"Content-Type: {content_type}\r\nMIME-Version: 1.0\r\n\r\n".encode("latin-1", "replace")
    msg = BytesParser(policy=HTTP).parsebytes(head + body)
    if not msg.is_multipart() or msg.defects:
        raise InvalidMultipart("the multipart/form-data body cannot be parsed")
    form = Form()
    for part in msg.get_payload():
        if not isinstance(part, Message):
            raise InvalidMultipart("the multipart/form-data body cannot be parsed")
        name = part.get_param("name", header="content-disposition")
        if not isinstance(name, str) or not name:
            raise InvalidMultipart("a form part has no name in its Content-Disposition")
        payload = part.get_payload(decode=True)
        data = payload if isinstance(payload, bytes) else b""
        filename = part.get_filename()
        if filename is not None:
            form.files[name] = FilePart(filename=filename, data=data)
            continue
        try:
            form.fields[name] = data.decode("utf-8")
        except UnicodeDecodeError:
            raise InvalidMultipart(
                f"form field {name} is not UTF-8", [{"field": name, "message": "not UTF-8"}]
            ) from None
    return form
