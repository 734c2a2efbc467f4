"""One job transition as a value: :class:`Transition` (a conditional status change), the
parameters of its UpdateItem (or TransactWriteItems ``Update``), the record it leaves, and its
refusal. Pure: no I/O (:mod:`asyncinfer.jobs.writer` sends it; :mod:`asyncinfer.jobs.transitions`
names the transitions of the lifecycle).

The UpdateItem's condition is the current status (``#status``: ``status`` is a DynamoDB reserved
word) and, where given, the attempt number, a lapsed lease and expected attributes; a write that
fails it is refused with :class:`~asyncinfer.core.errors.TransitionRefused` carrying the record as
it now is. Every transition adds its event to the record's outbox in the same write
(:mod:`asyncinfer.jobs.outbox`), keeps the sparse index marks of :mod:`asyncinfer.jobs.record`
true (``queued_mark`` removed, ``running_mark`` and the lease while ``running``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, cast

from asyncinfer.core import lifecycle
from asyncinfer.core.errors import TransitionRefused
from asyncinfer.jobs.record import (
    LEASE_FIELD,
    OUTBOX_FIELD,
    OUTBOX_MARK,
    OUTBOX_MARK_FIELD,
    OUTBOX_SINCE_FIELD,
    RUNNING_MARK,
    JobRecord,
    _deser,
    _from_ddb,
    _ser,
    _to_ddb,
    event_key,
)


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

    def applied_to(self, record: JobRecord) -> JobRecord:
        """``record`` as this write leaves it: what ``ReturnValues=ALL_NEW`` would give when
        nobody else wrote the item in between."""
        new: dict[str, Any] = dict(record)
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
        return cast(JobRecord, new)  # a JobRecord changed by the write's own attributes

    def shows_applied(self, current: JobRecord | None) -> bool:
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


def _refused(t: Transition, current: JobRecord | None) -> TransitionRefused:
    """The refusal of ``t`` by the record as it is (``None``: no such job)."""
    got = f"{current['status']} (attempts {current.get('attempts')})" if current else "none"
    at = f" at attempt {t.attempts}" if t.attempts is not None else ""
    return TransitionRefused(
        f"{t.job_id}: refused {'/'.join(t.froms)} -> {t.to_status}{at}; it is {got}",
        # The taxonomy's floor holds it as a dict (asyncinfer.jobs.record.refused_record).
        cast("dict[str, Any] | None", current),
    )
