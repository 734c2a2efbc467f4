"""Job records in DynamoDB.

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

Every status change is :meth:`JobStore.transition`: an UpdateItem whose condition is the current
status (``#status``: ``status`` is a DynamoDB reserved word) and, where given, the attempt number.
A late or duplicate update therefore fails with :class:`~asyncinfer.core.errors.TransitionRefused`
carrying the record as it now is (``ReturnValuesOnConditionCheckFailure=ALL_OLD``).
:meth:`JobStore.transition_many` writes the same conditional updates of several jobs in
TransactWriteItems calls, each item refused or applied as it would be alone.
"""

from __future__ import annotations

import json
import math
import random
import time
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from decimal import Decimal
from typing import Any, TypeVar

from boto3.dynamodb.types import TypeDeserializer, TypeSerializer
from botocore.exceptions import ClientError

from asyncinfer.aws import clients
from asyncinfer.core import lifecycle
from asyncinfer.core.chunks import chunked
from asyncinfer.core.errors import TransitionRefused
from asyncinfer.core.settings import Settings, get_settings
from asyncinfer.core.timeutil import iso, now
from asyncinfer.cursors import decode_cursor, encode_cursor

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

T = TypeVar("T")

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


class JobStore:
    """Reads and conditional writes of job records. Thread-safe (boto3 clients are)."""

    def __init__(self, settings: Settings | None = None) -> None:
        self.settings = settings or get_settings()
        self.table = self.settings.table_name
        self.ddb = clients.client("dynamodb", self.settings)

    # ------------------------------------------------------------------ create and read
    def create(self, record: dict[str, Any]) -> None:
        """Put a new job record; fails if the id exists (``attribute_not_exists``)."""
        self.ddb.put_item(
            TableName=self.table,
            Item=to_item(record),
            ConditionExpression="attribute_not_exists(job_id)",
        )

    def confirm_submitted(self, job_id: str, expires_epoch: int) -> None:
        """End the submit of ``job_id`` once its message is sent: ``expires_epoch`` (N) becomes
        the job's TTL end and ``submitting_until`` is removed. Until then the record carries
        ``submitting_until`` (N, epoch seconds) and, as ``expires_epoch``, that same time, so a
        submit that died between the record and the message (a Lambda timeout) leaves a job
        the expiry sweeper ends soon instead of one waiting ``queued`` for a message that never
        comes. Not conditional on the status: a worker may have started the job already."""
        self._update_item(
            TableName=self.table,
            Key={"job_id": {"S": job_id}},
            UpdateExpression="SET expires_epoch = :e REMOVE submitting_until",
            ConditionExpression="attribute_exists(job_id)",
            ExpressionAttributeValues={":e": {"N": str(expires_epoch)}},
        )

    def discard_unsubmitted(self, job_id: str) -> bool:
        """Delete the record of a submit that failed before its job was accepted (its message
        could not be sent), if it is still ``queued`` at attempt 0. A message that was sent after
        all finds no record, and the worker drops it. Returns whether the record is gone."""
        try:
            self.ddb.delete_item(
                TableName=self.table,
                Key={"job_id": {"S": job_id}},
                ConditionExpression="#status = :q AND attempts = :zero",
                ExpressionAttributeNames={"#status": "status"},
                ExpressionAttributeValues={":q": {"S": lifecycle.QUEUED}, ":zero": {"N": "0"}},
            )
        except ClientError as exc:
            if exc.response["Error"]["Code"] != "ConditionalCheckFailedException":
                raise
            return False
        return True

    def queued_past_expiry(self, now_epoch: int, limit: int = 100) -> list[str]:
        """Ids of up to ``limit`` queued jobs whose ``expires_epoch`` is at or before
        ``now_epoch`` (the queued-expiry GSI; eventually consistent, so callers re-check with a
        conditional write)."""
        resp = self.ddb.query(
            TableName=self.table,
            IndexName=QUEUED_INDEX,
            KeyConditionExpression="queued_mark = :m AND expires_epoch <= :now",
            ExpressionAttributeValues={":m": {"S": QUEUED_MARK}, ":now": {"N": str(now_epoch)}},
            Limit=limit,
        )
        return [item["job_id"]["S"] for item in resp.get("Items", [])]

    def running_past_lease(self, now_epoch: int, limit: int = 100) -> list[str]:
        """Ids of up to ``limit`` running jobs whose ``lease_expires_epoch`` is before
        ``now_epoch`` (epoch seconds), oldest lease first (the running-lease GSI; eventually
        consistent, so callers re-check with a conditional write)."""
        resp = self.ddb.query(
            TableName=self.table,
            IndexName=RUNNING_INDEX,
            KeyConditionExpression="running_mark = :m AND lease_expires_epoch < :now",
            ExpressionAttributeValues={":m": {"S": RUNNING_MARK}, ":now": {"N": str(now_epoch)}},
            Limit=limit,
        )
        return [item["job_id"]["S"] for item in resp.get("Items", [])]

    def lease_until(self, seconds: float | None = None) -> int:
        """The lease expiry (epoch seconds) of a lease taken or renewed now: ``seconds`` from now
        (default ``Settings.lease_interval``), rounded up."""
        length = self.settings.lease_interval if seconds is None else seconds
        return int(time.time()) + max(1, math.ceil(length))

    def renew_leases(
        self, leases: Iterable[tuple[str, int]], *, seconds: float | None = None
    ) -> set[str]:
        """Move the lease of each running ``(job_id, attempts)`` to ``seconds`` from now
        (default ``Settings.lease_interval``), each write conditional on the job still
        ``running`` at that attempt (:meth:`update_fields_many`: one TransactWriteItems call per
        100 jobs, an UpdateItem for one). Returns the ids refused: jobs that finished, or that
        the sweeper took back because their lease lapsed (no longer the caller's)."""
        until = self.lease_until(seconds)
        updates = [(job_id, attempts, {LEASE_FIELD: until}) for job_id, attempts in leases]
        if not updates:
            return set()
        return self.update_fields_many(updates, status=lifecycle.RUNNING)

    def get(self, job_id: str, *, consistent: bool = True) -> dict[str, Any] | None:
        """The record of ``job_id``, or ``None``."""
        resp = self.ddb.get_item(
            TableName=self.table, Key={"job_id": {"S": job_id}}, ConsistentRead=consistent
        )
        item = resp.get("Item")
        return from_item(item) if item else None

    def get_many(self, job_ids: Iterable[str], attributes: Iterable[str] = ()) -> dict[str, dict]:
        """Records of ``job_ids`` by id (missing ones absent); BatchGetItem, 100 keys a call.
        ``attributes`` limits what is read (a ProjectionExpression)."""
        ids = list(dict.fromkeys(job_ids))
        out: dict[str, dict] = {}
        attrs = list(attributes)
        for i in range(0, len(ids), 100):
            req: dict[str, Any] = {"Keys": [{"job_id": {"S": j}} for j in ids[i : i + 100]]}
            if attrs:
                names = {f"#a{n}": a for n, a in enumerate({"job_id", *attrs})}
                req["ProjectionExpression"] = ", ".join(names)
                req["ExpressionAttributeNames"] = names
            pending: dict[str, Any] = {self.table: req}
            while pending:
                resp = self.ddb.batch_get_item(RequestItems=pending)
                items: list[dict[str, Any]] = resp.get("Responses", {}).get(self.table, [])
                for item in items:
                    rec = from_item(item)
                    out[rec["job_id"]] = rec
                pending = resp.get("UnprocessedKeys") or {}
        return out

    def list_for_tenant(
        self,
        tenant: str,
        *,
        limit: int,
        cursor: str | None = None,
        status: str | None = None,
        model: str | None = None,
    ) -> tuple[list[dict[str, Any]], str | None]:
        """A page of ``tenant``'s jobs, newest first, optionally filtered by status and model.

        Returns ``(records, next_cursor)``; ``next_cursor`` is opaque (:mod:`asyncinfer.cursors`)
        and ``None`` on the last page. DynamoDB applies filters after it reads (Developer Guide,
        "Filter expressions for the Query operation"), so a filter that matches few jobs would
        read the tenant's whole history in one request: the reads stop after
        :data:`LIST_MAX_QUERIES` Query calls or :data:`LIST_TIME_BUDGET_SECONDS`, whichever
        comes first, and the page then holds fewer than ``limit`` records (even none) with a
        ``next_cursor`` where the reads stopped. Raises :class:`InvalidRequest` (field
        ``cursor``) for a cursor this service did not issue to ``tenant``.
        """
        kwargs: dict[str, Any] = {
            "TableName": self.table,
            "IndexName": TENANT_INDEX,
            "KeyConditionExpression": "tenant = :t",
            "ExpressionAttributeValues": {":t": {"S": tenant}},
            "ScanIndexForward": False,
        }
        filters, names = [], {}
        if status:
            filters.append("#status = :s")
            names["#status"] = "status"
            kwargs["ExpressionAttributeValues"][":s"] = {"S": status}
        if model:
            filters.append("#model = :m")
            names["#model"] = "model"
            kwargs["ExpressionAttributeValues"][":m"] = {"S": model}
        if filters:
            kwargs["FilterExpression"] = " AND ".join(filters)
            kwargs["ExpressionAttributeNames"] = names
        # An empty cursor (``?cursor=``) is no cursor: the first page, as before.
        start = decode_cursor(cursor, tenant) if cursor else None
        records: list[dict[str, Any]] = []
        deadline = time.monotonic() + LIST_TIME_BUDGET_SECONDS
        for _ in range(LIST_MAX_QUERIES):
            # Filters apply after Limit: read whole pages of keys while filtering.
            kwargs["Limit"] = limit - len(records) if not filters else LIST_FILTERED_READ
            if start:
                kwargs["ExclusiveStartKey"] = start
            resp = self.ddb.query(**kwargs)
            items = resp.get("Items", [])
            start = resp.get("LastEvaluatedKey")
            for idx, item in enumerate(items):
                records.append(from_item(item))
                if len(records) == limit:
                    more = idx < len(items) - 1 or start is not None
                    return records, encode_cursor(item) if more else None
            if not start or time.monotonic() >= deadline:
                break
        return records, encode_cursor(start) if start else None

    # ------------------------------------------------------------------ transitions
    def transition(
        self,
        job_id: str,
        *,
        from_status: str | Iterable[str],
        to_status: str,
        attempts: int | None = None,
        set_fields: dict[str, Any] | None = None,
        remove_fields: Iterable[str] = (),
        increment_attempts: bool = False,
    ) -> dict[str, Any]:
        """Move ``job_id`` from one of ``from_status`` to ``to_status`` in one conditional write.

        Args:
            from_status: the status (or statuses) the job must be in now.
            to_status: the new status; each ``from -> to`` must be allowed by
                :mod:`asyncinfer.core.lifecycle` (``ValueError`` otherwise: a programming error).
            attempts: when given, the job's ``attempts`` must equal it (a write from an earlier
                attempt is refused).
            set_fields: other attributes to set in the same write.
            remove_fields: attributes to remove in the same write.
            increment_attempts: add 1 to ``attempts`` (queued -> running).

        Returns:
            The record after the write.

        Raises:
            TransitionRefused: the job is not in ``from_status`` (or not at ``attempts``), or does
                not exist; ``current`` holds the record as it is.
        """
        return self.apply(
            Transition(
                job_id,
                from_status=from_status if isinstance(from_status, str) else tuple(from_status),
                to_status=to_status,
                attempts=attempts,
                set_fields=dict(set_fields or {}),
                remove_fields=tuple(remove_fields),
                increment_attempts=increment_attempts,
            )
        )

    def _update_item(self, **params: Any) -> Any:
        """``UpdateItem``, sent again after a short, growing pause when it meets a transaction
        writing the same item (``TransactionConflictException``: DynamoDB Developer Guide,
        "Transaction conflict handling in DynamoDB"), which botocore's standard retry mode does
        not retry: the worker's TransactWriteItems calls hold jobs the API may be cancelling.
        At most :data:`CONFLICT_RETRIES` more tries (~1.5 s in all); other errors at once."""
        pause = 0.05
        for attempt in range(CONFLICT_RETRIES + 1):
            try:
                return self.ddb.update_item(**params)
            except ClientError as exc:
                code = exc.response["Error"]["Code"]
                if code != "TransactionConflictException" or attempt == CONFLICT_RETRIES:
                    raise
            time.sleep(pause * (1 + random.random()))
            pause *= 2
        raise AssertionError("unreachable")

    def leased(self, t: Transition) -> Transition:
        """``t`` with a lease (``lease_expires_epoch`` = now + ``Settings.lease_interval``) when
        it starts an attempt (``-> running``) and sets none of its own; else ``t``."""
        if t.to_status != lifecycle.RUNNING or LEASE_FIELD in t.set_fields:
            return t
        return replace(t, set_fields={**t.set_fields, LEASE_FIELD: self.lease_until()})

    def apply(self, t: Transition) -> dict[str, Any]:
        """:meth:`transition` for a :class:`Transition` already built: the new record, or
        :class:`TransitionRefused` (with the current record) when its condition fails. A start
        takes a lease (:meth:`leased`)."""
        t.check()
        t = self.leased(t)
        try:
            resp = self._update_item(
                TableName=self.table,
                **_update_params(t),
                ReturnValues="ALL_NEW",
                ReturnValuesOnConditionCheckFailure="ALL_OLD",
            )
        except ClientError as exc:
            if exc.response["Error"]["Code"] != "ConditionalCheckFailedException":
                raise
            old: dict[str, Any] | None = exc.response.get("Item")  # type: ignore[assignment]
            raise _refused(t, from_item(old) if old else None) from None
        return from_item(resp["Attributes"])

    def transition_many(self, transitions: list[Transition]) -> list[TransitionOutcome]:
        """Apply several transitions of distinct jobs with TransactWriteItems, each still
        conditional on its own status (and attempt) as in :meth:`transition`.

        DynamoDB's limits (API Reference, "TransactWriteItems",
        https://docs.aws.amazon.com/amazondynamodb/latest/APIReference/API_TransactWriteItems.html):
        at most 100 actions per call, their items at most 4 MB in all, and no item targeted by
        more than one action of a call. Calls are cut at 100 transitions and at
        :data:`TRANSACT_BUDGET_BYTES` of estimated item size; a job id given twice is a
        ``ValueError`` (as is a transition the lifecycle does not allow). botocore gives each
        call a ``ClientRequestToken`` (an idempotency token), so its own retries of a call that
        did commit do not apply it twice.

        A transaction is all or nothing: when DynamoDB cancels one, the transitions it names as
        ``ConditionalCheckFailed`` are refused (``CancellationReasons``, with the current
        item through ``ReturnValuesOnConditionCheckFailure=ALL_OLD``) and the others are sent
        again in the next call; after :data:`TRANSACT_ROUNDS` calls, or when the cancellation
        names no reasons, or the call fails otherwise, each remaining transition is written
        alone with :meth:`transition`.

        Returns, in the order given, one outcome per transition: ``None`` when it was applied
        (the record is then ``t.applied_to(record before)``: TransactWriteItems returns no
        item), the :class:`TransitionRefused` when it was refused, or the exception that kept
        it from being written (an AWS fault: it may or may not have been applied).

        A start (``-> running``) written here should carry its lease in ``set_fields``
        (:data:`LEASE_FIELD`: :meth:`lease_until`), so that ``t.applied_to`` shows it; one written
        alone by :meth:`apply` gets one anyway. A start without a lease is not in the
        running-lease index, so the sweeper could not take it back.
        """
        seen: set[str] = set()
        for t in transitions:
            t.check()
            if t.job_id in seen:
                raise ValueError(f"{t.job_id} twice in one transaction")
            seen.add(t.job_id)
        out: list[TransitionOutcome] = [None] * len(transitions)
        for chunk in _transaction_chunks(list(enumerate(transitions)), self._sizes(transitions)):
            todo = chunk
            for _ in range(TRANSACT_ROUNDS):
                if len(todo) == 1:
                    break
                try:
                    todo = self._transact(todo, out)
                except Exception:  # an AWS fault: write them one by one
                    break
                if not todo:
                    break
            for n, t in todo:
                try:
                    self.apply(t)
                except TransitionRefused as exc:
                    # A call that failed may have committed before its answer was lost: a
                    # refusal by a record that already shows this very write is no refusal.
                    out[n] = None if t.shows_applied(exc.current) else exc
                except Exception as exc:  # the caller decides per job
                    out[n] = exc
        return out

    def _sizes(self, transitions: list[Transition]) -> list[int]:
        return [
            ITEM_BASE_BYTES + len(json.dumps(_update_params(t), default=str)) for t in transitions
        ]

    def _transact(
        self, todo: list[tuple[int, Transition]], out: list[TransitionOutcome]
    ) -> list[tuple[int, Transition]]:
        """One TransactWriteItems call: fills ``out`` for what was decided, returns what must be
        sent again."""
        items = [
            {
                "Update": {
                    "TableName": self.table,
                    **_update_params(t),
                    "ReturnValuesOnConditionCheckFailure": "ALL_OLD",
                }
            }
            for _, t in todo
        ]
        again = []
        for (n, t), r in zip(todo, self._send_transaction(items), strict=False):
            if r.get("Code") == "ConditionalCheckFailed":
                old = r.get("Item")
                out[n] = _refused(t, from_item(old) if old else None)
            else:  # "None" (not the cause), TransactionConflict, throttling: send it again
                again.append((n, t))
        return again

    def _send_transaction(self, items: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """One TransactWriteItems call with ``items``. Returns ``[]`` when it committed, else
        DynamoDB's cancellation reasons, one per item in order (``Code``:
        ``ConditionalCheckFailed``, with the item as ``Item`` when ``ALL_OLD`` was asked;
        ``None`` for an item that did not cause the cancellation; ``TransactionConflict``, ...).
        Raises the ``ClientError`` of any other failure, and of a cancellation that does not give
        a reason per item."""
        try:
            self.ddb.transact_write_items(TransactItems=items)
        except ClientError as exc:
            if exc.response["Error"]["Code"] != "TransactionCanceledException":
                raise
            reasons: list[dict[str, Any]] = exc.response.get("CancellationReasons") or []  # type: ignore[assignment]
            if len(reasons) != len(items):
                raise
            return reasons
        return []

    def expire(self, job_id: str) -> dict[str, Any] | None:
        """``queued -> expired`` (error ``expired``) for a job whose TTL passed in the queue
        before its first attempt (conditional on ``attempts`` 0: ``expired`` is only for jobs
        that never started; one handed back after it started is retried or failed by the normal
        rules). Returns the expired record, or ``None`` when the job was no longer queued for
        its first attempt (it started, was cancelled or already expired: nothing to do). The
        caller publishes the event."""
        try:
            return self.transition(
                job_id,
                from_status=lifecycle.QUEUED,
                to_status=lifecycle.EXPIRED,
                attempts=0,
                set_fields={
                    "completed_at": iso(now()),
                    "error": {"code": "expired", "message": "job expired in the queue (ttl)"},
                },
            )
        except TransitionRefused:
            return None

    def update_fields(
        self,
        job_id: str,
        *,
        status: str,
        attempts: int | None,
        set_fields: dict[str, Any],
        unless: str | None = None,
    ) -> bool:
        """Set non-status fields (progress, cancel requests) while the job is still in ``status``
        (and at ``attempts``, and without the attribute ``unless``). Returns False when the job
        has moved on; never raises for that."""
        names = {"#status": "status"}
        values: dict[str, Any] = {":s": {"S": status}}
        cond = "#status = :s"
        if attempts is not None:
            cond += " AND attempts = :att"
            values[":att"] = {"N": str(attempts)}
        if unless:
            names["#unless"] = unless
            cond += " AND attribute_not_exists(#unless)"
        sets = []
        for n, (k, v) in enumerate(set_fields.items()):
            names[f"#k{n}"] = k
            values[f":v{n}"] = _ser.serialize(_to_ddb(v))
            sets.append(f"#k{n} = :v{n}")
        try:
            self._update_item(
                TableName=self.table,
                Key={"job_id": {"S": job_id}},
                UpdateExpression="SET " + ", ".join(sets),
                ConditionExpression=cond,
                ExpressionAttributeNames=names,
                ExpressionAttributeValues=values,
            )
        except ClientError as exc:
            if exc.response["Error"]["Code"] == "ConditionalCheckFailedException":
                return False
            raise
        return True

    def update_fields_many(
        self,
        updates: list[tuple[str, int, dict[str, Any]]],
        *,
        status: str,
        unless: str | None = None,
    ) -> set[str]:
        """Set fields on several jobs that are still in ``status`` at their attempt (and, with
        ``unless``, do not have that attribute), in one TransactWriteItems call per 100 jobs.
        ``updates`` holds ``(job_id, attempts, fields)``.

        A transaction is all or nothing: when some conditions fail, the others are written again
        in a second transaction. A lone update is an UpdateItem (the same one request, at half
        the write units). Returns the ids whose condition failed.
        """
        refused: set[str] = set()
        sizes = [ITEM_BASE_BYTES + len(json.dumps(fields, default=str)) for _, _, fields in updates]
        for chunk in _transaction_chunks(updates, sizes):
            for _ in range(2):
                if len(chunk) == 1:  # the same one request, at half the write units
                    job_id, attempts, fields = chunk[0]
                    if not self._update_one(job_id, status, attempts, fields, unless):
                        refused.add(job_id)
                    break
                failed = self._transact_updates(chunk, status=status, unless=unless)
                refused |= failed
                chunk = [u for u in chunk if u[0] not in failed]
                if not failed or not chunk:
                    break
        return refused

    def _transact_updates(
        self, chunk: list[tuple[str, int, dict[str, Any]]], *, status: str, unless: str | None
    ) -> set[str]:
        items = []
        for job_id, attempts, fields in chunk:
            names = {"#status": "status"}
            values: dict[str, Any] = {":s": {"S": status}, ":att": {"N": str(attempts)}}
            sets = []
            for n, (k, v) in enumerate(fields.items()):
                names[f"#k{n}"] = k
                values[f":v{n}"] = _ser.serialize(_to_ddb(v))
                sets.append(f"#k{n} = :v{n}")
            cond = "#status = :s AND attempts = :att"
            if unless:
                names["#unless"] = unless
                cond += " AND attribute_not_exists(#unless)"
            items.append(
                {
                    "Update": {
                        "TableName": self.table,
                        "Key": {"job_id": {"S": job_id}},
                        "UpdateExpression": "SET " + ", ".join(sets),
                        "ConditionExpression": cond,
                        "ExpressionAttributeNames": names,
                        "ExpressionAttributeValues": values,
                    }
                }
            )
        try:
            reasons = self._send_transaction(items)
        except ClientError as exc:
            if exc.response["Error"]["Code"] != "TransactionCanceledException":
                raise
            return {  # cancelled without a reason per item: each alone
                job_id
                for job_id, attempts, fields in chunk
                if not self._update_one(job_id, status, attempts, fields, unless)
            }
        return {
            job_id
            for (job_id, _, _), r in zip(chunk, reasons, strict=False)
            if r.get("Code") == "ConditionalCheckFailed"
        }

    def _update_one(
        self, job_id: str, status: str, attempts: int, fields: dict[str, Any], unless: str | None
    ) -> bool:
        return self.update_fields(
            job_id, status=status, attempts=attempts, set_fields=fields, unless=unless
        )


#: More tries of a conditional UpdateItem that met a transaction on its item (see
#: :meth:`JobStore._update_item`).
CONFLICT_RETRIES = 4
#: TransactWriteItems: at most 100 actions a call (DynamoDB API Reference, "TransactWriteItems").
TRANSACT_MAX_ITEMS = 100
#: ... and their items at most 4 MB in all (same page); calls are cut well below, at this many
#: bytes of estimated item size.
TRANSACT_BUDGET_BYTES = 3 * 1024 * 1024
#: Estimated size of a job record apart from what a write sets: ids, times, ``metadata`` (at
#: most 2 KB), ``webhook`` (a URL of at most 2 KB) and the rest.
ITEM_BASE_BYTES = 6 * 1024
#: Calls :meth:`JobStore.transition_many` makes before it writes what is left one by one.
TRANSACT_ROUNDS = 3
#: :meth:`JobStore.list_for_tenant`: most Query calls one request makes ...
LIST_MAX_QUERIES = 4
#: ... and the seconds after which it makes no more (the API Lambda's timeout is 29 s).
LIST_TIME_BUDGET_SECONDS = 2.0
#: Items a filtered Query reads at a time (Limit counts items read, not items matched).
LIST_FILTERED_READ = 100


@dataclass(frozen=True)
class Transition:
    """One conditional status change: the arguments of :meth:`JobStore.transition`."""

    job_id: str
    from_status: str | tuple[str, ...]
    to_status: str
    attempts: int | None = None
    set_fields: dict[str, Any] = field(default_factory=dict)
    remove_fields: tuple[str, ...] = ()
    increment_attempts: bool = False
    #: When given (epoch seconds), the job's lease must have lapsed before it (the sweeper's
    #: takeover: a worker that renewed its lease meanwhile keeps the job).
    lease_lapsed_before: int | None = None

    @property
    def froms(self) -> tuple[str, ...]:
        return (self.from_status,) if isinstance(self.from_status, str) else self.from_status

    def check(self) -> None:
        """``ValueError`` when the lifecycle does not allow it (a programming error)."""
        for f in self.froms:
            if not lifecycle.is_allowed(f, self.to_status):
                raise ValueError(f"lifecycle does not allow {f} -> {self.to_status}")

    def applied_to(self, record: dict[str, Any]) -> dict[str, Any]:
        """``record`` as this write leaves it: what ``ReturnValues=ALL_NEW`` would give when
        nobody else wrote the item in between."""
        new = dict(record)
        new["status"] = self.to_status
        if self.increment_attempts:
            new["attempts"] = int(new.get("attempts") or 0) + 1
        new.update(_written(self.set_fields))
        for k in self.remove_fields:
            new.pop(k, None)
        new.pop("queued_mark", None)
        if self.to_status == lifecycle.RUNNING:
            new["running_mark"] = RUNNING_MARK
        else:
            new.pop("running_mark", None)
            new.pop(LEASE_FIELD, None)
        return new

    def shows_applied(self, current: dict[str, Any] | None) -> bool:
        """Whether ``current`` already holds this write (its status and every field it sets)."""
        if current is None or current.get("status") != self.to_status or not self.set_fields:
            return False
        return all(current.get(k) == v for k, v in _written(self.set_fields).items())


#: What :meth:`JobStore.transition_many` says of one transition: ``None`` (applied), the
#: refusal, or the exception that kept it from being written.
TransitionOutcome = TransitionRefused | Exception | None


def _written(fields: dict[str, Any]) -> dict[str, Any]:
    """``fields`` as DynamoDB stores and returns them (floats, Decimals, sets)."""
    return {k: _from_ddb(_deser.deserialize(_ser.serialize(_to_ddb(v)))) for k, v in fields.items()}


def _update_params(t: Transition) -> dict[str, Any]:
    """The Key, expressions and condition of ``t``'s UpdateItem (or transaction Update)."""
    names = {"#status": "status"}
    values: dict[str, Any] = {":to": {"S": t.to_status}}
    conds = []
    for n, f in enumerate(t.froms):
        values[f":f{n}"] = {"S": f}
    conds.append("#status IN (" + ", ".join(f":f{n}" for n in range(len(t.froms))) + ")")
    if t.attempts is not None:
        conds.append("attempts = :att")
        values[":att"] = {"N": str(t.attempts)}
    if t.lease_lapsed_before is not None:
        conds.append("lease_expires_epoch < :lapsed")
        values[":lapsed"] = {"N": str(t.lease_lapsed_before)}
    sets = ["#status = :to"]
    for n, (k, v) in enumerate(t.set_fields.items()):
        names[f"#k{n}"] = k
        values[f":v{n}"] = _ser.serialize(_to_ddb(v))
        sets.append(f"#k{n} = :v{n}")
    if t.increment_attempts:
        sets.append("attempts = attempts + :one")
        values[":one"] = {"N": "1"}
    # The queued mark is the submit's alone (only a first attempt can expire); the running mark
    # and the lease hold while the job runs.
    removes = [*t.remove_fields, "queued_mark"]
    if t.to_status == lifecycle.RUNNING:
        sets.append("running_mark = :rm")
        values[":rm"] = {"S": RUNNING_MARK}
    else:
        removes += ["running_mark", LEASE_FIELD]
    removes = [k for k in dict.fromkeys(removes) if k not in t.set_fields]
    expr = "SET " + ", ".join(sets)
    if removes:
        for n, k in enumerate(removes):
            names[f"#r{n}"] = k
        expr += " REMOVE " + ", ".join(f"#r{n}" for n in range(len(removes)))
    return {
        "Key": {"job_id": {"S": t.job_id}},
        "UpdateExpression": expr,
        "ConditionExpression": "attribute_exists(job_id) AND " + " AND ".join(conds),
        "ExpressionAttributeNames": names,
        "ExpressionAttributeValues": values,
    }


def _refused(t: Transition, current: dict[str, Any] | None) -> TransitionRefused:
    got = f"{current['status']} (attempts {current.get('attempts')})" if current else "none"
    at = f" at attempt {t.attempts}" if t.attempts is not None else ""
    return TransitionRefused(
        f"{t.job_id}: refused {'/'.join(t.froms)} -> {t.to_status}{at}; it is {got}", current
    )


def _transaction_chunks(items: list[T], sizes: list[int]) -> list[list[T]]:
    """``items`` cut into TransactWriteItems calls (:data:`TRANSACT_MAX_ITEMS`,
    :data:`TRANSACT_BUDGET_BYTES`)."""
    return chunked(items, sizes, max_items=TRANSACT_MAX_ITEMS, max_bytes=TRANSACT_BUDGET_BYTES)
