"""Cutting a list of request entries into calls that respect an AWS batch API's limits (at most
so many entries, at most so many bytes a call): SNS PublishBatch and DynamoDB TransactWriteItems
use it."""

from __future__ import annotations

from typing import TypeVar

T = TypeVar("T")


def chunked(items: list[T], sizes: list[int], *, max_items: int, max_bytes: int) -> list[list[T]]:
    """``items`` cut, in order, into runs of at most ``max_items`` whose ``sizes`` (bytes, one
    per item) sum to at most ``max_bytes``; an item larger than ``max_bytes`` goes alone (the
    service then refuses it, as it would anyway)."""
    chunks: list[list[T]] = []
    cur: list[T] = []
    total = 0
    for item, size in zip(items, sizes, strict=True):
        if cur and (len(cur) == max_items or total + size > max_bytes):
            chunks.append(cur)
            cur, total = [], 0
        cur.append(item)
        total += size
    if cur:
        chunks.append(cur)
    return chunks
