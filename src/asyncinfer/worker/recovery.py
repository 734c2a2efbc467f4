"""The lone start of a job (UpdateItem), and the recovery of the jobs of lost workers.

A start that could not go in the batch's transaction, or that the transaction refused, is
written alone (:meth:`Recovery.mark_running`). A job found ``running`` is recovered by its lease
(:mod:`asyncinfer.jobs.leases`): under a lapsed lease its worker is gone, and the job is taken
back by the sweeper's rules (``running -> queued -> running``, so the lost worker's late writes
are refused); under a live lease its worker is alive: a message other than the one its attempt
started from is a duplicate (deleted), and its own message is released until the lease or the
attempt's timeout runs out. A message whose job may still need it (queued, or running from it) is
never deleted. :class:`~asyncinfer.worker.starts.Starter` has these methods (split from
:mod:`asyncinfer.worker.starts`, which still exports every name).

The start transition is built in one place, :func:`start_transition`.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Literal

from asyncinfer.core import lifecycle
from asyncinfer.core.errors import TransitionRefused
from asyncinfer.core.timeutil import iso, now, parse
from asyncinfer.jobs import leases, transitions
from asyncinfer.jobs.events import EventPublisher
from asyncinfer.jobs.record import LEASE_FIELD, JobRecord, refused_record
from asyncinfer.jobs.store import JobStore, Transition
from asyncinfer.worker.held import HeldMessages
from asyncinfer.worker.inflight import Held
from asyncinfer.worker.journal import Journal

log = logging.getLogger("asyncinfer.worker")

#: Terminal statuses a worker writes, whose event a redelivery publishes again.
REPUBLISHED = (lifecycle.SUCCEEDED, lifecycle.FAILED, lifecycle.CANCELLED)
#: Longest a message can stay hidden (SQS ChangeMessageVisibility: 12 hours), seconds.
MAX_VISIBILITY_SECONDS = 43_200
#: Added to the time a live attempt may still hold its job before its own message, received
#: again, comes back (clock skew, the sweeper's period), seconds.
RELEASE_MARGIN_SECONDS = 5.0


@dataclass(frozen=True)
class Leave:
    """What becomes of a held message whose job did not start: ``delete`` it (the job no longer
    needs it) or ``release`` it, visible again after ``delay`` seconds (the job may need it)."""

    action: Literal["delete", "release"]
    delay: float = 0.0


DELETE = Leave("delete")


def start_transition(
    job_id: str,
    *,
    attempts: int | None,
    started_at: str,
    message_id: str | None = None,
    lease_until: int | None = None,
) -> Transition:
    """``queued -> running`` with attempts + 1, ``started_at`` and the ``message_id`` the attempt
    starts from; ``attempts`` is the condition on the queued record's count (``None``: any). The
    batched and the lone start are this one transition (:func:`asyncinfer.jobs.transitions.start`,
    which the SageMaker bridge uses too). ``lease_until`` (epoch seconds,
    :meth:`JobStore.lease_until`): the lease, which a start written in a transaction must carry
    (:meth:`JobStore.transition_many` adds none; a lone start gets one from the writer)."""
    return transitions.start(
        job_id,
        attempts=attempts,
        started_at=started_at,
        message_id=message_id,
        set_fields={LEASE_FIELD: lease_until} if lease_until is not None else None,
    )


class Recovery:
    """The lone start and the recovery of lost attempts: mixed into
    :class:`~asyncinfer.worker.starts.Starter`, whose attributes these are."""

    store: JobStore
    publisher: EventPublisher
    held: HeldMessages
    journal: Journal
    retry_delay_seconds: float
    max_attempts: int

    def mark_running(
        self,
        job_id: str,
        held: Held,
        *,
        redelivered: bool = False,
        refused: TransitionRefused | None = None,
        started_at: str | None = None,
    ) -> JobRecord | None:
        """``queued -> running`` with UpdateItem; recovers a job whose last worker was lost.
        ``None`` when the job did not start: its message ``held`` is then deleted when the job
        no longer needs it (gone, finished, or running under a live lease from another message:
        a duplicate), after the republished event if any; else released (the job is queued but
        could not be started now, or runs under a live lease from this very message: SQS
        redelivers it, and maxReceiveCount with the DLQ handler ends the job if it never starts).

        ``refused``: a transaction's refusal of this start, to decide from before writing.
        ``started_at``: the start time a transaction of this worker may already have written
        for this job (a call that failed may have committed): a record that shows it is ours.

        A redelivered message whose job a worker already finished means that worker died
        between the terminal write and deleting the message, maybe before publishing the event:
        the terminal event is published again (at least once; webhook receivers dedupe on the
        ``webhook-id``, which is the same for the same job, event and attempt). So is a job
        this worker's kind cancelled while it ran (``job.cancelled``, issue 14)."""
        got = self._mark_running(
            job_id, held, redelivered=redelivered, refused=refused, started_at=started_at
        )
        if isinstance(got, Leave):
            if got.action == "release":
                self.held.release([held], delay=got.delay)
            elif not held.finished:
                self.held.delete_later(held)
            return None
        return got

    def _mark_running(
        self,
        job_id: str,
        held: Held,
        *,
        redelivered: bool,
        refused: TransitionRefused | None,
        started_at: str | None,
    ) -> JobRecord | Leave:
        mine = {started_at} if started_at else set()
        for _ in range(3):
            exc, refused = refused, None
            if exc is None:
                at = iso(now())
                mine.add(at)
                try:
                    return self.store.apply(
                        start_transition(
                            job_id, attempts=None, started_at=at, message_id=held.message_id
                        )
                    )
                except TransitionRefused as e:
                    exc = e
            cur = refused_record(exc)
            if cur is None or lifecycle.is_terminal(cur["status"]):
                log.info("job %s is %s: skipping", job_id, cur and cur["status"])
                if (
                    redelivered
                    and cur is not None
                    and cur["status"] in REPUBLISHED
                    and cur.get("started_at")
                ):
                    held.finished = True  # deleted once the event is out
                    self.journal.event(cur, then_delete=held)
                return DELETE
            if cur["status"] == lifecycle.QUEUED:
                continue  # queued at another attempt than a transaction assumed: write it alone
            if cur["status"] != lifecycle.RUNNING:
                return Leave("release", self.retry_delay_seconds)
            if cur.get("started_at") in mine:
                return cur  # our own write, answered late
            now_epoch = int(time.time())
            lapsed = leases.lease_lapsed(cur, now_epoch)
            if not lapsed and cur.get("message_id"):
                return self._live(cur, held, now_epoch)
            # The message became visible again while the job was running and its lease lapsed:
            # the worker that held it is gone. Take the job back by the sweeper's rules (queued
            # again, so that the lost worker's late writes are refused; or failed / cancelled).
            # A live lease on a record that names no message (a start by an older writer, which
            # recorded none) cannot be tied to this one: the old rule, it is taken back as lost.
            log.warning("job %s: previous attempt %s was lost", job_id, cur.get("attempts"))
            attempts = int(cur.get("attempts") or 0)
            take = (
                leases.takeover(cur, now_epoch, self.max_attempts)
                if lapsed
                else transitions.requeue(job_id, attempts)
            )
            try:
                back = self.store.apply(take)
            except TransitionRefused:
                continue
            try:
                self.publisher.publish(back)
            except Exception:  # it stays in the record's outbox; the sweeper publishes it
                log.exception("%s of %s not published", back["status"], job_id)
            if back["status"] != lifecycle.QUEUED:
                return DELETE  # failed (max_attempts) or cancelled: its message is done
        # Still not started (queued, or a race lost every time): the job needs its message.
        return Leave("release", self.retry_delay_seconds)

    def _live(self, cur: JobRecord, held: Held, now_epoch: int) -> Leave:
        """A job running under a live lease, met by ``held``: its worker is alive. A message
        other than the one its attempt started from (``message_id``) is a duplicate (a re-sent
        or twice-delivered message): deleted. Its own message became visible early (a missed
        heartbeat): released, visible again once the lease or the attempt's timeout
        (``started_at + timeout_seconds``) has run out, when its redelivery finds the job
        finished or its worker gone; never requeued from a live worker."""
        job_id = cur["job_id"]
        running_from = cur.get("message_id")
        if running_from and running_from != held.message_id:
            log.info(
                "job %s runs from message %s: %s is a duplicate",
                job_id,
                running_from,
                held.message_id,
            )
            return DELETE
        until = float(cur.get(LEASE_FIELD) or now_epoch)
        if cur.get("started_at") and cur.get("timeout_seconds"):
            ends = parse(cur["started_at"]).timestamp() + float(cur["timeout_seconds"])
            until = max(until, ends)
        delay = min(
            MAX_VISIBILITY_SECONDS,
            max(self.retry_delay_seconds, until - now_epoch + RELEASE_MARGIN_SECONDS),
        )
        log.info(
            "job %s runs under a live lease: message %s back in %.0f s",
            job_id,
            held.message_id,
            delay,
        )
        return Leave("release", delay)
