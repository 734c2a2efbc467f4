"""What a tenant may give a job as input, checked at submit so that what the API accepts a
worker can read (issue 14, behaviours 2 and 4).

* Inline ``input``: at most ``max_input_bytes`` of JSON (setting), nested at most
  :data:`~asyncinfer.aws.payloads.MAX_JSON_DEPTH` levels, finite numbers only: the limits the
  worker's parsers hold (:func:`asyncinfer.aws.payloads.loads_bounded` applies the same ones to an
  input read from S3).
* ``input_url``: the tenant's own uploads (``s3://<service bucket>/uploads/<tenant>/...``, as
  ``POST /v1/uploads`` hands out) or a location the operator lists in ``input_locations``
  (``bucket`` or ``bucket/prefix``). Anything else is refused with one message whatever the
  bucket or key, so the answer says nothing about what exists; nothing is read at submit. The
  worker reads the object with a HEAD first and refuses one larger than ``max_input_bytes``.
* Uploads (``POST /v1/uploads``): a presigned POST form whose policy carries a
  ``content-length-range`` of 1..``max_input_bytes`` and the exact key, so S3 itself refuses a
  larger body (S3 API Reference, "Browser-based uploads using POST", "Creating a POST policy");
  and, for compatibility with the spec's response, a presigned PUT URL, which S3 cannot cap
  without knowing the size beforehand (the worker's check is then what holds).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from ulid import ULID

from asyncinfer.aws.payloads import dumps, json_problem, split_uri
from asyncinfer.core.errors import InvalidRequest, PayloadTooLarge
from asyncinfer.core.settings_needs import InputsConfig
from asyncinfer.core.timeutil import iso, now

#: Lifetime of upload URLs and forms, seconds.
UPLOAD_URL_SECONDS = 3600


def check_inline_input(settings: InputsConfig, data: Any) -> bytes:
    """The stored form (compact UTF-8 JSON) of an inline ``input`` within the limits.

    Raises:
        InvalidRequest: (field ``input``) nested too deeply, or a number JSON cannot carry.
        PayloadTooLarge: (field ``input``) larger than ``max_input_bytes``.
    """
    problem = json_problem(data)
    if problem is not None:
        raise InvalidRequest(f"input is {problem}", [{"field": "input", "message": problem}])
    body = dumps(data)
    if len(body) > settings.max_input_bytes:
        raise PayloadTooLarge(
            f"input is {len(body)} bytes; at most {settings.max_input_bytes}",
            [{"field": "input", "message": f"at most {settings.max_input_bytes} bytes of JSON"}],
        )
    return body


def upload_prefix(tenant: str) -> str:
    """Key prefix of ``tenant``'s uploads in the service bucket."""
    return f"uploads/{tenant}/"


def _allowed_locations(settings: InputsConfig) -> list[tuple[str, str]]:
    """``input_locations`` as ``(bucket, key prefix)``; a prefix always ends in ``/`` so that
    ``bucket/data`` does not also allow ``data-private/``. Entries in the service bucket are
    ignored: it holds every tenant's inputs and outputs, and only ``uploads/<tenant>/`` of it is
    ever a tenant's to name."""
    out = []
    for entry in settings.input_locations:
        bucket, _, prefix = entry.strip().strip("/").partition("/")
        if bucket != settings.bucket:
            out.append((bucket, f"{prefix.strip('/')}/" if prefix.strip("/") else ""))
    return out


def check_input_url(settings: InputsConfig, tenant: str, url: str) -> None:
    """Whether ``tenant`` may have a job read ``url``; nothing is read from S3.

    Raises:
        InvalidRequest: (field ``input_url``) not an ``s3://bucket/key`` URL, or outside the
            tenant's uploads and the operator's ``input_locations``; the message is the same
            whatever the bucket or key.
    """
    try:
        bucket, key = split_uri(url)
    except ValueError:
        raise InvalidRequest(
            "input_url is not an s3:// URL",
            [{"field": "input_url", "message": "must be s3://bucket/key"}],
        ) from None
    segments = key.split("/")
    plain = "" not in segments and "." not in segments and ".." not in segments
    allowed = [(settings.bucket, upload_prefix(tenant)), *_allowed_locations(settings)]
    if plain and any(bucket == b and key.startswith(p) for b, p in allowed):
        return
    raise InvalidRequest(
        "input_url is not a location this service reads for you",
        [
            {
                "field": "input_url",
                "message": "use the input_url of POST /v1/uploads (or a location the operator "
                "allows)",
            }
        ],
    )


def new_upload(settings: InputsConfig, s3: Any, tenant: str) -> dict[str, Any]:
    """The body of ``POST /v1/uploads`` (201).

    ``{"upload_url", "input_url", "expires_at"}`` as the spec has it, plus ``max_bytes`` (the
    cap) and ``upload_form``: ``{"url", "fields"}``, a presigned POST (multipart/form-data: the
    ``fields`` first, then the file as field ``file``) that S3 refuses above ``max_bytes``.
    ``upload_url`` is a presigned PUT of the same key; a PUT larger than ``max_bytes`` is stored
    but its job fails ``invalid_input`` when the worker checks the size before reading.
    """
    bucket, key = settings.bucket, f"{upload_prefix(tenant)}{ULID()}.json"
    put_url: str = s3.generate_presigned_url(
        "put_object", Params={"Bucket": bucket, "Key": key}, ExpiresIn=UPLOAD_URL_SECONDS
    )
    form = s3.generate_presigned_post(
        Bucket=bucket,
        Key=key,
        Conditions=[["content-length-range", 1, settings.max_input_bytes]],
        ExpiresIn=UPLOAD_URL_SECONDS,
    )
    return {
        "upload_url": put_url,
        "input_url": f"s3://{bucket}/{key}",
        "expires_at": iso(now() + timedelta(seconds=UPLOAD_URL_SECONDS)),
        "max_bytes": settings.max_input_bytes,
        "upload_form": {"url": form["url"], "fields": form["fields"]},
    }
