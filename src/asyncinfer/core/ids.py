"""Job ids: ``job_`` + a ULID (48-bit millisecond time, 80 random bits), so ids sort by creation
time (spec, "Conventions")."""

from __future__ import annotations

import hashlib
import re

from ulid import ULID

JOB_ID_RE = re.compile(r"^job_[0-9A-HJKMNP-TV-Z]{26}$")


def new_job_id() -> str:
    """A new job id, e.g. ``job_01JDQ8Y5Z6C8R9T2W3X4Y5Z6A7``."""
    return f"job_{ULID()}"


def is_job_id(value: str) -> bool:
    """Whether ``value`` has the shape of a job id."""
    return bool(JOB_ID_RE.match(value))


def derived_job_id(seed: str, at_epoch_ms: int) -> str:
    """A job id that is a function of ``seed`` (any text naming the job, e.g. a batch id and a
    line's ``custom_id``) and ``at_epoch_ms`` (its ULID time, milliseconds since the epoch):
    ``job_`` + the ULID of that 48-bit time and the first 80 bits of SHA-256 of ``seed``, so
    :func:`is_job_id` accepts it, it sorts by that time like any job id, and the same seed and
    time always give the same id (the batch expander's re-runs find the jobs they made).

    Raises:
        ValueError: ``at_epoch_ms`` outside 0 .. 2**48 - 1.
    """
    if not 0 <= at_epoch_ms < 1 << 48:
        raise ValueError(f"ULID time out of range: {at_epoch_ms}")
    digest = hashlib.sha256(seed.encode("utf-8", "surrogatepass")).digest()
    return f"job_{ULID.from_bytes(at_epoch_ms.to_bytes(6, 'big') + digest[:10])}"
