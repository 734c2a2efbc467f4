"""List cursors of ``GET /v1/jobs``: opaque to clients, checked strictly when they come back.

A cursor is the DynamoDB key a tenant-index Query stopped at (``{"job_id", "tenant"}``) as compact
JSON in URL-safe base64 without padding (RFC 4648 section 5), so it matches
:data:`CURSOR_PATTERN` (the pattern the OpenAPI document declares). Any other string (bad base64,
not JSON, other keys, values that are not strings, a job id that is no job id, another tenant's
key, too long) is refused with :class:`~asyncinfer.core.errors.InvalidRequest` naming ``cursor``
(HTTP 422 ``invalid_request``, as every other bad query parameter), never a 500 and never a
Query that starts anywhere the tenant did not stop.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from typing import Any

from asyncinfer.core.errors import InvalidRequest
from asyncinfer.core.ids import JOB_ID_RE

#: Longest cursor accepted, characters (a real one is about 80).
CURSOR_MAX_CHARS = 512
#: What a cursor looks like: URL-safe base64 without padding, at most 512 characters (an empty
#: ``?cursor=`` is the first page, as no cursor).
CURSOR_PATTERN = r"^[A-Za-z0-9_-]{0,512}$"
_CURSOR_RE = re.compile(CURSOR_PATTERN)
_KEYS = frozenset({"job_id", "tenant"})


def encode_cursor(key: dict[str, Any]) -> str:
    """``LastEvaluatedKey`` of a tenant-index Query (``{"job_id": {"S": ...}, "tenant": {"S":
    ...}}``) -> cursor string."""
    raw = json.dumps({k: key[k]["S"] for k in sorted(_KEYS)}, separators=(",", ":"))
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


def decode_cursor(cursor: str, tenant: str) -> dict[str, Any]:
    """Cursor string -> ``ExclusiveStartKey`` for ``tenant``'s Query.

    Raises:
        InvalidRequest: (field ``cursor``) for anything :func:`encode_cursor` did not make for
            this tenant.
    """
    bad = InvalidRequest(
        "cursor is not valid", [{"field": "cursor", "message": "not a cursor from this API"}]
    )
    if not isinstance(cursor, str) or not _CURSOR_RE.fullmatch(cursor):
        raise bad
    try:
        padded = cursor + "=" * (-len(cursor) % 4)
        raw = base64.b64decode(padded.translate(_URLSAFE), validate=True)
        data = json.loads(raw.decode("utf-8"))
    except (ValueError, binascii.Error, RecursionError):
        raise bad from None
    if not isinstance(data, dict) or set(data) != _KEYS:
        raise bad
    job_id, owner = data["job_id"], data["tenant"]
    if not isinstance(job_id, str) or not isinstance(owner, str) or not JOB_ID_RE.fullmatch(job_id):
        raise bad
    if owner != tenant:
        raise bad
    return {"job_id": {"S": job_id}, "tenant": {"S": owner}}


_URLSAFE = str.maketrans("-_", "+/")
