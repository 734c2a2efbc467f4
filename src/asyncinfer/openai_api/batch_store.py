"""Batch records and their lines in the job table (spec openai.md, "Batches").

No new table or index: three kinds of item live beside the job records, keyed so that the job
paths never see them (job ids match ``job_<ULID>``; the sweeper reads only its sparse GSIs, which
these items never join):

* the batch: ``job_id`` = ``batch_<ULID>`` (the batch id), ``tenant`` =
  ``batches#<tenant>``, so the ``tenant-index`` GSI lists a tenant's batches newest first
  without mixing them into ``GET /v1/jobs``; ``owner`` the tenant itself. Attributes:
  ``status`` (OpenAI's states), ``endpoint``, ``input_file_id``, ``completion_window``,
  ``created_at`` ... ``cancelled_at`` (N, epoch seconds, as OpenAI's object has them),
  ``metadata`` / ``webhook`` / ``errors`` (S, JSON), ``priority``, ``total``, ``completed``,
  ``failed`` (N, the request counts once the batch ended; see the counters below),
  ``next_line`` (N: lines ``[0, next_line)`` have their jobs), ``expanded`` (BOOL: expansion
  is over), ``ending`` (S: ``expired`` or ``cancelled`` once the batch is being ended early),
  ``output_file_id``, ``error_file_id``, ``ttl``;
* a line: ``job_id`` = ``bline#<batch id>#<digest of custom_id>`` (:func:`line_key`),
  ``tenant`` = ``blines#<batch id>`` (the GSI lists a batch's lines), ``batch_of``,
  ``custom_id``, ``line`` (N, 1-based line number of the input file), ``idx`` (N, 0-based among
  the file's requests), ``ttl`` (the batch's), ``line_job`` (the job id: written with the item,
  before the job, since the ids are derived; earlier versions set it once submitted) and, for
  a line whose job could not be made, ``error_code`` / ``error_message``;
* a chunk's counter (:mod:`.batch_counts`): ``job_id`` = ``bcount#<batch id>#<k>``, the
  ``completed`` / ``failed`` counts of the chunk's lines and the set of their indexes counted,
  so that a retried or duplicated job event never counts twice (one conditional write on one
  item: no transaction). While a batch runs its ``request_counts`` are its counters' sums
  (every record this store returns has them folded in); finalization writes the files' counts
  on the record. (Earlier versions marked a line ``done`` in a transaction with an ADD on the
  batch record; such a line is taken as counted.)

Status changes are conditional on the current status (:meth:`BatchStore.transition`), as job
transitions are.
"""

from __future__ import annotations

import builtins
import hashlib
import time
from collections.abc import Iterator
from typing import Any

from botocore.exceptions import ClientError

from asyncinfer.aws import clients
from asyncinfer.core.errors import TransitionRefused
from asyncinfer.core.settings_needs import TableConfig
from asyncinfer.jobs.store import TENANT_INDEX, from_item, to_item
from asyncinfer.openai_api.batch_counts import LineCounts
from asyncinfer.openai_api.batch_lines import LineItems

VALIDATING, FAILED, IN_PROGRESS, FINALIZING = "validating", "failed", "in_progress", "finalizing"
COMPLETED, EXPIRED, CANCELLING, CANCELLED = "completed", "expired", "cancelling", "cancelled"
TERMINAL = frozenset({FAILED, COMPLETED, EXPIRED, CANCELLED})

#: Statuses a batch may move to from each status (OpenAI's Batch lifecycle).
ALLOWED: dict[str, frozenset[str]] = {
    VALIDATING: frozenset({FAILED, IN_PROGRESS, CANCELLING, FINALIZING}),
    IN_PROGRESS: frozenset({FINALIZING, CANCELLING}),
    CANCELLING: frozenset({FINALIZING}),
    FINALIZING: frozenset({COMPLETED, EXPIRED, CANCELLED, FAILED}),
}


def batches_partition(tenant: str) -> str:
    """The ``tenant`` attribute of ``tenant``'s batch records (its GSI partition)."""
    return f"batches#{tenant}"


def lines_partition(batch_id: str) -> str:
    """The ``tenant`` attribute of a batch's line items (its GSI partition)."""
    return f"blines#{batch_id}"


def line_key(batch_id: str, custom_id: str) -> str:
    """The ``job_id`` key of the item of the line ``custom_id`` of a batch (a digest of the
    custom id, so that the key's size is bounded whatever the id)."""
    digest = hashlib.sha256(custom_id.encode()).hexdigest()[:40]
    return f"bline#{batch_id}#{digest}"


class BatchStore:
    """Batch records and line items in the job table of ``settings``."""

    def __init__(self, settings: TableConfig) -> None:
        self.settings = settings
        self.table = settings.table_name
        self.ddb = clients.client("dynamodb", settings)
        self.counts = LineCounts(self.ddb, self.table)
        #: Line items a chunk at a time (the bulk expansion): :mod:`.batch_lines`.
        self.line_items = LineItems(self.ddb, self.table, line_key, lines_partition)

    # ------------------------------------------------------------------ batch records
    def create(self, record: dict[str, Any]) -> None:
        """Put a new batch record (``attribute_not_exists``)."""
        self.ddb.put_item(
            TableName=self.table,
            Item=to_item(record),
            ConditionExpression="attribute_not_exists(job_id)",
        )

    def get(self, batch_id: str) -> dict[str, Any] | None:
        """The batch record (a strongly consistent read), or ``None``."""
        item = self.ddb.get_item(
            TableName=self.table, Key={"job_id": {"S": batch_id}}, ConsistentRead=True
        ).get("Item")
        if not item or not batch_id.startswith("batch_"):
            return None
        return self._fold(from_item(item))

    def list(
        self, tenant: str, *, limit: int, after: str | None
    ) -> tuple[builtins.list[dict[str, Any]], bool]:
        """Up to ``limit`` of ``tenant``'s batches, newest first, older than ``after`` (a batch
        id). Returns ``(records, has_more)``."""
        kwargs: dict[str, Any] = {
            "TableName": self.table,
            "IndexName": TENANT_INDEX,
            "KeyConditionExpression": "tenant = :t",
            "ExpressionAttributeValues": {":t": {"S": batches_partition(tenant)}},
            "ScanIndexForward": False,
            "Limit": limit + 1,
        }
        if after:
            kwargs["KeyConditionExpression"] += " AND job_id < :a"
            kwargs["ExpressionAttributeValues"][":a"] = {"S": after}
        items = self.ddb.query(**kwargs).get("Items", [])
        records = [from_item(i) for i in items]
        return [self._fold(r) for r in records[:limit]], len(records) > limit

    def transition(
        self,
        batch_id: str,
        *,
        from_status: str | tuple[str, ...],
        to_status: str,
        set_fields: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        """Move the batch from ``from_status`` to ``to_status`` (conditional write); sets
        ``<to_status>_at`` (epoch seconds) and ``set_fields``. Returns the record after it.

        Raises:
            TransitionRefused: the batch is not in ``from_status`` (``current``: as it is).
            ValueError: a move :data:`ALLOWED` does not have (a programming error).
        """
        froms = (from_status,) if isinstance(from_status, str) else from_status
        for f in froms:
            if to_status not in ALLOWED.get(f, frozenset()):
                raise ValueError(f"batch transition {f} -> {to_status} is not allowed")
        fields = {"status": to_status, f"{to_status}_at": int(time.time()), **(set_fields or {})}
        return self._update(batch_id, fields, froms)

    def update(self, batch_id: str, fields: dict[str, Any], *, status: str | None = None) -> bool:
        """Set ``fields`` on the batch, if it is in ``status`` (when given). Returns whether
        the write applied."""
        try:
            self._update(batch_id, fields, (status,) if status else ())
        except TransitionRefused:
            return False
        return True

    def advance(self, batch_id: str, start: int, end: int) -> bool:
        """Move ``next_line`` from ``start`` to ``end`` (a chunk is expanded); False where another
        run moved it already."""
        try:
            self.ddb.update_item(
                TableName=self.table,
                Key={"job_id": {"S": batch_id}},
                UpdateExpression="SET next_line = :e",
                ConditionExpression="next_line = :s",
                ExpressionAttributeValues={":s": {"N": str(start)}, ":e": {"N": str(end)}},
            )
        except ClientError as exc:
            if exc.response["Error"]["Code"] != "ConditionalCheckFailedException":
                raise
            return False
        return True

    def _update(
        self, batch_id: str, fields: dict[str, Any], froms: tuple[str, ...]
    ) -> dict[str, Any]:
        names = {f"#f{n}": k for n, k in enumerate(fields)}
        values = {f":v{n}": v for n, v in enumerate(fields.values())}
        sets = [f"#f{n} = :v{n}" for n in range(len(fields)) if fields[names[f"#f{n}"]] is not None]
        removes = [f"#f{n}" for n in range(len(fields)) if fields[names[f"#f{n}"]] is None]
        expr = ("SET " + ", ".join(sets) if sets else "") + (
            " REMOVE " + ", ".join(removes) if removes else ""
        )
        cond = "attribute_exists(job_id)"
        if froms:
            names["#st"] = "status"
            for n, f in enumerate(froms):
                values[f":from{n}"] = f
            cond += " AND #st IN (" + ", ".join(f":from{n}" for n in range(len(froms))) + ")"
        typed = to_item({k: v for k, v in values.items() if v is not None})
        try:
            resp = self.ddb.update_item(
                TableName=self.table,
                Key={"job_id": {"S": batch_id}},
                UpdateExpression=expr.strip(),
                ConditionExpression=cond,
                ExpressionAttributeNames=names,
                ExpressionAttributeValues=typed,
                ReturnValues="ALL_NEW",
            )
        except ClientError as exc:
            if exc.response["Error"]["Code"] != "ConditionalCheckFailedException":
                raise
            raise TransitionRefused(
                f"batch {batch_id} is not in {froms}", current=self.get(batch_id)
            ) from None
        return self._fold(from_item(resp["Attributes"]))

    # ------------------------------------------------------------------ lines
    def put_lines(
        self, batch_id: str, lines: builtins.list[tuple[str, int, int]], *, ttl: int
    ) -> None:
        """Record lines ``(custom_id, index, line number)`` of the batch before their jobs are
        submitted (``index``: 0-based among the file's requests; ``ttl``: the batch record's,
        epoch seconds). Each is an UpdateItem that leaves ``done`` and ``line_job`` alone, so a
        re-run of the expander keeps what is there."""
        for custom_id, index, number in lines:
            self.ddb.update_item(
                TableName=self.table,
                Key={"job_id": {"S": line_key(batch_id, custom_id)}},
                UpdateExpression="SET tenant = :p, batch_of = :b, custom_id = :c, "
                "line = :n, idx = :i, #ttl = :ttl",
                ExpressionAttributeNames={"#ttl": "ttl"},
                ExpressionAttributeValues={
                    ":p": {"S": lines_partition(batch_id)},
                    ":b": {"S": batch_id},
                    ":c": {"S": custom_id},
                    ":n": {"N": str(number)},
                    ":i": {"N": str(index)},
                    ":ttl": {"N": str(ttl)},
                },
            )

    def set_line_job(self, batch_id: str, custom_id: str, job_id: str) -> None:
        """Note the job that runs a line."""
        self.ddb.update_item(
            TableName=self.table,
            Key={"job_id": {"S": line_key(batch_id, custom_id)}},
            UpdateExpression="SET line_job = :j",
            ExpressionAttributeValues={":j": {"S": job_id}},
        )

    def lines(self, batch_id: str) -> Iterator[dict[str, Any]]:
        """Every line item of the batch (the GSI, paged; eventually consistent: callers that
        need every line check the count against the batch record)."""
        kwargs: dict[str, Any] = {
            "TableName": self.table,
            "IndexName": TENANT_INDEX,
            "KeyConditionExpression": "tenant = :t",
            "ExpressionAttributeValues": {":t": {"S": lines_partition(batch_id)}},
        }
        while True:
            resp = self.ddb.query(**kwargs)
            for item in resp.get("Items", []):
                yield from_item(item)
            if not resp.get("LastEvaluatedKey"):
                return
            kwargs["ExclusiveStartKey"] = resp["LastEvaluatedKey"]

    # ------------------------------------------------------------------ counts
    def _fold(self, record: dict[str, Any]) -> dict[str, Any]:
        """``record`` with ``completed`` / ``failed`` as they stand now: while the batch has not
        ended, its own fields plus its chunks' counter items (:mod:`.batch_counts`); once it
        ended, its fields alone (finalization wrote the files' counts there)."""
        if record.get("status") in TERMINAL or not record.get("chunk_lines"):
            return record
        completed, failed = self.counts.totals(record)
        return {
            **record,
            "completed": int(record.get("completed", 0)) + completed,
            "failed": int(record.get("failed", 0)) + failed,
        }

    def counted(self, record: dict[str, Any]) -> set[int]:
        """The 0-based indexes of the batch's lines counted so far."""
        return self.counts.counted(record)

    def count_lines(
        self, record: dict[str, Any], ended: builtins.list[tuple[str, str, str]]
    ) -> int:
        """Count the lines of ended jobs ``(custom_id, job id, terminal status)`` of the batch
        ``record`` once each (``succeeded`` in ``completed``, any other status in ``failed``);
        returns how many were counted now. A job counts only for a line of this batch whose
        noted job is that job (or not noted yet): a job of the same tenant that claims the batch
        in its metadata counts nothing; a line counted before counts nothing; a batch that
        ended counts nothing (its counts are its files'). The line items are read in
        BatchGetItem calls (100 keys, strongly consistent), then one counter write per chunk."""
        if record.get("status") in TERMINAL or not ended:
            return 0
        batch_id = record["job_id"]
        keys = list(dict.fromkeys(line_key(batch_id, cid) for cid, _, _ in ended))
        lines: dict[str, dict[str, Any]] = {}
        for i in range(0, len(keys), 100):
            pending: dict[str, Any] = {
                self.table: {
                    "Keys": [{"job_id": {"S": k}} for k in keys[i : i + 100]],
                    "ConsistentRead": True,
                }
            }
            while pending:
                resp = self.ddb.batch_get_item(RequestItems=pending)
                for item in resp.get("Responses", {}).get(self.table, []):
                    rec = from_item(item)
                    lines[rec["job_id"]] = rec
                pending = resp.get("UnprocessedKeys") or {}
        todo: builtins.list[tuple[int, bool]] = []
        for cid, job_id, status in ended:
            ln = lines.get(line_key(batch_id, cid))
            if ln is None or ln.get("batch_of") != batch_id or ln.get("custom_id") != cid:
                continue
            if ln.get("line_job") and ln["line_job"] != job_id:
                continue
            if ln.get("done"):  # counted by the transactional counter of earlier versions
                continue
            todo.append((int(ln["idx"]), status == "succeeded"))
        return self.counts.add(record, todo)

    def count_refused(
        self,
        record: dict[str, Any],
        custom_id: str,
        error: dict[str, str],
        *,
        unmade: str | None = None,
    ) -> bool:
        """Count a line whose job could not be made (``error`` ``{"code", "message"}``, kept on
        the line for the error file) as ``failed``, once; returns whether it counted now.
        ``unmade``: the job id the line's item names although that job was never made (a run
        that died between the items and the records), removed from it."""
        batch_id = record["job_id"]
        values = {
            ":ec": {"S": error["code"]},
            ":em": {"S": error["message"]},
            ":b": {"S": batch_id},
        }
        cond = "batch_of = :b AND attribute_not_exists(line_job)"
        expr = "SET error_code = :ec, error_message = :em"
        if unmade is not None:
            cond = "batch_of = :b AND (attribute_not_exists(line_job) OR line_job = :j)"
            expr += " REMOVE line_job"
            values[":j"] = {"S": unmade}
        try:
            resp = self.ddb.update_item(
                TableName=self.table,
                Key={"job_id": {"S": line_key(batch_id, custom_id)}},
                UpdateExpression=expr,
                ConditionExpression=cond,
                ExpressionAttributeValues=values,
                ReturnValues="ALL_NEW",
            )
        except ClientError as exc:
            if exc.response["Error"]["Code"] != "ConditionalCheckFailedException":
                raise
            return False
        if record.get("status") in TERMINAL:
            return False
        idx = int(from_item(resp["Attributes"])["idx"])
        return self.counts.add(record, [(idx, False)]) == 1
