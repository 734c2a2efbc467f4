"""Helpers shared by the unit tests of the store and the worker."""

from __future__ import annotations

from collections import Counter
from typing import Any

from asyncinfer.jobs.store import JobStore


def new_job(
    store: JobStore,
    job_id: str = "job_01ARZ3NDEKTSV4RRFFQ69G5FAV",
    *,
    expires_at: str = "2026-12-01T00:00:00.000Z",
) -> str:
    """Create a ``queued`` echo job record at attempt 0; returns its id."""
    store.create(
        {
            "job_id": job_id,
            "tenant": "t",
            "model": "echo",
            "status": "queued",
            "attempts": 0,
            "created_at": "2026-11-30T00:00:00.000Z",
            "expires_at": expires_at,
            "timeout_seconds": 900,
        }
    )
    return job_id


def count_calls(client: Any) -> Counter[str]:
    """Counts the requests ``client`` (a boto3 client) makes from now on, by operation."""
    calls: Counter[str] = Counter()

    def hook(model: Any, **_: Any) -> None:
        calls[model.name] += 1

    client.meta.events.register("after-call", hook)
    return calls
