"""The Files routes of the ``/openai/v1`` surface (spec openai.md, "Files"), a Powertools
``Router`` that :mod:`asyncinfer.openai_api.app` mounts under ``/openai/v1``.

* ``POST /files``: ``multipart/form-data`` (``file``, ``purpose=batch``) of at most
  :data:`MAX_MULTIPART_BYTES`, or JSON ``{"purpose": "batch", "input_url", "filename"?}`` (the
  extension) naming the tenant's upload of ``POST /v1/uploads``, copied inside the bucket.
* ``GET /files`` (``limit``, ``after``, ``order``, ``purpose``), ``GET /files/{id}``,
  ``GET /files/{id}/content`` (the bytes, or a 302 to a presigned GET for a large file),
  ``DELETE /files/{id}``.

A file of another tenant, or an id that is no file id, is 404.
"""

from __future__ import annotations

import base64
import json
import re
from typing import Annotated, Any, Literal

from aws_lambda_powertools.event_handler import Response
from aws_lambda_powertools.event_handler.api_gateway import Router
from aws_lambda_powertools.event_handler.openapi.params import Query
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from asyncinfer.aws import clients
from asyncinfer.aws.payloads import split_uri
from asyncinfer.core.errors import (
    InvalidJson,
    InvalidRequest,
    NotFound,
    PayloadTooLarge,
    Unauthorized,
    UnsupportedMediaType,
)
from asyncinfer.core.settings import get_settings
from asyncinfer.jobs.inputs import check_input_url, upload_prefix
from asyncinfer.openai_api import limits, multipart
from asyncinfer.openai_api.files import FileObject, FileStore
from asyncinfer.openai_api.limits import (
    CONTENT_URL_SECONDS,
    INLINE_RESPONSE_BYTES,
    MAX_JSON_BYTES,
)

#: Largest multipart body, bytes (:data:`asyncinfer.openai_api.limits.MAX_MULTIPART_BYTES`).
MAX_MULTIPART_BYTES = limits.MAX_MULTIPART_BYTES
#: Largest file served inline (:data:`asyncinfer.openai_api.limits.INLINE_CONTENT_BYTES`).
INLINE_CONTENT_BYTES = limits.INLINE_CONTENT_BYTES
#: Most files in one page of ``GET /files``, whatever ``limit`` asks (OpenAI takes up to 10,000;
#: each entry costs an S3 HEAD here). ``has_more`` tells the SDK's pager to go on.
PAGE_MAX = 1000
#: ``file-`` + a ULID (:func:`asyncinfer.openai_api.files.new_file_id`).
FILE_ID_PATTERN = r"^file-[0-9A-HJKMNP-TV-Z]{26}$"
_FILE_ID = re.compile(FILE_ID_PATTERN)
#: The purposes a tenant may upload (batch input; OpenAI's others are not served here).
UPLOAD_PURPOSES = ("batch",)

router = Router()


class FileFromUpload(BaseModel):
    """JSON body of ``POST /files`` (the extension of spec openai.md)."""

    model_config = ConfigDict(extra="forbid")

    purpose: Literal["batch"]
    input_url: str = Field(min_length=1, max_length=2048)
    filename: str | None = Field(default=None, min_length=1, max_length=255)


def tenant() -> str:
    """The caller's tenant: the API key id (``requestContext.identity.apiKeyId``, or the
    ``apiKeyId`` the Lambda authorizer put in ``requestContext.authorizer``)."""
    ctx = router.current_event.raw_event.get("requestContext") or {}
    key_id = ((ctx.get("identity") or {}).get("apiKeyId") or "").strip()
    if not key_id:
        key_id = str((ctx.get("authorizer") or {}).get("apiKeyId") or "").strip()
    if not key_id:
        raise Unauthorized("no API key identity in the request")
    return key_id


def store() -> FileStore:
    """The file store of this process's settings."""
    settings = get_settings().openai
    return FileStore(clients.client("s3", settings), settings.bucket)


def _body() -> bytes:
    event = router.current_event.raw_event
    raw = event.get("body") or ""
    if event.get("isBase64Encoded"):
        try:
            return base64.b64decode(raw, validate=True)
        except ValueError:
            raise InvalidJson("the request body is not valid base64") from None
    return raw.encode("utf-8", "surrogateescape") if isinstance(raw, str) else bytes(raw)


def _content_type() -> str:
    headers = router.current_event.headers or {}
    return next((v for k, v in headers.items() if k.lower() == "content-type"), "") or ""


def _known(file_id: str) -> str:
    if not _FILE_ID.match(file_id):
        raise NotFound(f"No such file: {file_id}")
    return file_id


@router.post("/files")
def create_file() -> Response[Any]:
    """Upload a file: multipart ``file`` + ``purpose``, or JSON ``input_url``; 200 with the File
    object (as OpenAI answers)."""
    ctype = _content_type()
    media = ctype.split(";", 1)[0].strip().lower()
    body = _body()
    if media == "multipart/form-data":
        created = _from_form(ctype, body)
    elif media in ("application/json", ""):
        created = _from_upload(body)
    else:
        raise UnsupportedMediaType(
            f"POST /files takes multipart/form-data or application/json, not {media}",
            [{"field": "Content-Type", "message": "multipart/form-data or application/json"}],
        )
    return Response(200, "application/json", json.dumps(created))


def _from_form(ctype: str, body: bytes) -> FileObject:
    if len(body) > MAX_MULTIPART_BYTES:
        raise PayloadTooLarge(
            f"request body is {len(body)} bytes; at most {MAX_MULTIPART_BYTES} in a multipart "
            "upload: upload larger files with POST /v1/uploads and create the file with "
            "input_url",
            [{"field": "file", "message": f"at most {MAX_MULTIPART_BYTES} bytes"}],
        )
    form = multipart.parse(ctype, body)
    purpose = _purpose(form.fields.get("purpose"))
    part = form.files.get("file")
    if part is None:
        raise InvalidRequest("file is required", [{"field": "file", "message": "required"}])
    if not part.data:
        raise InvalidRequest("file is empty", [{"field": "file", "message": "empty file"}])
    name = part.filename.replace("\\", "/").rsplit("/", 1)[-1][:255] or "upload.jsonl"
    return store().create(tenant(), part.data, filename=name, purpose=purpose)


def _purpose(value: str | None) -> str:
    if value is None:
        raise InvalidRequest("purpose is required", [{"field": "purpose", "message": "required"}])
    if value not in UPLOAD_PURPOSES:
        raise InvalidRequest(
            f"purpose {value!r} is not served here; use 'batch'",
            [{"field": "purpose", "message": "must be 'batch'"}],
        )
    return value


def _from_upload(body: bytes) -> FileObject:
    if len(body) > MAX_JSON_BYTES:
        raise PayloadTooLarge(f"a JSON body of POST /files is at most {MAX_JSON_BYTES} bytes")
    try:
        data: Any = json.loads(body.decode("utf-8"))
    except (ValueError, RecursionError):  # RecursionError: nested deeper than the decoder
        raise InvalidJson("the request body is not valid JSON") from None
    try:
        req = FileFromUpload.model_validate(data)
    except ValidationError as err:
        details = [
            {
                "field": ".".join(str(p) for p in e["loc"]) or "body",
                "message": e["msg"],
                "type": e["type"],
            }
            for e in err.errors()
        ]
        fields = ", ".join(d["field"] for d in details)
        raise InvalidRequest(f"invalid request: {fields}", details) from None
    settings = get_settings().openai
    who = tenant()
    check_input_url(settings, who, req.input_url)
    bucket, key = split_uri(req.input_url)
    if bucket != settings.bucket or not key.startswith(upload_prefix(who)):
        raise InvalidRequest(
            "input_url is not an upload of POST /v1/uploads",
            [{"field": "input_url", "message": "use the input_url of POST /v1/uploads"}],
        )
    return store().create_from_object(
        who,
        key,
        filename=req.filename or key.rsplit("/", 1)[-1],
        purpose=req.purpose,
        max_bytes=settings.max_input_bytes,
    )


@router.get("/files")
def list_files(
    limit: Annotated[int, Query(ge=1, le=10000)] = 10000,
    after: Annotated[str | None, Query(min_length=1, max_length=64)] = None,
    order: Annotated[Literal["asc", "desc"], Query()] = "desc",
    purpose: Annotated[str | None, Query(min_length=1, max_length=64)] = None,
) -> dict[str, Any]:
    """The caller's files, newest first by default: OpenAI's list ``{"object": "list", "data",
    "first_id", "last_id", "has_more"}``; at most :data:`PAGE_MAX` per page."""
    files, more = store().list(
        tenant(), limit=min(limit, PAGE_MAX), after=after, order=order, purpose=purpose
    )
    return {
        "object": "list",
        "data": [dict(f) for f in files],
        "first_id": files[0]["id"] if files else None,
        "last_id": files[-1]["id"] if files else None,
        "has_more": more,
    }


@router.get("/files/<file_id>")
def retrieve_file(file_id: str) -> dict[str, Any]:
    """The File object; 404 where the caller has no such file."""
    return dict(store().get(tenant(), _known(file_id)))


@router.delete("/files/<file_id>")
def delete_file(file_id: str) -> dict[str, Any]:
    """Delete the file: ``{"id", "object": "file", "deleted": true}``; 404 where the caller has
    no such file."""
    return dict(store().delete(tenant(), _known(file_id)))


@router.get("/files/<file_id>/content")
# No return annotation: Powertools then passes a non-JSON response through unserialized (with one,
# it would serialize the bytes as JSON text).
def file_content(file_id: str):
    """The file's bytes (``application/octet-stream``): in the response up to
    :data:`INLINE_CONTENT_BYTES`, else a 302 to a presigned GET valid
    :data:`CONTENT_URL_SECONDS`."""
    who, files = tenant(), store()
    info = files.get(who, _known(file_id))
    headers = {"Content-Disposition": f'attachment; filename="{info["id"]}"'}
    if info["bytes"] <= INLINE_CONTENT_BYTES:
        data = files.read(who, file_id)
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            text = None
        if text is not None and len(json.dumps(text)) <= INLINE_RESPONSE_BYTES:
            return Response(200, "application/octet-stream", text, headers)
        if text is None:  # base64 in the response (API Gateway's binary media types)
            return Response(200, "application/octet-stream", data, headers)
    url = files.presigned_url(who, file_id, expires=CONTENT_URL_SECONDS, filename=info["filename"])
    return Response(302, None, "", {"Location": url, "Cache-Control": "no-store"})
