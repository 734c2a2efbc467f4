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

The body is built (:meth:`JobMessage.dumps`) before the job record is written, so that a body SQS
would refuse never leaves a record behind: it is at most :data:`MAX_MESSAGE_BYTES` (the submit
moves a larger inline input to S3) and holds only characters SQS accepts (the rest are written
as JSON ``\\uXXXX`` escapes, which parse back to the same string).

**Fair queues.** Every job message is sent with the job's tenant as its ``MessageGroupId``
(:func:`message_group_id`), on the standard (not FIFO) job queues: SQS "fair queues" (AWS,
2025; SQS Developer Guide, "Amazon SQS fair queues") then keep one tenant's burst from holding
back other tenants' messages: when one group has a backlog, SQS delivers the other groups'
messages first, with no change to the consumers and none of FIFO's ordering or throughput
limits.
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any

from pydantic import BaseModel, ConfigDict

#: Largest message body SQS takes, bytes (SQS Developer Guide, "Amazon SQS message quotas":
#: 256 KiB, the limit every region and the emulator share).
MAX_MESSAGE_BYTES = 256 * 1024

#: Characters SQS refuses in a body (SQS API Reference, "SendMessage": only #x9, #xA, #xD,
#: #x20-#xD7FF, #xE000-#xFFFD and #x10000-#x10FFFF are allowed). ``json.dumps`` already escapes
#: the controls below #x20; these are the others it writes as they are.
_SQS_REFUSED = re.compile("[\ud800-\udfff\ufffe\uffff]")


#: What SQS takes as a ``MessageGroupId``: 1..128 characters, letters, digits and ASCII
#: punctuation (SQS API Reference, "SendMessage").
_GROUP_ID = re.compile(r"[A-Za-z0-9!-/:-@\[-`{-~]{1,128}")


def message_group_id(tenant: str) -> str:
    """The ``MessageGroupId`` of a tenant's job messages (fair queues; see the module
    docstring): the tenant (an API key id) as it is, or ``t-<sha256 hex, 40 chars>`` for a
    tenant SQS would refuse as a group id (too long, or characters outside ASCII
    punctuation and alphanumerics)."""
    if _GROUP_ID.fullmatch(tenant):
        return tenant
    return "t-" + hashlib.sha256(tenant.encode("utf-8", "surrogatepass")).hexdigest()[:40]


def _escape(match: re.Match[str]) -> str:
    return f"\\u{ord(match.group()):04x}"


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
        """The message body: compact JSON with only the characters SQS accepts.

        Raises:
            ValueError: a value JSON cannot carry (the submit checks inputs first).
        """
        text = json.dumps(self.model_dump(mode="json"), separators=(",", ":"), ensure_ascii=False)
        return _SQS_REFUSED.sub(_escape, text)

    @property
    def group_id(self) -> str:
        """This job's ``MessageGroupId`` (:func:`message_group_id` of its tenant)."""
        return message_group_id(self.tenant)

    @staticmethod
    def size(body: str) -> int:
        """Bytes of ``body`` as SQS counts them (UTF-8)."""
        return len(body.encode("utf-8", "surrogatepass"))
