"""The job lifecycle of the spec ("Job lifecycle"), as data.

::

    queued --> running --> succeeded | failed | cancelled
    queued --> cancelled | expired
    running --> queued          (worker lost or retryable error; attempts + 1)

plus ``queued --> failed``: a job whose message reached the dead-letter queue after a retryable
error had put it back to ``queued`` fails with ``max_attempts``.
"""

from __future__ import annotations

QUEUED = "queued"
RUNNING = "running"
SUCCEEDED = "succeeded"
FAILED = "failed"
CANCELLED = "cancelled"
EXPIRED = "expired"

STATUSES = (QUEUED, RUNNING, SUCCEEDED, FAILED, CANCELLED, EXPIRED)
TERMINAL = frozenset({SUCCEEDED, FAILED, CANCELLED, EXPIRED})

ALLOWED: dict[str, frozenset[str]] = {
    QUEUED: frozenset({RUNNING, CANCELLED, EXPIRED, FAILED}),
    RUNNING: frozenset({SUCCEEDED, FAILED, CANCELLED, QUEUED}),
    SUCCEEDED: frozenset(),
    FAILED: frozenset(),
    CANCELLED: frozenset(),
    EXPIRED: frozenset(),
}

#: The event type published when a job enters each status (spec, "Events").
EVENT_FOR_STATUS = {
    QUEUED: "job.queued",
    RUNNING: "job.started",
    SUCCEEDED: "job.succeeded",
    FAILED: "job.failed",
    CANCELLED: "job.cancelled",
    EXPIRED: "job.expired",
}


def is_allowed(current: str, new: str) -> bool:
    """Whether the lifecycle allows ``current -> new``."""
    return new in ALLOWED.get(current, frozenset())


def is_terminal(status: str) -> bool:
    """Whether ``status`` is terminal (a terminal job never changes again)."""
    return status in TERMINAL
