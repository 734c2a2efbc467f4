"""A bound on each tenant's concurrent long polls (``GET /v1/jobs/{id}?wait=N``; issue 14,
behaviour 7), shared by every copy of the API Lambda.

A long poll holds a Lambda for up to 20 s; without a bound one tenant's waits could take the
account's whole Lambda concurrency and starve every other tenant and function. A wait past the
bound is answered 429 ``rate_limited`` (spec, "Errors") at once, with ``Retry-After``; a
request without ``wait`` is never limited here.

**The count.** The API Lambda is stateless and runs many copies, so the count lives in the job
table: one item per tenant, ``job_id`` ``waits#<sha256(tenant)>`` (no ``tenant`` or ``status``
attribute, so it stays out of the table's indexes), holding ``slots``: a map
``{slot id: lease end}`` (N, epoch seconds), and ``ttl`` (N). A wait takes a slot with one
conditional ``UpdateItem`` (``size(slots) < bound``) and gives it back with another (``REMOVE``)
when it is done. Each slot is a **lease**: it ends ``wait + SLOT_MARGIN_SECONDS`` after it was
taken, so a Lambda killed mid-wait (a timeout, a crash) holds its slot for at most that long: a
request that meets a full map drops the lapsed slots (a conditional ``REMOVE`` on their values,
so a slot renewed meanwhile is kept) and tries again. The item's ``ttl`` is past its last lease,
so the item of a tenant who stopped waiting goes away.

Costs per wait: one write to take the slot and one to give it back (a refused wait: one write
and one consistent read). DynamoDB's per-item throughput (1000 WCU/s) bounds a tenant's waits
per second at about 500, far past what any bound here lets run at once.
"""

from __future__ import annotations

import hashlib
import logging
import math
import secrets
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from botocore.exceptions import ClientError

from asyncinfer.core.errors import RateLimited

log = logging.getLogger("asyncinfer.jobs.waits")

#: Seconds a wait's slot outlives the wait itself: the rest of the request (the read, the
#: response) and the clock skew between Lambdas. A slot whose Lambda died is free after
#: ``wait`` + this.
SLOT_MARGIN_SECONDS = 10
#: Extra seconds the tenant's item lives past its newest slot's lease (DynamoDB TTL deletes
#: within days anyway; the lease, not the TTL, frees a slot).
ITEM_TTL_MARGIN_SECONDS = 3600
#: Most lapsed slots one round drops (one UpdateItem; far inside DynamoDB's expression limits).
MAX_DROPS = 50
#: Rounds of "full: drop lapsed slots, try again" before a wait is refused.
MAX_ROUNDS = 3


def _conditional_failure(exc: ClientError) -> bool:
    return exc.response.get("Error", {}).get("Code") == "ConditionalCheckFailedException"


class WaitSlots:
    """Each tenant's concurrent long polls, at most ``bound`` at a time (``bound`` <= 0: no
    bound, and no table traffic).

    Args:
        ddb: a boto3 DynamoDB client.
        table: the job table's name.
        bound: most concurrent waits per tenant (``ASYNCINFER_MAX_WAITS_PER_TENANT``).
    """

    def __init__(self, ddb: Any, table: str, bound: int) -> None:
        self.ddb = ddb
        self.table = table
        self.bound = bound

    @staticmethod
    def item_id(tenant: str) -> str:
        """The ``job_id`` of the tenant's slot item."""
        return "waits#" + hashlib.sha256(tenant.encode("utf-8", "surrogatepass")).hexdigest()

    @contextmanager
    def held(self, tenant: str, wait: float) -> Iterator[None]:
        """Hold one of ``tenant``'s slots while the body runs a wait of ``wait`` seconds.

        Raises:
            RateLimited: the tenant already has ``bound`` waits in progress (429, with a
                ``Retry-After`` of about one wait).
        """
        if self.bound <= 0 or wait <= 0:
            yield
            return
        slot = self.acquire(tenant, wait)
        try:
            yield
        finally:
            self.release(tenant, slot)

    def acquire(self, tenant: str, wait: float) -> str:
        """Take a slot for a wait of ``wait`` seconds; returns its id (for :meth:`release`).

        Raises:
            RateLimited: every slot is held by a live lease.
        """
        slot = secrets.token_hex(8)
        key = {"job_id": {"S": self.item_id(tenant)}}
        for _ in range(MAX_ROUNDS):
            now = int(time.time())
            until = now + math.ceil(wait) + SLOT_MARGIN_SECONDS
            ttl = until + ITEM_TTL_MARGIN_SECONDS
            try:
                self.ddb.update_item(
                    TableName=self.table,
                    Key=key,
                    UpdateExpression="SET slots.#s = :until, #ttl = :ttl",
                    ConditionExpression="attribute_exists(slots) AND size(slots) < :bound",
                    ExpressionAttributeNames={"#s": slot, "#ttl": "ttl"},
                    ExpressionAttributeValues={
                        ":until": {"N": str(until)},
                        ":ttl": {"N": str(ttl)},
                        ":bound": {"N": str(self.bound)},
                    },
                )
                return slot
            except ClientError as exc:
                if not _conditional_failure(exc):
                    raise
            item = self.ddb.get_item(TableName=self.table, Key=key, ConsistentRead=True).get("Item")
            slots = (item or {}).get("slots", {}).get("M")
            if slots is None:  # the tenant's first wait (or the item expired): make the map
                if self._create(key, slot, until, ttl):
                    return slot
                continue
            lapsed = {k: v["N"] for k, v in slots.items() if int(v["N"]) < now}
            lapsed = dict(list(lapsed.items())[:MAX_DROPS])
            if not lapsed:
                break
            self._drop(key, lapsed)
        raise RateLimited(
            f"too many concurrent waits for this API key (at most {self.bound}); "
            "retry later or poll without ?wait",
            [{"field": "wait", "message": f"at most {self.bound} concurrent waits per API key"}],
            retry_after=max(1, math.ceil(wait)),
        )

    def release(self, tenant: str, slot: str) -> None:
        """Give back ``slot`` (never raises: a slot not given back ends with its lease)."""
        try:
            self.ddb.update_item(
                TableName=self.table,
                Key={"job_id": {"S": self.item_id(tenant)}},
                UpdateExpression="REMOVE slots.#s",
                ConditionExpression="attribute_exists(slots.#s)",
                ExpressionAttributeNames={"#s": slot},
            )
        except ClientError as exc:
            if not _conditional_failure(exc):
                log.warning("could not give back a wait slot of %s: %s", tenant, exc)
        except Exception:
            log.exception("could not give back a wait slot")

    def _create(self, key: dict[str, Any], slot: str, until: int, ttl: int) -> bool:
        try:
            self.ddb.put_item(
                TableName=self.table,
                Item={
                    **key,
                    "slots": {"M": {slot: {"N": str(until)}}},
                    "ttl": {"N": str(ttl)},
                },
                ConditionExpression="attribute_not_exists(slots)",
            )
            return True
        except ClientError as exc:
            if not _conditional_failure(exc):
                raise
            return False

    def _drop(self, key: dict[str, Any], lapsed: dict[str, str]) -> None:
        """Remove the ``lapsed`` slots (``{slot id: lease end}``) unless one changed."""
        names = {f"#l{n}": k for n, k in enumerate(lapsed)}
        values = {f":l{n}": {"N": v} for n, v in enumerate(lapsed.values())}
        try:
            self.ddb.update_item(
                TableName=self.table,
                Key=key,
                UpdateExpression="REMOVE " + ", ".join(f"slots.{n}" for n in names),
                ConditionExpression=" AND ".join(
                    f"slots.#l{n} = :l{n}" for n in range(len(lapsed))
                ),
                ExpressionAttributeNames=names,
                ExpressionAttributeValues=values,
            )
        except ClientError as exc:
            if not _conditional_failure(exc):
                raise
