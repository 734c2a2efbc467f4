"""Job records in DynamoDB.

Table design (the CDK app and the local stack create it the same way):

* partition key ``job_id`` (S), no sort key: one item per job;
* GSI ``tenant-index``: partition key ``tenant`` (S), sort key ``job_id`` (S), projection ALL.
  Job ids are ULIDs, so a Query with ``ScanIndexForward=False`` lists a tenant's jobs newest first;
* sparse GSI ``queued-expiry-index``: partition key ``queued_mark`` (S, present only while the
  job is ``queued``), sort key ``expires_epoch`` (N), projection KEYS_ONLY: the expiry sweeper
  finds queued jobs past their TTL without a scan. :meth:`JobStore.transition` keeps the mark;
* TTL attribute ``ttl`` (N, epoch seconds): the record is deleted some time after
  ``created + record_retention_seconds`` (DynamoDB TTL; it never runs on the emulator).

Item attributes: ``job_id``, ``tenant``, ``model``, ``status``, ``attempts`` (N: attempts started),
``priority``, ``created_at`` / ``started_at`` / ``completed_at`` / ``expires_at`` (RFC 3339),
``timeout_seconds`` (N), ``input_ref`` (S3 URI, only for inputs stored in S3), ``output`` (S, JSON
text, when at most 64 KB), ``output_ref`` (S3 URI otherwise), ``error`` (M: code, message),
``progress_tokens`` (N), ``cancel_requested`` (BOOL), ``webhook`` (S, JSON), ``metadata`` (M of S),
``ttl`` (N).

Every status change is :meth:`JobStore.transition`: an UpdateItem whose condition is the current
status (``#status``: ``status`` is a DynamoDB reserved word) and, where given, the attempt number.
A late or duplicate update therefore fails with :class:`~asyncinfer.errors.TransitionRefused`
carrying the record as it now is (``ReturnValuesOnConditionCheckFailure=ALL_OLD``).
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterable
from decimal import Decimal
from typing import Any

from boto3.dynamodb.types import TypeDeserializer, TypeSerializer
from botocore.exceptions import ClientError

from asyncinfer import clients, lifecycle
from asyncinfer.errors import InvalidRequest, TransitionRefused
from asyncinfer.ids import is_job_id
from asyncinfer.settings import Settings, get_settings
from asyncinfer.timeutil import iso, now

TENANT_INDEX = "tenant-index"
#: Sparse GSI of the jobs waiting in a queue, by the time their TTL ends (the expiry sweeper's).
QUEUED_INDEX = "queued-expiry-index"
#: Partition key value of that index: set while a job is ``queued``, removed when it leaves.
QUEUED_MARK = "queued"

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

        Returns ``(records, next_cursor)``; ``next_cursor`` is opaque (base64 of the last key) and
        ``None`` on the last page. Raises :class:`InvalidRequest` (field ``cursor``) for a cursor
        this service did not issue or that belongs to another tenant.
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
        start = _decode_cursor(cursor, tenant) if cursor else None
        records: list[dict[str, Any]] = []
        last_key: dict[str, Any] | None = None
        while len(records) < limit:
            # Filters apply after Limit, so read in pages until enough records match.
            kwargs["Limit"] = limit - len(records) if not filters else max(limit, 25)
            if start:
                kwargs["ExclusiveStartKey"] = start
            resp = self.ddb.query(**kwargs)
            items = resp.get("Items", [])
            for idx, item in enumerate(items):
                records.append(from_item(item))
                if len(records) == limit:
                    if idx < len(items) - 1 or resp.get("LastEvaluatedKey"):
                        last_key = {k: item[k] for k in ("job_id", "tenant")}
                    break
            else:
                start = resp.get("LastEvaluatedKey")
                last_key = start
                if not start:
                    break
                continue
            break
        return records, _encode_cursor(last_key) if last_key else None

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
                :mod:`asyncinfer.lifecycle` (``ValueError`` otherwise: a programming error).
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
        froms = (from_status,) if isinstance(from_status, str) else tuple(from_status)
        for f in froms:
            if not lifecycle.is_allowed(f, to_status):
                raise ValueError(f"lifecycle does not allow {f} -> {to_status}")
        names = {"#status": "status"}
        values: dict[str, Any] = {":to": {"S": to_status}}
        conds = []
        for n, f in enumerate(froms):
            values[f":f{n}"] = {"S": f}
        conds.append("#status IN (" + ", ".join(f":f{n}" for n in range(len(froms))) + ")")
        if attempts is not None:
            conds.append("attempts = :att")
            values[":att"] = {"N": str(attempts)}
        sets = ["#status = :to"]
        for n, (k, v) in enumerate((set_fields or {}).items()):
            names[f"#k{n}"] = k
            values[f":v{n}"] = _ser.serialize(_to_ddb(v))
            sets.append(f"#k{n} = :v{n}")
        if increment_attempts:
            sets.append("attempts = attempts + :one")
            values[":one"] = {"N": "1"}
        removes = list(remove_fields)
        if to_status == lifecycle.QUEUED:
            sets.append("queued_mark = :qm")
            values[":qm"] = {"S": QUEUED_MARK}
        else:
            removes.append("queued_mark")
        expr = "SET " + ", ".join(sets)
        if removes:
            for n, k in enumerate(removes):
                names[f"#r{n}"] = k
            expr += " REMOVE " + ", ".join(f"#r{n}" for n in range(len(removes)))
        try:
            resp = self.ddb.update_item(
                TableName=self.table,
                Key={"job_id": {"S": job_id}},
                UpdateExpression=expr,
                ConditionExpression="attribute_exists(job_id) AND " + " AND ".join(conds),
                ExpressionAttributeNames=names,
                ExpressionAttributeValues=values,
                ReturnValues="ALL_NEW",
                ReturnValuesOnConditionCheckFailure="ALL_OLD",
            )
        except ClientError as exc:
            if exc.response["Error"]["Code"] != "ConditionalCheckFailedException":
                raise
            old: dict[str, Any] | None = exc.response.get("Item")  # type: ignore[assignment]
            current = from_item(old) if old else None
            got = f"{current['status']} (attempts {current.get('attempts')})" if current else "none"
            raise TransitionRefused(
                f"{job_id}: refused {'/'.join(froms)} -> {to_status}"
                f"{f' at attempt {attempts}' if attempts is not None else ''}; it is {got}",
                current,
            ) from None
        return from_item(resp["Attributes"])

    def expire(self, job_id: str) -> dict[str, Any] | None:
        """``queued -> expired`` (error ``expired``) for a job whose TTL passed in the queue.
        Returns the expired record, or ``None`` when the job was no longer queued (it started,
        was cancelled or already expired: nothing to do). The caller publishes the event."""
        try:
            return self.transition(
                job_id,
                from_status=lifecycle.QUEUED,
                to_status=lifecycle.EXPIRED,
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
            self.ddb.update_item(
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
        in a second transaction. Returns the ids whose condition failed.
        """
        refused: set[str] = set()
        for i in range(0, len(updates), 100):
            chunk = updates[i : i + 100]
            for _ in range(2):
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
            self.ddb.transact_write_items(TransactItems=items)
        except ClientError as exc:
            if exc.response["Error"]["Code"] != "TransactionCanceledException":
                raise
            reasons = exc.response.get("CancellationReasons") or []
            if len(reasons) != len(chunk):  # no per-item reasons: try each alone
                return {
                    job_id
                    for job_id, attempts, fields in chunk
                    if not self._update_one(job_id, status, attempts, fields, unless)
                }
            return {
                job_id
                for (job_id, _, _), r in zip(chunk, reasons, strict=True)
                if r.get("Code") == "ConditionalCheckFailed"
            }
        return set()

    def _update_one(
        self, job_id: str, status: str, attempts: int, fields: dict[str, Any], unless: str | None
    ) -> bool:
        return self.update_fields(
            job_id, status=status, attempts=attempts, set_fields=fields, unless=unless
        )


def _encode_cursor(key: dict[str, Any]) -> str:
    raw = json.dumps({k: v["S"] for k, v in key.items()}, separators=(",", ":"))
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


def _decode_cursor(cursor: str, tenant: str) -> dict[str, Any]:
    bad = InvalidRequest(
        "cursor is not valid", [{"field": "cursor", "message": "not a cursor from this API"}]
    )
    try:
        padded = cursor + "=" * (-len(cursor) % 4)
        data = json.loads(base64.urlsafe_b64decode(padded.encode()))
        if not isinstance(data, dict) or set(data) != {"job_id", "tenant"}:
            raise bad
        if not is_job_id(str(data["job_id"])):
            raise bad
    except (ValueError, TypeError):
        raise bad from None
    if data["tenant"] != tenant:
        raise bad
    return {k: {"S": str(v)} for k, v in data.items()}
