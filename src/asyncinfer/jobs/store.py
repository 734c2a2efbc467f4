"""Job records in DynamoDB: the table client, reads and queries (:mod:`asyncinfer.jobs.record`
holds the table design; :mod:`asyncinfer.jobs.writer` the writes of a job's status, which
:class:`JobStore` inherits, with the batched writes of :mod:`asyncinfer.jobs.transact`; the
named transitions it applies are :mod:`asyncinfer.jobs.transitions`).
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

from botocore.exceptions import ClientError

from asyncinfer.aws import clients
from asyncinfer.core import lifecycle
from asyncinfer.core.errors import (
    InvalidRequest,  # noqa: F401  (raised by decode_cursor; documented)
    TransitionRefused,
)
from asyncinfer.core.settings import get_settings
from asyncinfer.core.settings_needs import StoreConfig
from asyncinfer.jobs import transitions
from asyncinfer.jobs.cursors import decode_cursor, encode_cursor
from asyncinfer.jobs.record import (
    LEASE_FIELD,
    QUEUED_INDEX,
    QUEUED_MARK,
    REQUEUED_MARK,
    RUNNING_INDEX,
    RUNNING_MARK,
    TENANT_INDEX,
    JobRecord,
    from_item,
    record_from_item,
    to_item,
)
from asyncinfer.jobs.transact import BatchWriter
from asyncinfer.jobs.update import Transition, TransitionOutcome

__all__ = [
    "LEASE_FIELD",
    "QUEUED_INDEX",
    "QUEUED_MARK",
    "REQUEUED_MARK",
    "RUNNING_INDEX",
    "RUNNING_MARK",
    "TENANT_INDEX",
    "JobRecord",
    "JobStore",
    "Transition",
    "TransitionOutcome",
    "from_item",
    "to_item",
]


class JobStore(BatchWriter):
    """Reads and conditional writes of job records. Thread-safe (boto3 clients are).

    ``settings``: the table, endpoint and lease length (:class:`StoreConfig`: the whole settings
    or the part of the component that builds the store); default :func:`get_settings`.
    """

    def __init__(self, settings: StoreConfig | None = None) -> None:
        self.settings = settings or get_settings()
        self.table = self.settings.table_name
        self.ddb = clients.client("dynamodb", self.settings)

    # ------------------------------------------------------------------ create and read
    def create(self, record: JobRecord) -> None:
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

    def expire(self, job_id: str) -> JobRecord | None:
        """``queued -> expired`` (error ``expired``) for a job whose TTL passed in the queue
        before its first attempt (conditional on ``attempts`` 0: ``expired`` is only for jobs
        that never started; one handed back after it started is retried or failed by the normal
        rules). Returns the expired record, or ``None`` when the job was no longer queued for
        its first attempt (it started, was cancelled or already expired: nothing to do). The
        caller publishes the event."""
        try:
            return self.apply(transitions.expire(job_id))
        except TransitionRefused:
            return None

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
        return self.running_past_lease_page(now_epoch, limit)[0]

    def running_past_lease_page(
        self,
        now_epoch: int,
        limit: int = 100,
        start: dict[str, Any] | None = None,
        *,
        mark: str = RUNNING_MARK,
    ) -> tuple[list[str], dict[str, Any] | None]:
        """:meth:`running_past_lease` one page at a time: ``(ids, next)``, where ``next`` is the
        GSI key to pass as ``start`` for the following page (``None`` after the last), so a
        sweep goes past jobs it could not take back instead of reading them again. ``mark``
        :data:`REQUEUED_MARK`: the jobs handed back after they started whose requeue deadline
        passed before ``now_epoch`` instead (:mod:`asyncinfer.jobs.record`)."""
        params: dict[str, Any] = {
            "TableName": self.table,
            "IndexName": RUNNING_INDEX,
            "KeyConditionExpression": "running_mark = :m AND lease_expires_epoch < :now",
            "ExpressionAttributeValues": {
                ":m": {"S": mark},
                ":now": {"N": str(now_epoch)},
            },
            "Limit": limit,
        }
        if start:
            params["ExclusiveStartKey"] = start
        resp = self.ddb.query(**params)
        ids = [item["job_id"]["S"] for item in resp.get("Items", [])]
        return ids, resp.get("LastEvaluatedKey")

    def get(self, job_id: str, *, consistent: bool = True) -> JobRecord | None:
        """The record of ``job_id``, or ``None``. (The webhook dispatcher reads the OpenAI batch
        items, ``batch_...``, through it too, as a mapping.)"""
        resp = self.ddb.get_item(
            TableName=self.table, Key={"job_id": {"S": job_id}}, ConsistentRead=consistent
        )
        item = resp.get("Item")
        return record_from_item(item) if item else None

    def get_many(
        self, job_ids: Iterable[str], attributes: Iterable[str] = (), *, consistent: bool = False
    ) -> dict[str, JobRecord]:
        """Records of ``job_ids`` by id (missing ones absent); BatchGetItem, 100 keys a call.
        ``attributes`` limits what is read (a ProjectionExpression); ``consistent``: strongly
        consistent reads (an eventually consistent one may miss a record written just before:
        DynamoDB Developer Guide, "Read consistency")."""
        ids = list(dict.fromkeys(job_ids))
        out: dict[str, JobRecord] = {}
        attrs = list(attributes)
        for i in range(0, len(ids), 100):
            req: dict[str, Any] = {"Keys": [{"job_id": {"S": j}} for j in ids[i : i + 100]]}
            if consistent:
                req["ConsistentRead"] = True
            if attrs:
                names = {f"#a{n}": a for n, a in enumerate({"job_id", *attrs})}
                req["ProjectionExpression"] = ", ".join(names)
                req["ExpressionAttributeNames"] = names
            pending: dict[str, Any] = {self.table: req}
            while pending:
                resp = self.ddb.batch_get_item(RequestItems=pending)
                items: list[dict[str, Any]] = resp.get("Responses", {}).get(self.table, [])
                for item in items:
                    rec = record_from_item(item)
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
    ) -> tuple[list[JobRecord], str | None]:
        """A page of ``tenant``'s jobs, newest first, optionally filtered by status and model.

        Returns ``(records, next_cursor)``; ``next_cursor`` is opaque
        (:mod:`asyncinfer.jobs.cursors`) and ``None`` on the last page. DynamoDB applies filters
        after it reads (Developer Guide,
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
        records: list[JobRecord] = []
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
                records.append(record_from_item(item))
                if len(records) == limit:
                    more = idx < len(items) - 1 or start is not None
                    return records, encode_cursor(item) if more else None
            if not start or time.monotonic() >= deadline:
                break
        return records, encode_cursor(start) if start else None


#: :meth:`JobStore.list_for_tenant`: most Query calls one request makes ...
LIST_MAX_QUERIES = 4
#: ... and the seconds after which it makes no more (the API Lambda's timeout is 29 s).
LIST_TIME_BUDGET_SECONDS = 2.0
#: Items a filtered Query reads at a time (Limit counts items read, not items matched).
LIST_FILTERED_READ = 100
