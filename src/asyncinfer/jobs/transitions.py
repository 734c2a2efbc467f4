"""Job transitions: the named status changes of the lifecycle, the one place they are built.

:func:`start`, :func:`requeue`, :func:`expire`, :func:`cancel_queued`, :func:`dead_letter` and
:func:`takeover` each return a :class:`~asyncinfer.jobs.update.Transition` (a conditional status
change, pure) that a :class:`~asyncinfer.jobs.writer.TransitionWriter` (the job store) applies in
one conditional UpdateItem, or that :mod:`asyncinfer.jobs.transact` writes with others in
TransactWriteItems calls, each item refused or applied as it would be alone. A late or duplicate
write fails with :class:`~asyncinfer.core.errors.TransitionRefused` carrying the record as it now
is. Every transition adds its event to the record's outbox in the same write
(:mod:`asyncinfer.jobs.outbox`). Their errors come from :mod:`asyncinfer.core.errors`.

This module also re-exports the writer's names (:class:`Transition`, :data:`TransitionOutcome`,
:class:`TransitionWriter`, :data:`CONFLICT_RETRIES` and the UpdateItem builder), which lived here
before the writer had a module of its own.
"""

from __future__ import annotations

from typing import Any

from asyncinfer.core import lifecycle
from asyncinfer.core.errors import JobCancelled, JobExpired, MaxAttempts
from asyncinfer.core.timeutil import iso, now
from asyncinfer.jobs.record import LEASE_FIELD, REQUEUED_MARK, JobRecord
from asyncinfer.jobs.update import (
    Transition,
    TransitionOutcome,
    _refused,
    _update_params,
    _written,
)
from asyncinfer.jobs.writer import CONFLICT_RETRIES, TransitionWriter

__all__ = [
    "CONFLICT_RETRIES",
    "LOST_ATTEMPT_REMOVES",
    "START_REMOVES",
    "Transition",
    "TransitionOutcome",
    "TransitionWriter",
    "_refused",
    "_update_params",
    "_written",
    "cancel_queued",
    "dead_letter",
    "expire",
    "fail_lost_hand_back",
    "requeue",
    "start",
    "takeover",
]

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


def takeover(record: JobRecord, now_epoch: int, max_attempts: int) -> Transition:
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


def fail_lost_hand_back(record: JobRecord, now_epoch: int, reason: str) -> Transition:
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
