"""Job ids: ``job_`` + a ULID (48-bit millisecond time, 80 random bits), so ids sort by creation
time (spec, "Conventions")."""

from __future__ import annotations

import re

from ulid import ULID

JOB_ID_RE = re.compile(r"^job_[0-9A-HJKMNP-TV-Z]{26}$")


def new_job_id() -> str:
    """A new job id, e.g. ``job_01JDQ8Y5Z6C8R9T2W3X4Y5Z6A7``."""
    return f"job_{ULID()}"


def is_job_id(value: str) -> bool:
    """Whether ``value`` has the shape of a job id."""
    return bool(JOB_ID_RE.match(value))
