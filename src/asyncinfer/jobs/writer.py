"""The writer of job transitions: :class:`TransitionWriter`, the base of
:class:`~asyncinfer.jobs.store.JobStore` (through :class:`~asyncinfer.jobs.transact.BatchWriter`).

Every status change is :meth:`TransitionWriter.apply` of a
:class:`~asyncinfer.jobs.update.Transition` (the named ones are built by
:mod:`asyncinfer.jobs.transitions`): one conditional UpdateItem
(``ReturnValues=ALL_NEW``), refused with :class:`~asyncinfer.core.errors.TransitionRefused`
carrying the record as it now is (``ReturnValuesOnConditionCheckFailure=ALL_OLD``) when the job is
not in the status (or attempt) the write expects, so a late or duplicate update changes nothing.
A start (``-> running``) takes a lease. The other writes here change no status: the webhook
dispatcher's delivery attempts and the fields of a job still in a given status (progress, cancel
requests, leases).
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Iterable
from dataclasses import replace
from typing import Any

from botocore.exceptions import ClientError

from asyncinfer.core import lifecycle
from asyncinfer.core.settings_needs import StoreConfig
from asyncinfer.jobs.record import (
    LEASE_FIELD,
    REQUEUED_MARK,
    JobRecord,
    _ser,
    _to_ddb,
    record_from_item,
)
from asyncinfer.jobs.update import Transition, _refused, _update_params


class TransitionWriter:
    """The conditional writes of job records (the base of :class:`~asyncinfer.jobs.store.JobStore`,
    which gives it ``settings``, ``table`` and ``ddb``)."""

    settings: StoreConfig
    table: str
    ddb: Any

    def lease_until(self, seconds: float | None = None) -> int:
        """The lease expiry (epoch seconds) of a lease taken or renewed now: ``seconds`` from now
        (default ``Settings.lease_interval``), rounded up."""
        length = self.settings.lease_interval if seconds is None else seconds
        return int(time.time()) + max(1, math.ceil(length))

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
    ) -> JobRecord:
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
        it starts an attempt (``-> running``) and sets none of its own; a hand-back
        (:func:`~asyncinfer.jobs.transitions.requeue`, which marks the job ``requeued``) with its
        requeue deadline (:meth:`requeue_deadline`) in the same attribute; else ``t``."""
        if LEASE_FIELD in t.set_fields:
            return t
        if t.to_status == lifecycle.RUNNING:
            return replace(t, set_fields={**t.set_fields, LEASE_FIELD: self.lease_until()})
        if t.set_fields.get("running_mark") == REQUEUED_MARK:
            return replace(t, set_fields={**t.set_fields, LEASE_FIELD: self.requeue_deadline()})
        return t

    def requeue_deadline(self) -> int:
        """The requeue deadline (epoch seconds) of a job handed back now: past it, a job still
        queued at that attempt may have lost its message (the sweeper's safety net,
        :func:`asyncinfer.functions.sweeper.resend_lost`). Two visibility timeouts, a lease and
        the longest retry delay (:data:`REQUEUE_GRACE_EXTRA_SECONDS`) from now: longer than any
        way back of its message through SQS (a dead worker's message comes back at most one
        visibility timeout after its last heartbeat)."""
        grace = (
            2 * self.settings.visibility_timeout_seconds
            + self.settings.lease_interval
            + REQUEUE_GRACE_EXTRA_SECONDS
        )
        return int(time.time()) + max(1, math.ceil(grace))

    def apply(self, t: Transition) -> JobRecord:
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
            raise _refused(t, record_from_item(old) if old else None) from None
        return record_from_item(resp["Attributes"])

    def record_delivery(
        self, job_id: str, expression: str, names: dict[str, str], values: dict[str, Any]
    ) -> bool:
        """The webhook dispatcher's write of a delivery attempt (``webhook_*`` attributes; never
        the status): the UpdateItem ``expression`` with its ``names`` and ``values``, on a job
        that exists. Returns False when the record is gone (DynamoDB TTL); raises AWS faults."""
        try:
            self._update_item(
                TableName=self.table,
                Key={"job_id": {"S": job_id}},
                UpdateExpression=expression,
                ConditionExpression="attribute_exists(job_id)",
                ExpressionAttributeNames=names,
                ExpressionAttributeValues=values,
            )
        except ClientError as exc:
            if exc.response["Error"]["Code"] != "ConditionalCheckFailedException":
                raise
            return False
        return True

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


#: Added to a hand-back's requeue grace: the longest delay a worker gives a handed-back message
#: (``asyncinfer.worker.outcomes.MAX_RETRY_DELAY_SECONDS``), seconds.
REQUEUE_GRACE_EXTRA_SECONDS = 300


#: More tries of a conditional UpdateItem that met a transaction on its item (see
#: :meth:`JobStore._update_item`).
CONFLICT_RETRIES = 4
