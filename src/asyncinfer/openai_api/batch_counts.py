"""Exact ``request_counts`` of a batch without transactions (spec openai.md, "Batches":
counted once, never twice on retries).

One counter item per chunk of the batch (:mod:`.chunks`) in the job table: ``job_id`` =
``bcount#<batch id>#<k>`` (:func:`counter_key`; no ``tenant`` attribute, so it joins no index),
``completed`` and ``failed`` (N), ``counted`` (NS: the 0-based indexes of the chunk's lines
counted so far) and ``ttl`` (the batch's). A line is counted by one UpdateItem on its chunk's
item: ``ADD completed 1, counted {idx}`` on the condition ``NOT contains(counted, idx)``. A single
item's conditional write is atomic, so a retried or duplicated event finds its index in the set
and counts nothing, and a crash between two writes cannot lose or double a count (there is only
one write). Several lines of one chunk are counted by one such call (the condition names every
index; when it fails, each line is counted alone).

Why not the line marker and the batch's counter in one TransactWriteItems call, as before: one
call per line (two items, twice the write units of plain writes in AWS), and on the local stack's
emulator every TransactWriteItems call deep-copies the whole job table for its rollback (moto
5.2.5), so counting 2,000 lines cost 2,000 copies of a table that grew with the batch: the
largest part of the more than 10 minutes a 2,000-line batch took there. A chunk's item is
small (500 indexes: about 2 KB), the live counts are the sum of at most ``total / chunk_lines``
items (one BatchGetItem per 100 chunks) and nothing here grows with the table.
"""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Any

from botocore.exceptions import ClientError

#: Most line indexes named in one counter write's condition (a condition expression is at most
#: 4 KB: DynamoDB Developer Guide, "Expression parameters"; each name takes ~30 bytes).
MAX_PER_WRITE = 50
#: Keys per BatchGetItem call (DynamoDB API Reference, "BatchGetItem").
BATCH_GET_KEYS = 100


def counter_key(batch_id: str, k: int) -> str:
    """The ``job_id`` key of the counter item of chunk ``k`` of a batch."""
    return f"bcount#{batch_id}#{k}"


def chunk_count(record: dict[str, Any]) -> int:
    """How many chunks (so counter items) the batch ``record`` has (0 before validation)."""
    size, total = int(record.get("chunk_lines") or 0), int(record.get("total") or 0)
    return math.ceil(total / size) if size and total else 0


class LineCounts:
    """The counter items of batches in ``table`` (see the module docstring)."""

    def __init__(self, ddb: Any, table: str) -> None:
        self.ddb = ddb
        self.table = table

    def _items(self, record: dict[str, Any], attrs: tuple[str, ...]) -> list[dict[str, Any]]:
        """The batch's counter items that exist (strongly consistent reads), ``attrs`` only."""
        batch_id = record["job_id"]
        keys = [{"job_id": {"S": counter_key(batch_id, k)}} for k in range(chunk_count(record))]
        names = {f"#a{n}": a for n, a in enumerate(attrs)}
        out: list[dict[str, Any]] = []
        for i in range(0, len(keys), BATCH_GET_KEYS):
            pending: dict[str, Any] = {
                self.table: {
                    "Keys": keys[i : i + BATCH_GET_KEYS],
                    "ConsistentRead": True,
                    "ProjectionExpression": ", ".join(names),
                    "ExpressionAttributeNames": names,
                }
            }
            while pending:
                resp = self.ddb.batch_get_item(RequestItems=pending)
                out.extend(resp.get("Responses", {}).get(self.table, []))
                pending = resp.get("UnprocessedKeys") or {}
        return out

    def totals(self, record: dict[str, Any]) -> tuple[int, int]:
        """``(completed, failed)`` counted in the batch's counter items so far."""
        completed = failed = 0
        for item in self._items(record, ("completed", "failed")):
            completed += int(item.get("completed", {}).get("N", 0))
            failed += int(item.get("failed", {}).get("N", 0))
        return completed, failed

    def counted(self, record: dict[str, Any]) -> set[int]:
        """The 0-based indexes of the batch's lines counted so far."""
        out: set[int] = set()
        for item in self._items(record, ("counted",)):
            out.update(int(n) for n in item.get("counted", {}).get("NS", []))
        return out

    def add(self, record: dict[str, Any], lines: list[tuple[int, bool]]) -> int:
        """Count lines ``(index, succeeded)`` of the batch ``record`` once each; returns how
        many were counted now (a line counted before, or twice in ``lines``, counts once)."""
        size = int(record.get("chunk_lines") or 0)
        if not size:
            return 0
        by_chunk: dict[int, dict[int, bool]] = defaultdict(dict)
        for idx, ok in lines:
            by_chunk[idx // size].setdefault(idx, ok)
        counted = 0
        for k, group in sorted(by_chunk.items()):
            items = sorted(group.items())
            for i in range(0, len(items), MAX_PER_WRITE):
                part = items[i : i + MAX_PER_WRITE]
                if self._write(record, k, part):
                    counted += len(part)
                elif len(part) > 1:  # some counted before: each alone
                    counted += sum(self._write(record, k, [one]) for one in part)
        return counted

    def _write(self, record: dict[str, Any], k: int, part: list[tuple[int, bool]]) -> bool:
        """One conditional UpdateItem counting every line of ``part`` (all of chunk ``k``) or
        none; returns whether it applied."""
        ok = sum(1 for _, s in part if s)
        values: dict[str, Any] = {
            ":c": {"N": str(ok)},
            ":f": {"N": str(len(part) - ok)},
            ":set": {"NS": [str(idx) for idx, _ in part]},
            ":ttl": {"N": str(int(record.get("ttl") or 0))},
        }
        conds = []
        for n, (idx, _) in enumerate(part):
            values[f":i{n}"] = {"N": str(idx)}
            conds.append(f"NOT contains(#n, :i{n})")
        try:
            self.ddb.update_item(
                TableName=self.table,
                Key={"job_id": {"S": counter_key(record["job_id"], k)}},
                UpdateExpression="ADD #c :c, #f :f, #n :set SET #ttl = if_not_exists(#ttl, :ttl)",
                ConditionExpression=" AND ".join(conds),
                ExpressionAttributeNames={
                    "#c": "completed",
                    "#f": "failed",
                    "#n": "counted",
                    "#ttl": "ttl",
                },
                ExpressionAttributeValues=values,
            )
        except ClientError as exc:
            if exc.response["Error"]["Code"] != "ConditionalCheckFailedException":
                raise
            return False
        return True
