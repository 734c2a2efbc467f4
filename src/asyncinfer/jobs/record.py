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
  every transition out of ``running`` removes both;
* TTL attribute ``ttl`` (N, epoch seconds): the record is deleted some time after
  ``created + record_retention_seconds`` (DynamoDB TTL; it never runs on the emulator).

Item attributes: ``job_id``, ``tenant``, ``model``, ``status``, ``attempts`` (N: attempts started),
``priority``, ``created_at`` / ``started_at`` / ``completed_at`` / ``expires_at`` (RFC 3339),
``timeout_seconds`` (N), ``input_ref`` (S3 URI, only for inputs stored in S3), ``output`` (S, JSON
text, when at most 64 KB), ``output_ref`` (S3 URI otherwise), ``error`` (M: code, message),
``progress_tokens`` (N), ``cancel_requested`` (BOOL), ``webhook`` (S, JSON), ``metadata`` (M of S),
``lease_expires_epoch`` (N, while running), ``inference_id`` (S: the SageMaker request of the
running attempt, set once the bridge invoked the endpoint), ``ttl`` (N).
"""

from __future__ import annotations

from decimal import Decimal
from enum import StrEnum
from typing import Any

from boto3.dynamodb.types import TypeDeserializer, TypeSerializer

from asyncinfer import lifecycle

TENANT_INDEX = "tenant-index"
#: Sparse GSI of the jobs waiting in a queue, by the time their TTL ends (the expiry sweeper's).
QUEUED_INDEX = "queued-expiry-index"
#: Partition key value of that index: set while a job is ``queued``, removed when it leaves.
QUEUED_MARK = "queued"
#: Sparse GSI of the running jobs, by the time their lease lapses (the sweeper's takeover).
RUNNING_INDEX = "running-lease-index"
#: Partition key value of that index: set while a job is ``running``, removed when it leaves.
RUNNING_MARK = "running"
#: The running job's lease attribute (epoch seconds): past it, the job has no live worker.
LEASE_FIELD = "lease_expires_epoch"


class Status(StrEnum):
    """A job's ``status`` (spec, "Job lifecycle"; :mod:`asyncinfer.lifecycle` holds the allowed
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
    """DynamoDB typed item -> Python dict (Decimal -> int or float)."""
    return {k: _from_ddb(_deser.deserialize(v)) for k, v in item.items()}


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
