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

Item attributes: :class:`JobRecord` lists every attribute a writer writes on a job's item, with
its unit and its writer (``metadata`` and ``webhook`` are S, JSON text; ``error`` is M of S;
``outbox`` and ``webhook_delivered`` are SS).
"""

from __future__ import annotations

from collections.abc import Mapping
from decimal import Decimal
from enum import StrEnum
from typing import Any, Final, TypedDict, cast

from boto3.dynamodb.types import TypeDeserializer, TypeSerializer

from asyncinfer.core import lifecycle
from asyncinfer.core.errors import TransitionRefused

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
LEASE_FIELD: Final = "lease_expires_epoch"


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


def to_item(record: Mapping[str, Any]) -> dict[str, Any]:
    """Python dict (a :class:`JobRecord`, or another item of the table) -> DynamoDB typed item
    (``None`` values dropped, floats as Decimal)."""
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
OUTBOX_FIELD: Final = "outbox"
#: Sparse GSI of the records with pending events, by the time the oldest one was written (the
#: sweeper republishes those older than ``Settings.outbox_grace_seconds``).
OUTBOX_INDEX = "outbox-index"
#: Partition key of that index: set with the first pending event, removed with the last.
OUTBOX_MARK_FIELD: Final = "outbox_mark"
#: Its only value.
OUTBOX_MARK = "pending"
#: Sort key of that index: epoch seconds of the oldest pending event.
OUTBOX_SINCE_FIELD: Final = "outbox_since"


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
    """A job record: every attribute a writer of the job table writes on a job's item, as
    :func:`record_from_item` returns it (DynamoDB numbers as ``int``, or ``float`` when not
    integral; string sets as sorted lists). Times are RFC 3339 text (UTC), epochs whole seconds
    since 1970, durations seconds. Not every attribute is present on every record
    (``total=False``): the comments say who writes each one and when.
    """

    # --------------------------------------------------------------- written by the submit
    #: ``job_`` + ULID (the partition key).
    job_id: str
    #: The API key id of the job's owner (``tenant-index`` partition key).
    tenant: str
    #: The model id (spec models.md).
    model: str
    #: A :class:`Status` value (``queued``, ``running``, ...); changed only by transitions.
    status: str
    #: Attempts started (0 while queued for its first attempt; each start adds 1).
    attempts: int
    #: ``high``, ``normal`` or ``low`` (the queue of its class).
    priority: str
    created_at: str
    #: ``created_at`` + ``ttl_seconds``: a job still queued for its first attempt then expires.
    expires_at: str
    #: Longest one attempt may run, seconds.
    timeout_seconds: int
    #: ``expires_at`` in epoch seconds (``queued-expiry-index`` sort key); while the submit is
    #: unfinished, ``submitting_until`` instead.
    expires_epoch: int
    #: Epoch seconds until which the submit may still send the job's message (removed once it
    #: did: :meth:`~asyncinfer.jobs.store.JobStore.confirm_submitted`).
    submitting_until: int
    #: :data:`QUEUED_MARK` while queued for the first attempt (``queued-expiry-index``).
    queued_mark: str
    #: The client's metadata: JSON text of an object of strings (at most 2 KB).
    metadata: str
    #: The client's webhook: JSON text ``{"url", "events"}``.
    webhook: str
    #: S3 URI of the input, when it is not in the message (``inputs/...``, or the client's
    #: ``input_url``; the SageMaker bridge sets it for every job it invokes).
    input_ref: str
    #: Epoch seconds after which DynamoDB TTL deletes the record
    #: (``created`` + ``record_retention_seconds``).
    ttl: int

    # ------------------------------------------------------------- written by transitions
    #: When the running attempt started (a start sets it; a hand-back removes it).
    started_at: str
    #: When the job became terminal.
    completed_at: str
    #: :data:`RUNNING_MARK` while running (``running-lease-index`` partition key).
    running_mark: str
    #: The running attempt's lease, epoch seconds (``running-lease-index`` sort key): past it,
    #: the job has no live worker (:mod:`asyncinfer.jobs.leases`).
    lease_expires_epoch: int
    #: The SQS MessageId the running attempt started from (the DLQ handler's tie).
    message_id: str
    #: The SageMaker ``InferenceId`` of the running attempt, once the bridge invoked the endpoint.
    inference_id: str
    #: The output's JSON text when it is at most 64 KB (a cancelled job's partial output too).
    output: str
    #: S3 URI of the output when larger.
    output_ref: str
    #: The job error ``{"code", "message"}`` (:mod:`asyncinfer.core.errors`) of a job that failed,
    #: was cancelled or expired.
    error: dict[str, str]
    #: Completion tokens so far (the worker's progress writes) or in the result, tokens.
    progress_tokens: int
    #: The job's share of its worker's compute time, seconds (a worker's terminal write).
    compute_seconds: float
    #: ``compute_seconds`` at the model's ``price_per_hour``, US dollars.
    cost_usd: float
    #: The client asked to cancel the running job (the API's write; the worker stops it).
    cancel_requested: bool
    #: Pending events' outbox keys (:func:`event_key`): a string set as written, a sorted list
    #: as read (:mod:`asyncinfer.jobs.outbox`).
    outbox: list[str] | set[str]
    #: :data:`OUTBOX_MARK` while events are pending (``outbox-index``); written only, never read
    #: back (:func:`record_from_item` leaves it out).
    outbox_mark: str
    #: Epoch seconds of the oldest pending event (``outbox-index`` sort key); written only.
    outbox_since: int

    # ------------------------------------------------------ written by the webhook dispatcher
    #: ``pending``, ``delivered`` or ``failed``.
    webhook_status: str
    #: Delivery attempts made.
    webhook_attempts: int
    #: The receiver's last HTTP status (absent when the last attempt got no answer).
    webhook_last_http_status: int
    #: The receiver's last answer, at most 1 KB.
    webhook_last_response: str
    #: Why the last attempt failed, at most 1 KB (absent when it got an answer).
    webhook_last_error: str
    #: When the last attempt was made.
    webhook_last_attempt_at: str
    #: ``webhook-id`` of each event delivered (a string set; a sorted list as read).
    webhook_delivered: list[str]
    #: The receiver answered 410 Gone: no more deliveries.
    webhook_gone: bool


def record_from_item(item: dict[str, Any]) -> JobRecord:
    """A job's DynamoDB item -> :class:`JobRecord` (:func:`from_item`): the one conversion of the
    job layer's reads (``GetItem``, ``Query``, ``BatchGetItem``, ``ALL_NEW`` / ``ALL_OLD``
    returns), whose items are written by the job layer alone."""
    # from_item is the table's generic conversion (the OpenAI batch items use it too); a job's
    # item holds the attributes of JobRecord, numbers already int/float.
    return cast(JobRecord, from_item(item))


def refused_record(exc: TransitionRefused) -> JobRecord | None:
    """The job record a refused transition found (``exc.current``; ``None``: no such job). The
    error taxonomy's floor knows no :class:`JobRecord`, so the exception holds it as a dict; the
    job layer builds every refusal of a job's write from :func:`record_from_item`."""
    return cast("JobRecord | None", exc.current)


#: Attributes only the outbox index reads (written by transitions, never returned as record).
_INDEX_ONLY = frozenset({OUTBOX_MARK_FIELD, OUTBOX_SINCE_FIELD})
