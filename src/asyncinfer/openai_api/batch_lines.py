"""A batch's line items written a chunk at a time (the bulk expansion, issue 15): the items
of lines not there yet in BatchWriteItem calls, after one BatchGetItem read of what is there,
so that a re-run never clobbers a line an earlier run wrote (its ``error_code``, or the
``done`` of earlier versions) and writes nothing for it. The item's layout is
:mod:`.batch_store`'s; its ``line_job`` (the job's derived id) is written with it, before
the job exists, so that the counter knows the line when the job's event comes.
"""

from __future__ import annotations

import time
from typing import Any

from asyncinfer.jobs.record import from_item
from asyncinfer.openai_api.batch_counts import BATCH_GET_KEYS

#: Items per BatchWriteItem call (DynamoDB API Reference, "BatchWriteItem").
BATCH_WRITE_ITEMS = 25
#: BatchWriteItem / BatchGetItem calls made for what DynamoDB left unprocessed before giving up.
UNPROCESSED_ROUNDS = 8


class LineItems:
    """Line items of batches in ``table`` (``ddb``: a DynamoDB client); ``key`` and
    ``partition`` are :func:`.batch_store.line_key` and :func:`.batch_store.lines_partition`."""

    def __init__(self, ddb: Any, table: str, key: Any, partition: Any) -> None:
        self.ddb = ddb
        self.table = table
        self.key = key
        self.partition = partition

    def get(self, batch_id: str, custom_ids: list[str]) -> dict[str, dict[str, Any]]:
        """The items of the batch's lines ``custom_ids`` that exist, by custom id (strongly
        consistent BatchGetItem reads, 100 keys a call)."""
        keys = list(dict.fromkeys(self.key(batch_id, c) for c in custom_ids))
        out: dict[str, dict[str, Any]] = {}
        for i in range(0, len(keys), BATCH_GET_KEYS):
            pending: dict[str, Any] = {
                self.table: {
                    "Keys": [{"job_id": {"S": k}} for k in keys[i : i + BATCH_GET_KEYS]],
                    "ConsistentRead": True,
                }
            }
            for _ in range(UNPROCESSED_ROUNDS):
                resp = self.ddb.batch_get_item(RequestItems=pending)
                for item in resp.get("Responses", {}).get(self.table, []):
                    rec = from_item(item)
                    if rec.get("batch_of") == batch_id:
                        out[str(rec["custom_id"])] = rec
                pending = resp.get("UnprocessedKeys") or {}
                if not pending:
                    break
                time.sleep(0.05)
            else:
                raise RuntimeError(f"batch {batch_id}: line items left unread")
        return out

    def put(
        self, batch_id: str, lines: list[tuple[str, int, int, str | None]], *, ttl: int
    ) -> None:
        """Write the items of lines ``(custom_id, index, line number, job id or None)`` (the
        caller passes only lines not there yet; ``ttl``: the batch record's, epoch seconds).

        Raises:
            RuntimeError: DynamoDB kept some writes unprocessed (the chunk is run again).
        """
        requests = []
        for custom_id, index, number, job_id in lines:
            item: dict[str, Any] = {
                "job_id": {"S": self.key(batch_id, custom_id)},
                "tenant": {"S": self.partition(batch_id)},
                "batch_of": {"S": batch_id},
                "custom_id": {"S": custom_id},
                "line": {"N": str(number)},
                "idx": {"N": str(index)},
                "ttl": {"N": str(ttl)},
            }
            if job_id is not None:
                item["line_job"] = {"S": job_id}
            requests.append({"PutRequest": {"Item": item}})
        for i in range(0, len(requests), BATCH_WRITE_ITEMS):
            pending: dict[str, Any] = {self.table: requests[i : i + BATCH_WRITE_ITEMS]}
            for _ in range(UNPROCESSED_ROUNDS):
                resp = self.ddb.batch_write_item(RequestItems=pending)
                pending = resp.get("UnprocessedItems") or {}
                if not pending:
                    break
                time.sleep(0.05)
            else:
                raise RuntimeError(f"batch {batch_id}: line items left unwritten")
