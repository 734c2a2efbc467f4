"""The job record: its attributes, its table's keys and indexes, and the conversion to and
from DynamoDB items.

Table design (the CDK app and the local stack create it the same way):

* partition key ``job_id`` (S), no sort key: one item per job;
* GSI ``tenant-index``: partition key ``tenant`` (S), sort key ``job_id`` (S), projection ALL.
  Job ids are ULIDs, so a Query with ``ScanIndexForward=False`` lists a tenant's jobs newest first;
* sparse GSI ``queued-expiry-index``: partition key ``queued_mark`` (S, present only while the
  job is ``queued`` for its first attempt), sort key ``expires_epoch`` (N), projection
  KEYS_ONLY: the expiry sweeper finds queued jobs past their TTL without a scan. The submit sets
  the mark and every transition removes it: a job handed back after it started is not expirable
  (``expired`` is only for jobs that never started);
* sparse GSI ``running-lease-index``: partition key ``running_mark`` (S, present only while the
  job is ``running``), sort key ``lease_expires_epoch`` (N, epoch seconds), projection
  KEYS_ONLY: the sweeper finds running jobs whose lease lapsed (their worker is gone) without a
  scan. Every ``-> running`` transition sets both (the lease from ``Settings.lease_interval``
  unless the transition sets its own), :meth:`JobStore.renew_leases` moves the lease on, and
  every transition out of ``running`` removes both. A job handed back to the queue after it
  started (:func:`asyncinfer.jobs.transitions.requeue`) stays in this index under the mark
  ``requeued``, with a *requeue deadline* as ``lease_expires_epoch`` (now + the requeue grace,
  longer than its message's way back through SQS): the sweeper sends the message of a job still
  queued at that attempt past it again (its message may be lost), or fails it;
* sparse GSI ``outbox-index``: partition key ``outbox_mark`` (S, present while the record has
  pending events), sort key ``outbox_since`` (N, epoch seconds of the oldest), projection
  KEYS_ONLY: the sweeper republishes events whose publish failed (:mod:`asyncinfer.jobs.outbox`);
* TTL attribute ``ttl`` (N, epoch seconds): the record is deleted some time after
  ``created + record_retention_seconds`` (DynamoDB TTL; it never runs on the emulator).

Item attributes: ``job_id``, ``tenant``, ``model``, ``status``, ``attempts`` (N: attempts started),
``priority``, ``created_at`` / ``started_at`` / ``completed_at`` / ``expires_at`` (RFC 3339),
``timeout_seconds`` (N), ``input_ref`` (S3 URI, only for inputs stored in S3), ``output`` (S, JSON
text, when at most 64 KB), ``output_ref`` (S3 URI otherwise), ``error`` (M: code, message),
``progress_tokens`` (N), ``cancel_requested`` (BOOL), ``webhook`` (S, JSON), ``metadata`` (M of S),
``lease_expires_epoch`` (N, while running), ``inference_id`` (S: the SageMaker request of the
running attempt, set once the bridge invoked the endpoint), ``message_id`` (S: the SQS message
the running attempt started from), ``outbox`` (SS: pending events) with ``outbox_mark`` and
``outbox_since`` (the sparse GSI ``outbox-index``), ``ttl`` (N).
"""

from __future__ import annotations

from decimal import Decimal
from enum import StrEnum
from typing import Any, TypedDict

from boto3.dynamodb.types import TypeDeserializer, TypeSerializer

from asyncinfer.core import lifecycle

TENANT_INDEX = "tenant-index"
#: Sparse GSI of the jobs waiting in a queue, by the time their TTL ends (the expiry sweeper's).
QUEUED_INDEX = "queued-expiry-index"
#: Partition key value of that index: set while a job is ``queued``, removed when it leaves.
QUEUED_MARK = "queued"
#: Sparse GSI of the running jobs, by the time their lease lapses (the sweeper's takeover).
RUNNING_INDEX = "running-lease-index"
#: Partition key value of that index: set while a job is ``running``, removed when it leaves.
RUNNING_MARK = "running"
#: Partition key value of that index for a job handed back after it started (``queued``, attempts
#: > 0): its ``lease_expires_epoch`` is then the requeue deadline (the sweeper's safety net).
REQUEUED_MARK = "requeued"
#: The running job's lease attribute (epoch seconds): past it, the job has no live worker.
LEASE_FIELD = "lease_expires_epoch"


class Status(StrEnum):
    """A job's ``status`` (spec, "Job lifecycle"; :mod:`asyncinfer.core.lifecycle` holds the allowed
    moves). A ``str``: ``Status.QUEUED == "queued"``."""

    QUEUED = lifecycle.QUEUED
    RUNNING = lifecycle.RUNNING
    SUCCEEDED = lifecycle.SUCCEEDED
    FAILED = lifecycle.FAILED
    CANCELLED = lifecycle.CANCELLED
    EXPIRED = lifecycle.EXPIRED

    @property
    def terminal(self) -> bool:
        """Whether a job in this status never changes again."""
        return lifecycle.is_terminal(self.value)


_ser = TypeSerializer()
_deser = TypeDeserializer()


def to_item(record: dict[str, Any]) -> dict[str, Any]:
    """Python dict -> DynamoDB typed item (``None`` values dropped, floats as Decimal)."""
    return {k: _ser.serialize(_to_ddb(v)) for k, v in record.items() if v is not None}


def from_item(item: dict[str, Any]) -> dict[str, Any]:
    """DynamoDB typed item -> Python dict (Decimal -> int or float). The outbox index's
    bookkeeping (``outbox_mark``, ``outbox_since``) is left out: it is no part of the job."""
    return {k: _from_ddb(_deser.deserialize(v)) for k, v in item.items() if k not in _INDEX_ONLY}


def _to_ddb(v: Any) -> Any:
    if isinstance(v, float):
        return Decimal(repr(v))
    if isinstance(v, dict):
        return {k: _to_ddb(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_to_ddb(x) for x in v]
    return v


def _from_ddb(v: Any) -> Any:
    if isinstance(v, Decimal):
        return int(v) if v == v.to_integral_value() else float(v)
    if isinstance(v, dict):
        return {k: _from_ddb(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_from_ddb(x) for x in v]
    if isinstance(v, set):
        return sorted(_from_ddb(x) for x in v)
    return v


# --------------------------------------------------------------------------- the events outbox
#: Pending events of the job (SS of event keys, :func:`event_key`): every transition adds its
#: event's key in the same conditional write, and the publisher removes it once SNS took the
#: event (:mod:`asyncinfer.jobs.outbox`). Absent when nothing is pending.
OUTBOX_FIELD = "outbox"
#: Sparse GSI of the records with pending events, by the time the oldest one was written (the
#: sweeper republishes those older than ``Settings.outbox_grace_seconds``).
OUTBOX_INDEX = "outbox-index"
#: Partition key of that index: set with the first pending event, removed with the last.
OUTBOX_MARK_FIELD = "outbox_mark"
#: Its only value.
OUTBOX_MARK = "pending"
#: Sort key of that index: epoch seconds of the oldest pending event.
OUTBOX_SINCE_FIELD = "outbox_since"


def event_key(status: str, attempts: int | None = None) -> str:
    """The outbox key of the event a transition to ``status`` publishes:
    ``"<event type>#<attempts after the write>"`` (``job.started#2``; ``#n`` when a start does
    not know the count). A job enters a status at most once per attempt (every write is
    conditional on the attempt), so the key names one event."""
    return f"{lifecycle.EVENT_FOR_STATUS[status]}#{'n' if attempts is None else attempts}"


def event_type_of(key: str) -> str:
    """The event type (``job.queued``, ...) of an outbox key."""
    return key.split("#", 1)[0]


def status_of_event(event_type: str) -> str:
    """The status whose event ``event_type`` is (``job.started`` -> ``running``)."""
    return next(s for s, e in lifecycle.EVENT_FOR_STATUS.items() if e == event_type)


class JobRecord(TypedDict, total=False):
    """A job record as :func:`from_item` returns it (the attributes of the module docstring;
    times RFC 3339 text, epochs in seconds, ``outbox`` a sorted list of event keys)."""

    job_id: str
    tenant: str
    model: str
    status: str
    attempts: int
    priority: str
    created_at: str
    started_at: str
    completed_at: str
    expires_at: str
    timeout_seconds: int
    input_ref: str
    output: str
    output_ref: str
    error: dict[str, str]
    progress_tokens: int
    cancel_requested: bool
    webhook: str
    metadata: str
    lease_expires_epoch: int
    inference_id: str
    message_id: str
    outbox: list[str]
    ttl: int


#: Attributes only the outbox index reads (written by transitions, never returned as record).
_INDEX_ONLY = frozenset({OUTBOX_MARK_FIELD, OUTBOX_SINCE_FIELD})
