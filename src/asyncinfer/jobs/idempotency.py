"""Idempotency keys of ``POST /v1/jobs`` (spec: the same key and body return the original job for
24 h; another body is 409).

One item per ``(tenant, key)`` in the job table: ``job_id`` ``idem#<sha256(tenant, key)>``, no
``tenant`` attribute (so it stays out of the tenant index), ``target`` (the job id it names),
``body_hash``, ``valid_until`` (N, epoch seconds: 24 h), ``ttl`` (N) and, until the submit that
claimed it has finished, ``lease_until`` (N, epoch seconds).

A claim is a **lease**, not a 24-hour lock: the submit that claims a key holds it for
``submit_lease_seconds`` (a few times the API Lambda's 29 s timeout), then marks it done
(:meth:`IdempotencyKeys.complete`: ``lease_until`` removed) once the job's record and message
are both written. A submit that fails part way gives the key back at once
(:meth:`IdempotencyKeys.release`); one that never comes back (a Lambda timeout or crash) loses
it when the lease runs out, and the next request with the key takes it over. A done claim
returns its job for 24 h. Like Stripe's keys, a request that meets a claim still in progress
waits briefly for it and then gets 409 ``conflict`` ("still being processed"), never a second job.
"""

from __future__ import annotations

import hashlib
import json
import time
from typing import Any

from botocore.exceptions import ClientError

from asyncinfer.core.errors import Conflict, InvalidRequest
from asyncinfer.jobs.record import JobRecord
from asyncinfer.jobs.store import JobStore

#: How long a done idempotency key maps to its job (spec: 24 h), seconds.
IDEMPOTENCY_SECONDS = 24 * 3600
#: How long a request that meets a claim in progress waits for it to finish, seconds.
WAIT_FOR_CLAIM_SECONDS = 5.0
#: Reads of a contended claim before giving up with 409 (each round waits 0.1 s at most).
MAX_ROUNDS = 100
#: Longest key (spec: 1..255 characters).
MAX_KEY_CHARS = 255


def body_hash(body: dict[str, Any]) -> str:
    """The hash a key is compared by: SHA-256 of the request as parsed JSON with sorted keys
    (spec: "compared as parsed JSON, not raw bytes")."""
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


def _conflict_body() -> Conflict:
    return Conflict(
        "Idempotency-Key was already used with a different request body",
        [{"field": "Idempotency-Key", "message": "reused with another body"}],
    )


class IdempotencyKeys:
    """Claims of idempotency keys in ``store``'s table; ``lease_seconds`` as the module says."""

    def __init__(self, store: JobStore, lease_seconds: int) -> None:
        self.store = store
        self.ddb = store.ddb
        self.table = store.table
        self.lease_seconds = lease_seconds

    @staticmethod
    def item_id(tenant: str, key: str) -> str:
        """The item's ``job_id``: the key never appears in the table as it was sent."""
        return "idem#" + hashlib.sha256(f"{tenant}\0{key}".encode()).hexdigest()

    def claim(self, tenant: str, key: str, digest: str, job_id: str) -> JobRecord | None:
        """Claim ``key`` for a new job ``job_id``. ``None`` when the caller now holds it (and
        must :meth:`complete` or :meth:`release` it); else the record of the job an earlier
        request with the same body made.

        Raises:
            InvalidRequest: (field ``Idempotency-Key``) not 1..255 characters.
            Conflict: the key is held or done for another body, or still held by a request in
                progress after :data:`WAIT_FOR_CLAIM_SECONDS`.
        """
        if not 1 <= len(key) <= MAX_KEY_CHARS:
            raise InvalidRequest(
                "Idempotency-Key must be 1..255 characters",
                [{"field": "Idempotency-Key", "message": "1..255 characters"}],
            )
        item_id = self.item_id(tenant, key)
        deadline = time.monotonic() + WAIT_FOR_CLAIM_SECONDS
        for _ in range(MAX_ROUNDS):
            t = int(time.time())
            # A new key, or one whose 24 h are over.
            if self._put(
                item_id,
                job_id,
                digest,
                t,
                "attribute_not_exists(job_id) OR valid_until < :t",
                {":t": {"N": str(t)}},
            ):
                return None
            item = self.ddb.get_item(
                TableName=self.table, Key={"job_id": {"S": item_id}}, ConsistentRead=True
            ).get("Item")
            if item is None:  # expired and deleted in between: claim again
                continue
            target = item["target"]["S"]
            same = item["body_hash"]["S"] == digest
            record = self.store.get(target)
            done = "lease_until" not in item or (
                record is not None and "submitting_until" not in record
            )
            if done and record is not None:
                if not same:
                    raise _conflict_body()
                return record
            lease_until = int(item["lease_until"]["N"]) if "lease_until" in item else 0
            if not done and lease_until >= t:
                if not same:
                    raise _conflict_body()
                if time.monotonic() >= deadline:
                    raise Conflict(
                        "a request with this Idempotency-Key is still being processed; retry",
                        [
                            {
                                "field": "Idempotency-Key",
                                "message": "in use by a request still in progress",
                                "type": "in_progress",
                            }
                        ],
                    )
                time.sleep(0.1)
                continue
            # The claim's submit never finished (its lease ran out), or its job is gone: take
            # the key over, unless another request took it first.
            cond = "target = :old"
            values = {":old": {"S": target}}
            if self._put(item_id, job_id, digest, t, cond, values):
                return None
        raise Conflict("this Idempotency-Key keeps changing hands; retry")

    def _put(
        self, item_id: str, job_id: str, digest: str, t: int, cond: str, values: dict[str, Any]
    ) -> bool:
        try:
            self.ddb.put_item(
                TableName=self.table,
                Item={
                    "job_id": {"S": item_id},
                    "target": {"S": job_id},
                    "body_hash": {"S": digest},
                    "valid_until": {"N": str(t + IDEMPOTENCY_SECONDS)},
                    "lease_until": {"N": str(t + self.lease_seconds)},
                    "ttl": {"N": str(t + IDEMPOTENCY_SECONDS)},
                },
                ConditionExpression=cond,
                ExpressionAttributeValues=values,
            )
        except ClientError as exc:
            if exc.response["Error"]["Code"] != "ConditionalCheckFailedException":
                raise
            return False
        return True

    def complete(self, tenant: str, key: str, job_id: str) -> bool:
        """Mark the claim of ``job_id`` done: it returns that job for 24 h. False when the key
        is no longer ``job_id``'s (its lease ran out and another request took it)."""
        try:
            self.ddb.update_item(
                TableName=self.table,
                Key={"job_id": {"S": self.item_id(tenant, key)}},
                UpdateExpression="REMOVE lease_until",
                ConditionExpression="target = :j",
                ExpressionAttributeValues={":j": {"S": job_id}},
            )
        except ClientError as exc:
            if exc.response["Error"]["Code"] != "ConditionalCheckFailedException":
                raise
            return False
        return True

    def release(self, tenant: str, key: str, job_id: str) -> None:
        """Give the key back after a submit of ``job_id`` that failed: the next request with it
        starts afresh. Never raises (the lease runs out anyway)."""
        try:
            self.ddb.delete_item(
                TableName=self.table,
                Key={"job_id": {"S": self.item_id(tenant, key)}},
                ConditionExpression="target = :j",
                ExpressionAttributeValues={":j": {"S": job_id}},
            )
        except Exception:  # best effort: the lease bounds the harm
            return
