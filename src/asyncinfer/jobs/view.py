"""The job object of the spec ("GET /v1/jobs/{id}") rendered from a job record."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from asyncinfer.core.timeutil import parse
from asyncinfer.jobs.record import JobRecord

if TYPE_CHECKING:
    from asyncinfer.aws.payloads import PayloadStore


def _seconds_between(a: str | None, b: str | None) -> float | None:
    if not a or not b:
        return None
    return round((parse(b) - parse(a)).total_seconds(), 3)


def _number(value: Any) -> float | None:
    """A recorded metric as a float (DynamoDB gives numbers back as int or Decimal)."""
    return None if value is None else float(value)


def _metadata(value: Any) -> dict[str, str]:
    """``metadata`` is stored as JSON text (any key is safe there)."""
    if not value:
        return {}
    if isinstance(value, str):
        return dict(json.loads(value))
    return dict(value)


def render_job(record: JobRecord, payloads: PayloadStore | None = None) -> dict[str, Any]:
    """The spec's job object for ``record``.

    ``output`` is inline when stored inline; otherwise ``output`` is null and ``output_url`` is a
    fresh presigned S3 GET URL (made on each call, valid 1 h) when ``payloads`` is given.
    """
    job_id = record["job_id"]
    output = json.loads(record["output"]) if record.get("output") else None
    output_url = None
    if record.get("output_ref") and payloads is not None:
        output_url = payloads.presign_get(record["output_ref"])
    progress = None
    if record.get("progress_tokens") is not None:
        progress = {"completion_tokens": record["progress_tokens"]}
    metrics = {
        "queue_seconds": _seconds_between(record.get("created_at"), record.get("started_at")),
        "run_seconds": _seconds_between(record.get("started_at"), record.get("completed_at")),
        # Recorded by the worker on terminal jobs (shared/spec/models.md, "What a job shows").
        "compute_seconds": _number(record.get("compute_seconds")),
        "cost_usd": _number(record.get("cost_usd")),
    }
    webhook = None
    if record.get("webhook"):
        hook = json.loads(record["webhook"])
        webhook = {
            "url": hook.get("url"),
            "events": hook.get("events"),
            "status": record.get("webhook_status", "pending"),
            "attempts": record.get("webhook_attempts", 0),
            "last_http_status": record.get("webhook_last_http_status"),
        }
    return {
        "id": job_id,
        "status": record["status"],
        "model": record["model"],
        "priority": record.get("priority", "normal"),
        "attempts": record.get("attempts", 0),
        "created_at": record.get("created_at"),
        "started_at": record.get("started_at"),
        "completed_at": record.get("completed_at"),
        "expires_at": record.get("expires_at"),
        "output": output,
        "output_url": output_url,
        "error": record.get("error"),
        "progress": progress,
        "metrics": metrics,
        "webhook": webhook,
        "metadata": _metadata(record.get("metadata")),
        "urls": {"get": f"/v1/jobs/{job_id}", "cancel": f"/v1/jobs/{job_id}/cancel"},
    }
