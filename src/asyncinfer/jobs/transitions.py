"""Job transitions: THE module that writes a job's status.

Every status change is :meth:`TransitionWriter.transition`: an UpdateItem whose condition is the
current status (``#status``: ``status`` is a DynamoDB reserved word) and, where given, the
attempt number. A late or duplicate update therefore fails with
:class:`~asyncinfer.core.errors.TransitionRefused` carrying the record as it now is
(``ReturnValuesOnConditionCheckFailure=ALL_OLD``). The batched writes
(:mod:`asyncinfer.jobs.transact`) send these same conditional updates of several jobs in
TransactWriteItems calls, each item refused or applied as it would be alone. Every transition
adds its event to the record's outbox in the same write (:mod:`asyncinfer.jobs.outbox`).
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any

from botocore.exceptions import ClientError

from asyncinfer.core import lifecycle
from asyncinfer.core.errors import JobCancelled, JobExpired, MaxAttempts, TransitionRefused
from asyncinfer.core.settings import Settings
from asyncinfer.core.timeutil import iso, now
from asyncinfer.jobs.record import (
    LEASE_FIELD,
    OUTBOX_FIELD,
    OUTBOX_MARK,
    OUTBOX_MARK_FIELD,
    OUTBOX_SINCE_FIELD,
    REQUEUED_MARK,
    RUNNING_MARK,
    _deser,
    _from_ddb,
    _ser,
    _to_ddb,
    event_key,
    from_item,
)


class TransitionWriter:
    """The conditional writes of job records (the base of :class:`~asyncinfer.jobs.store.JobStore`,
    which gives it ``settings``, ``table`` and ``ddb``)."""

    settings: Settings
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
        it starts an attempt (``-> running``) and sets none of its own; a hand-back
        (:func:`requeue`, which marks the job ``requeued``) with its requeue deadline
        (:meth:`requeue_deadline`) in the same attribute; else ``t``."""
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

    def expire(self, job_id: str) -> dict[str, Any] | None:
        """``queued -> expired`` (error ``expired``) for a job whose TTL passed in the queue
        before its first attempt (conditional on ``attempts`` 0: ``expired`` is only for jobs
        that never started; one handed back after it started is retried or failed by the normal
        rules). Returns the expired record, or ``None`` when the job was no longer queued for
        its first attempt (it started, was cancelled or already expired: nothing to do). The
        caller publishes the event."""
        try:
            return self.apply(expire(job_id))
        except TransitionRefused:
            return None

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
    #: Attributes that must hold these values for the write to apply (the DLQ handler fails a
    #: running job only for the message its attempt started from: ``message_id``).
    expect: tuple[tuple[str, Any], ...] = ()
    #: The key of this transition's event in the record's outbox (:mod:`asyncinfer.jobs.outbox`):
    #: the write adds it, the publisher removes it once the event is out, and the sweeper
    #: republishes it if it is still there after ``Settings.outbox_grace_seconds``. Made anew
    #: for each transition (:func:`~asyncinfer.jobs.record.event_key`) unless given.
    event: str = ""
    #: Whether the event goes into the outbox (default). The worker's terminal writes do not:
    #: their message is kept until the event is out, and a redelivery publishes it again.
    outboxed: bool = True
    #: Outbox keys this write removes (events its writer published since: the worker's
    #: ``job.started``, cleared by the terminal write of the same attempt at no extra request).
    #: Only with ``outboxed`` False (one write cannot both add to and delete from the set).
    clears: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not self.event:
            after = None
            if self.attempts is not None:
                after = self.attempts + int(self.increment_attempts)
            object.__setattr__(self, "event", event_key(self.to_status, after))
        if self.clears and self.outboxed:
            raise ValueError("a transition that adds to the outbox cannot clear it")

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
            for k in ("running_mark", LEASE_FIELD):
                if k not in self.set_fields:
                    new.pop(k, None)
        if self.outboxed:
            new[OUTBOX_FIELD] = sorted({*(new.get(OUTBOX_FIELD) or ()), self.event})
        elif self.clears:
            left = sorted(set(new.get(OUTBOX_FIELD) or ()) - set(self.clears))
            if left:
                new[OUTBOX_FIELD] = left
            else:
                new.pop(OUTBOX_FIELD, None)
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
    for n, (k, v) in enumerate(t.expect):
        names[f"#x{n}"] = k
        values[f":x{n}"] = _ser.serialize(_to_ddb(v))
        conds.append(f"#x{n} = :x{n}")
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
    # The event goes into the record's outbox in the same write (asyncinfer.jobs.outbox).
    removes = [k for k in removes if k not in (OUTBOX_FIELD, OUTBOX_MARK_FIELD, OUTBOX_SINCE_FIELD)]
    if t.outboxed:
        names.update({"#ob": OUTBOX_FIELD, "#obm": OUTBOX_MARK_FIELD, "#obs": OUTBOX_SINCE_FIELD})
        values.update(
            {
                ":ob": {"SS": [t.event]},
                ":obm": {"S": OUTBOX_MARK},
                ":obs": {"N": str(int(time.time()))},
            }
        )
        sets += ["#obm = :obm", "#obs = if_not_exists(#obs, :obs)"]
    expr = "SET " + ", ".join(sets)
    if removes:
        for n, k in enumerate(removes):
            names[f"#r{n}"] = k
        expr += " REMOVE " + ", ".join(f"#r{n}" for n in range(len(removes)))
    if t.outboxed:
        expr += " ADD #ob :ob"
    elif t.clears:
        names["#ob"] = OUTBOX_FIELD
        values[":clr"] = {"SS": sorted(set(t.clears))}
        expr += " DELETE #ob :clr"
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


# --------------------------------------------------------------------------- the named transitions
#: What a start removes: a lost attempt's leftovers.
START_REMOVES = ("completed_at", "progress_tokens", "output", "inference_id")
#: What handing a running job back to the queue removes (a worker's requeue, a takeover).
LOST_ATTEMPT_REMOVES = ("started_at", "progress_tokens", "output", "inference_id")


def start(
    job_id: str,
    *,
    attempts: int | None,
    started_at: str,
    message_id: str | None = None,
    set_fields: dict[str, Any] | None = None,
) -> Transition:
    """``queued -> running`` with attempts + 1, ``started_at`` (RFC 3339) and the ``message_id``
    of the SQS message the attempt starts from (the DLQ handler's tie of a message to its
    attempt); ``attempts``: the condition on the queued record's count (``None``: any). The one
    start of every path (a worker's batched or lone start, the SageMaker bridge); its lease is
    added by the writer (:meth:`TransitionWriter.leased`)."""
    fields: dict[str, Any] = {"started_at": started_at, **(set_fields or {})}
    if message_id:
        fields["message_id"] = message_id
    return Transition(
        job_id,
        from_status=lifecycle.QUEUED,
        to_status=lifecycle.RUNNING,
        attempts=attempts,
        increment_attempts=True,
        set_fields=fields,
        remove_fields=START_REMOVES,
    )


def requeue(job_id: str, attempts: int, *, lease_lapsed_before: int | None = None) -> Transition:
    """``running -> queued`` at ``attempts`` (the next start is attempt + 1), without the lost
    attempt's leftovers; with ``lease_lapsed_before`` (epoch seconds) only if the lease lapsed.
    The job stays in the running-lease index under the mark ``requeued`` with a requeue deadline
    (:meth:`TransitionWriter.requeue_deadline`, set by the writer), so that a hand-back whose
    message is lost is found (:mod:`asyncinfer.jobs.record`)."""
    return Transition(
        job_id,
        from_status=lifecycle.RUNNING,
        to_status=lifecycle.QUEUED,
        attempts=attempts,
        set_fields={"running_mark": REQUEUED_MARK},
        remove_fields=(*LOST_ATTEMPT_REMOVES, "message_id"),
        lease_lapsed_before=lease_lapsed_before,
    )


def expire(job_id: str) -> Transition:
    """``queued -> expired`` at attempt 0 (:class:`~asyncinfer.core.errors.JobExpired`): only a job
    that never started expires."""
    return Transition(
        job_id,
        from_status=lifecycle.QUEUED,
        to_status=lifecycle.EXPIRED,
        attempts=0,
        set_fields={
            "completed_at": iso(now()),
            "error": JobExpired("job expired in the queue (ttl)").as_dict(),
        },
    )


def cancel_queued(job_id: str) -> Transition:
    """``queued -> cancelled`` by the client (:class:`~asyncinfer.core.errors.JobCancelled`)."""
    return Transition(
        job_id,
        from_status=lifecycle.QUEUED,
        to_status=lifecycle.CANCELLED,
        set_fields={
            "completed_at": iso(now()),
            "error": JobCancelled("cancelled by the client").as_dict(),
        },
    )


def dead_letter(
    job_id: str,
    *,
    receive_count: int | None,
    running_attempt: int | None = None,
    message_id: str | None = None,
) -> Transition:
    """``-> failed`` with :class:`~asyncinfer.core.errors.MaxAttempts` for a job whose message
    reached the dead-letter queue: from ``queued`` (``running_attempt`` None), or from
    ``running`` at ``running_attempt`` and only while that attempt is the one the message
    started (``message_id``; without one, any)."""
    receives = f" ({receive_count} receives)" if receive_count else ""
    expect = (("message_id", message_id),) if message_id else ()
    return Transition(
        job_id,
        from_status=lifecycle.QUEUED if running_attempt is None else lifecycle.RUNNING,
        to_status=lifecycle.FAILED,
        attempts=running_attempt,
        # A lost attempt's partial output and progress are not the job's result.
        remove_fields=("output", "progress_tokens"),
        set_fields={
            "completed_at": iso(now()),
            "error": MaxAttempts(f"the job failed on every attempt{receives}").as_dict(),
        },
        expect=expect,
    )


def takeover(record: dict[str, Any], now_epoch: int, max_attempts: int) -> Transition:
    """The lease takeover: the transition that takes back ``record`` (a running job whose lease
    lapsed before ``now_epoch``, epoch seconds): to ``cancelled``, ``failed``
    (:class:`~asyncinfer.core.errors.MaxAttempts` once ``attempts`` reached ``max_attempts``) or
    ``queued`` (the rules of :mod:`asyncinfer.jobs.leases`). Pure: the caller applies it."""
    attempts = int(record.get("attempts") or 0)
    lapsed = now_epoch if record.get(LEASE_FIELD) is not None else None
    common: dict[str, Any] = {
        "from_status": lifecycle.RUNNING,
        "attempts": attempts,
        "lease_lapsed_before": lapsed,
    }
    if record.get("cancel_requested"):
        return Transition(
            record["job_id"],
            to_status=lifecycle.CANCELLED,
            set_fields={
                "completed_at": iso(now()),
                "error": JobCancelled("cancelled by the client; its worker was lost").as_dict(),
            },
            remove_fields=("output",),
            **common,
        )
    if attempts >= max_attempts:
        return Transition(
            record["job_id"],
            to_status=lifecycle.FAILED,
            set_fields={
                "completed_at": iso(now()),
                "error": MaxAttempts(
                    f"the job's worker was lost on every attempt ({attempts})"
                ).as_dict(),
            },
            remove_fields=("output", "progress_tokens"),
            **common,
        )
    return requeue(record["job_id"], attempts, lease_lapsed_before=lapsed)


def fail_lost_hand_back(record: dict[str, Any], now_epoch: int, reason: str) -> Transition:
    """``queued -> failed`` with :class:`~asyncinfer.core.errors.MaxAttempts` for a job handed
    back after it started whose requeue deadline passed before ``now_epoch`` (epoch seconds)
    with its message presumed lost, when no message is to be sent again (``reason``: why, in the
    error message). Conditional on the job still queued at its attempt, still marked
    ``requeued`` and its deadline still past (a start or another hand-back meanwhile wins)."""
    attempts = int(record.get("attempts") or 0)
    return Transition(
        record["job_id"],
        from_status=lifecycle.QUEUED,
        to_status=lifecycle.FAILED,
        attempts=attempts,
        remove_fields=("output", "progress_tokens"),
        set_fields={
            "completed_at": iso(now()),
            "error": MaxAttempts(
                f"the job was handed back after attempt {attempts} and {reason}"
            ).as_dict(),
        },
        lease_lapsed_before=now_epoch,
        expect=(("running_mark", REQUEUED_MARK),),
    )
