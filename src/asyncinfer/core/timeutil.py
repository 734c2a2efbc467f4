"""Time helpers: RFC 3339 UTC strings with milliseconds, as the spec writes them."""

from __future__ import annotations

from datetime import UTC, datetime


def now() -> datetime:
    """The current time, timezone-aware UTC."""
    return datetime.now(UTC)


def iso(dt: datetime) -> str:
    """``2026-11-30T06:21:03.123Z``."""
    return dt.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.") + f"{dt.microsecond // 1000:03d}Z"


def parse(value: str) -> datetime:
    """Parse an RFC 3339 string written by :func:`iso`."""
    return datetime.fromisoformat(value.replace("Z", "+00:00"))
