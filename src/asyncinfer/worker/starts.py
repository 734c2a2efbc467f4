"""Starting jobs, and recovering the jobs of lost workers.

For each message taken (steps 1-3 of :mod:`asyncinfer.worker.runner`): parse it (a job whose
TTL passed while queued for its first attempt becomes ``expired``); ``queued -> running``
(attempts + 1; the store adds the job's lease), in one TransactWriteItems call with the pending
terminal writes where the message carries the whole record, else alone with UpdateItem; a job
found ``running`` is recovered by its lease (:mod:`asyncinfer.jobs.leases`): under a lapsed lease
its worker is gone, and the job is taken back by the sweeper's rules (``running -> queued ->
running``, so the lost worker's late writes are refused); under a live lease its worker is alive:
a message other than the one its attempt started from is a duplicate (deleted), and its own
message is released until the lease or the attempt's timeout runs out. A message whose job may
still need it (queued, or running from it) is never deleted. Then read and validate the input.

The start transition is built in one place, :func:`start_transition`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any, Literal, cast

from pydantic import ValidationError

from asyncinfer.aws.payloads import PayloadStore
from asyncinfer.core import lifecycle
from asyncinfer.core.errors import InvalidInput, JobError, TransitionRefused
from asyncinfer.core.timeutil import iso, now, parse
from asyncinfer.jobs import leases, transitions
from asyncinfer.jobs.events import EventPublisher
from asyncinfer.jobs.messages import JobMessage
from asyncinfer.jobs.record import LEASE_FIELD, JobRecord, refused_record
from asyncinfer.jobs.store import JobStore, Transition
from asyncinfer.models.base import WorkItem
from asyncinfer.models.registry import ModelSpec
from asyncinfer.worker.held import HeldMessages
from asyncinfer.worker.inflight import Held
from asyncinfer.worker.journal import Journal
from asyncinfer.worker.outcomes import quiet_webhook

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


@dataclass
class Started:
    """A job this worker started: its message, its running record and its work item (``None``
    with ``error`` set when its input was refused: the job is to be concluded with it)."""

    held: Held
    record: JobRecord
    item: WorkItem | None = None
    error: JobError | None = None


class Starter:
    """Starts the jobs of taken messages.

    Args:
        spec: the model served (its input schema).
        store, events, payloads: the job table, the event publisher, the payload bucket.
        held: the held messages (deleted or released when their job does not start).
        journal: the pending writes (starts share their transaction) and the event buffer.
        stop_event: set when running jobs must be given back (each item's ``stop_event``).
        retry_delay_seconds: how long a message that could not be started stays hidden.
        max_attempts: the attempts a job gets (``Settings.max_receive_count``): a lost attempt
            past them fails the job with ``max_attempts`` (the sweeper's takeover rules).
    """

    def __init__(
        self,
        spec: ModelSpec,
        *,
        store: JobStore,
        events: EventPublisher,
        payloads: PayloadStore,
        held: HeldMessages,
        journal: Journal,
        stop_event: threading.Event,
        retry_delay_seconds: float,
        max_attempts: int = 3,
    ) -> None:
        self.spec = spec
        self.store = store
        self.publisher = events
        self.payloads = payloads
        self.held = held
        self.journal = journal
        self.stop_event = stop_event
        self.retry_delay_seconds = retry_delay_seconds
        self.max_attempts = max_attempts

    def start_many(self, held: list[Held], running: Collection[str]) -> list[Started]:
        """Start the jobs of ``held`` in one write with the pending terminal writes (even for
        no starts); ``running``: the ids of the jobs this worker runs now. Returns the started
        jobs; the other messages were deleted or released. Their ``job.started`` events are
        published before it returns."""
        batched: list[tuple[Held, JobMessage, Transition]] = []
        alone: list[tuple[Held, JobMessage]] = []
        pending_ids = self.journal.pending_ids()
        for h in held:
            try:
                msg = self._parse(h)
            except Exception:
                log.exception("could not start the job of message %s", h.message_id)
                self.held.release([h], delay=self.retry_delay_seconds)
                continue
            if msg is None:
                continue
            job_id = msg.job_id
            if (
                h.receive_count == 1
                and msg.created_at is not None
                and quiet_webhook(msg.webhook)
                and job_id not in pending_ids
                and job_id not in running
            ):
                pending_ids.add(job_id)
                # Its lease in the transaction's write (before, the starts of a take had none:
                # outside the running-lease index, the sweeper could not take them back, and a
                # duplicate message met them as lapsed and took them from their live worker).
                start = start_transition(
                    job_id,
                    attempts=0,
                    started_at=iso(now()),
                    message_id=h.message_id,
                    lease_until=self.store.lease_until(),
                )
                batched.append((h, msg, start))
            else:
                alone.append((h, msg))

        marked: list[tuple[Held, JobMessage, JobRecord]] = []
        if not (batched or alone or not self.journal.idle):
            return []  # nothing to write: no wait for the watcher's lock in the decoding loop
        with self.journal.lock:
            outcomes = self.journal.write_pending([t for _, _, t in batched])
            retry: list[tuple[Held, JobMessage, Any, str | None]] = [
                (h, msg, None, None) for h, msg in alone
            ]
            for (h, msg, start), outcome in zip(batched, outcomes, strict=True):
                if outcome is None:
                    marked.append((h, msg, start.applied_to(queued_record(msg))))
                else:
                    # Refused, or not written: the start alone decides from the record as it is.
                    retry.append((h, msg, outcome, start.set_fields["started_at"]))
            for h, msg, outcome, started_at in retry:
                try:
                    record = self.mark_running(
                        msg.job_id,
                        h,
                        redelivered=h.receive_count > 1,
                        refused=outcome if isinstance(outcome, TransitionRefused) else None,
                        started_at=started_at,
                    )
                except Exception:
                    log.exception("could not start the job of message %s", h.message_id)
                    self.held.release([h], delay=self.retry_delay_seconds)
                    continue
                if record is not None:
                    marked.append((h, msg, record))
            for h, _, record in marked:
                h.attempts = record["attempts"]
                h.started = time.monotonic()
                self.journal.event(record)  # job.started, published with the batch's others
                log.info("job %s running (attempt %s)", record["job_id"], record["attempts"])

        started: list[Started] = []
        for h, msg, record in marked:
            try:
                started.append(self._work_item(h, msg, record))
            except Exception:
                # A fault on one job (AWS, a malformed record) must not take the worker and the
                # rest of the batch down: give the message back; the next delivery finds the job
                # running and retries it as a lost attempt, and SQS's maxReceiveCount bounds how
                # often it comes back before the DLQ handler fails its job.
                log.exception("could not start the job of message %s", h.message_id)
                self.held.release([h], delay=self.retry_delay_seconds)
        self.journal.publish()
        return started

    def _parse(self, held: Held) -> JobMessage | None:
        """Step 1 for one message: its job message, or ``None`` (it was released or the job
        expired)."""
        try:
            msg = JobMessage.model_validate_json(held.body)
        except ValidationError:
            log.error("malformed message %s: releasing it toward the DLQ", held.message_id)
            self.held.release([held])
            return None
        held.job_id = msg.job_id
        # Only a job that never started expires; one handed back after it started (a lost
        # attempt, a retry) goes on to the start, which decides from its record (leases).
        if parse(msg.expires_at) <= now() and self._expire(msg.job_id):
            self.held.delete_later(held)
            return None
        return msg

    def _work_item(self, held: Held, msg: JobMessage, record: JobRecord) -> Started:
        """Step 3 for one started job: read and validate its input (a refused input comes back
        as the :class:`Started`'s ``error``)."""
        try:
            raw = (
                msg.input if msg.input is not None else self.payloads.read_json(msg.input_ref or "")
            )
            item_input = self.spec.input_model.model_validate(raw)
        except ValidationError as exc:
            err = InvalidInput(f"input is not valid for {self.spec.id}: {exc.errors()[0]['msg']}")
            return Started(held, record, error=err)
        except JobError as exc:
            return Started(held, record, error=exc)

        def on_progress(tokens: int, partial: dict[str, Any]) -> None:
            held.reported = True
            held.progress = (tokens, partial)

        item = WorkItem(
            job_id=msg.job_id,
            input=item_input,
            raw_input=raw if isinstance(raw, dict) else {},
            attempt=record["attempts"],
            deadline=time.monotonic() + msg.timeout_seconds,
            cancel_event=held.cancel_event,
            stop_event=self.stop_event,
            on_progress=on_progress,
        )
        if record.get("cancel_requested"):
            held.cancel_event.set()
        return Started(held, record, item)

    def _expire(self, job_id: str) -> bool:
        """Expire a queued job that never started (:meth:`JobStore.expire`); ``False`` when it
        was not expired (it started before, or it is no longer queued)."""
        record = self.store.expire(job_id)
        if record is not None:
            log.info("job %s expired", job_id)
            self.publisher.publish(record)
        return record is not None

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


def queued_record(msg: JobMessage) -> JobRecord:
    """The record of a job waiting for its first attempt, from its message (which carries every
    attribute the job object shows; :mod:`asyncinfer.jobs.messages`)."""
    record: dict[str, Any] = {
        "job_id": msg.job_id,
        "tenant": msg.tenant,
        "model": msg.model,
        "status": lifecycle.QUEUED,
        "attempts": 0,
        "priority": msg.priority,
        "created_at": msg.created_at,
        "expires_at": msg.expires_at,
        "timeout_seconds": msg.timeout_seconds,
        "metadata": msg.metadata,
        "webhook": msg.webhook,
        "input_ref": msg.input_ref,
    }
    # The attributes the message lacks (None) are absent from the record, as from the item.
    return cast(JobRecord, {k: v for k, v in record.items() if v is not None})
