"""The SQS message of a job: what a worker needs to run it without reading the job record first.

Body (JSON)::

    {"v": 1, "job_id": "job_...", "tenant": "...", "model": "...", "priority": "normal",
     "expires_at": "<RFC 3339>", "timeout_seconds": 900,
     "input": {...} | null, "input_ref": "s3://..." | null,
     "created_at": "<RFC 3339>", "metadata": "<JSON text>" | null, "webhook": "<JSON text>" | null}

Exactly one of ``input`` (inline, when the serialized input is at most the inline limit) and
``input_ref`` is set.

``created_at``, ``metadata`` and ``webhook`` are the job record's attributes as the submit wrote
them (a message sent before they existed has ``created_at: null``). With them the message holds
the whole record as it is while the job waits in the queue, so a worker that starts the job on
its first delivery knows the record it wrote without reading it back (it marks a batch of jobs
``running`` in one TransactWriteItems call, which returns no items; see
:mod:`asyncinfer.worker.runner`). Together they add at most about 4 KB to a message (metadata at
most 2 KB, a webhook URL at most 2048 characters).
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
    created_at: str | None = None
    metadata: str | None = None
    webhook: str | None = None

    def dumps(self) -> str:
        """The message body."""
        return json.dumps(self.model_dump(mode="json"), separators=(",", ":"), ensure_ascii=False)
