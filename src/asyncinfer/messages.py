"""The SQS message of a job: what a worker needs to run it without reading the job record first.

Body (JSON)::

    {"v": 1, "job_id": "job_...", "tenant": "...", "model": "...", "priority": "normal",
     "expires_at": "<RFC 3339>", "timeout_seconds": 900,
     "input": {...} | null, "input_ref": "s3://..." | null}

Exactly one of ``input`` (inline, when the serialized input is at most the inline limit) and
``input_ref`` is set.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel, ConfigDict


class JobMessage(BaseModel):
    """One job's SQS message body."""

    model_config = ConfigDict(extra="ignore")

    v: int = 1
    job_id: str
    tenant: str
    model: str
    priority: str = "normal"
    expires_at: str
    timeout_seconds: int
    input: dict[str, Any] | None = None
    input_ref: str | None = None

    def dumps(self) -> str:
        """The message body."""
        return json.dumps(self.model_dump(mode="json"), separators=(",", ":"), ensure_ascii=False)
