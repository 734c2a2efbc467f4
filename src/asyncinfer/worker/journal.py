"""The worker's writes to the job table and its events: terminal records waiting to share the
next take's TransactWriteItems call, the buffered job events (published with SNS PublishBatch
before the messages of their jobs are deleted), and requeues.

One lock (the worker's write lock) serialises the main loop's and the watcher's writes, so that
the two never write the same item at once (DynamoDB cancels a transaction that meets another one
on an item, and refuses a plain write to an item a transaction is writing). Events are published
under a lock of their own, never under the write lock: an SNS outage (each call retried by
botocore for seconds) must not hold up the watcher's lease renewals and visibility extensions,
or the sweeper would take back jobs of live workers (issue 14). A message is queued for deletion
only after its event is out, so events still precede deletions.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from asyncinfer.core import lifecycle
from asyncinfer.core.errors import TransitionRefused
from asyncinfer.jobs import outbox, transitions
from asyncinfer.jobs.events import EventPublisher
from asyncinfer.jobs.record import JobRecord, refused_record
from asyncinfer.jobs.store import JobStore, Transition
from asyncinfer.worker.held import HeldMessages
from asyncinfer.worker.inflight import Held

log = logging.getLogger("asyncinfer.worker")

#: After a failed publish, the buffered events are tried again at most this often, seconds;
#: the pause doubles after each failed try, up to :data:`PUBLISH_RETRY_MAX_SECONDS`.
PUBLISH_RETRY_SECONDS = 1.0
#: The longest pause between two tries of events kept by failed publishes, seconds.
PUBLISH_RETRY_MAX_SECONDS = 30.0
#: Events tried one by one after a failed PublishBatch: after this many failures in a row SNS is
#: taken to be out and the rest are kept untried (bounds a publish to a few calls' retries).
PUBLISH_FAILURES_IN_A_ROW = 2

#: A buffered event: the record, and the message to delete once the event is out (or ``None``).
Entry = tuple[JobRecord, Held | None]


@dataclass
class Finished:
    """A terminal write waiting for the next take's transaction."""

    held: Held
    before: JobRecord  # the running record
    transition: Transition
    alone: bool  # written alone with UpdateItem; its returned record makes the event


class Journal:
    """Pending terminal writes and buffered events of one worker.

    Args:
        store: the job table.
        events: the event publisher (SNS).
        held: the held messages (a written job's message is queued for deletion; one not
            written is released to come back after its visibility timeout).
        lock: the worker's write lock.
        visibility_timeout_seconds: how long a message whose result was not recorded stays
            hidden before it comes back, seconds.
        on_terminal: called with each terminal record written (job metrics).
    """

    def __init__(
        self,
        store: JobStore,
        events: EventPublisher,
        held: HeldMessages,
        *,
        lock: threading.RLock,
        visibility_timeout_seconds: float,
        on_terminal: Callable[[JobRecord], None] | None = None,
    ) -> None:
        self.store = store
        self.publisher = events
        self.held = held
        self.lock = lock
        self.visibility_timeout_seconds = visibility_timeout_seconds
        self.on_terminal = on_terminal
        # Appended to without the lock: taking a list over (``a, self.a = self.a, []``) loses
        # no append.
        self.pending: list[Finished] = []
        self.pending_since = 0.0
        #: Buffered events, each with the message to delete once it is out (or ``None``).
        self.events: list[Entry] = []
        self._retry_after = 0.0  # after a failed publish, no new try before this (monotonic)
        self._retry_pause = PUBLISH_RETRY_SECONDS
        #: Held while events are being published (one publisher at a time keeps each job's events
        #: in order); never taken under :attr:`lock` by this class.
        self._publishing = threading.Lock()
        #: Outbox keys of the ``job.started`` events published, by job id: the job's terminal
        #: write removes them (asyncinfer.jobs.outbox), so a start costs no extra request.
        self.started_out: dict[str, tuple[str, ...]] = {}

    # ------------------------------------------------------------------ queueing
    def add(self, finished: Finished) -> None:
        """Queue a terminal write for the next take (no lock: the decoding loop does not wait
        for a watcher write here)."""
        if not self.pending:
            self.pending_since = time.monotonic()
        self.pending.append(finished)

    def event(self, record: JobRecord, *, then_delete: Held | None = None) -> None:
        """Buffer the event of ``record`` (published with the next batch of events); its
        message ``then_delete`` is queued for deletion only once the event is out."""
        self.events.append((record, then_delete))

    def pending_ids(self) -> set[str]:
        """The job ids whose terminal write is pending."""
        return {f.transition.job_id for f in self.pending}

    def pending_age(self) -> float:
        """How long the oldest pending terminal write has waited, seconds (0 with none)."""
        return time.monotonic() - self.pending_since if self.pending else 0.0

    @property
    def retrying(self) -> bool:
        """Events kept by a failed publish wait for another try."""
        return self._retry_after > 0 and bool(self.events)

    @property
    def idle(self) -> bool:
        """Nothing to write and nothing to publish."""
        return not (self.pending or self.events)

    # ------------------------------------------------------------------ writing
    def write_pending(self, starts: list[Transition]) -> list[Any]:
        """Write the pending terminal records and ``starts`` (called under the lock): the
        batched ones in TransactWriteItems calls, the others alone; queue the events of the
        written ones and their messages' deletion. Returns the outcomes of ``starts``
        (:meth:`~asyncinfer.jobs.store.JobStore.transition_many`)."""
        pending, self.pending = self.pending, []
        for f in pending:
            out = self.started_out.pop(f.transition.job_id, ())
            if out and not f.transition.outboxed:
                f.transition = replace(f.transition, clears=out)
        batched = [f for f in pending if not f.alone]
        for f in pending:
            if f.alone:
                try:
                    new = self.store.apply(f.transition)
                except Exception as exc:  # decided per job below
                    self._finished(f, exc)
                else:
                    self._finished(f, None, new)
        transitions = [f.transition for f in batched] + starts
        if not transitions:
            return []
        try:
            outcomes = self.store.transition_many(transitions)
        except Exception as exc:  # a bug: keep the worker going
            log.exception("could not write %d transitions", len(transitions))
            outcomes = [exc] * len(transitions)
        for f, outcome in zip(batched, outcomes, strict=False):
            self._finished(f, outcome)
        return outcomes[len(batched) :]

    def _not_ours(self, f: Finished, current: JobRecord | None) -> None:
        """What becomes of the message of a job whose terminal write was refused (the record
        moved on without this worker):

        * terminal, or gone: the job needs no message; it is deleted;
        * ``queued`` at this attempt: taken back after this worker's lease lapsed
          (:mod:`asyncinfer.jobs.leases`) and no other attempt started; the next one needs the
          message, released now;
        * anything else (``running`` or ``queued`` under a newer attempt): another worker
          received the message again while this one was stalled (its visibility lapsed too), and
          holds it. This worker's receipt handle is stale, and SQS may delete or show a message
          by any of its receipt handles: it is forgotten, untouched (deleting it lost the job
          for good when the newer attempt's worker was lost in turn).
        """
        status = (current or {}).get("status")
        if current is None or lifecycle.is_terminal(str(status)):
            self.held.delete_later(f.held)
        elif status == lifecycle.QUEUED and int(current.get("attempts") or 0) <= int(
            f.transition.attempts or 0
        ):
            self.held.release([f.held])
        else:
            self.held.forget(f.held)

    def _finished(self, f: Finished, outcome: Any, new: JobRecord | None = None) -> None:
        """After one terminal write: queue its event and its message's deletion."""
        t = f.transition
        if isinstance(outcome, TransitionRefused):
            current = refused_record(outcome)
            if not t.shows_applied(current):
                log.warning("%s", outcome)
                self._not_ours(f, current)
                return
            new = current  # our own write, answered late
        elif outcome is not None:
            # Not written (an AWS fault): the message comes back after its visibility timeout
            # and the next attempt takes over from the job left running.
            log.error("could not record the result of job %s: %s", t.job_id, outcome)
            self.held.release([f.held], delay=self.visibility_timeout_seconds)
            return
        if new is None:
            new = t.applied_to(f.before)
        log.info("job %s %s", t.job_id, new["status"])
        if self.on_terminal is not None:
            self.on_terminal(new)
        self.event(new, then_delete=f.held)  # the message is deleted once the event is out

    def flush(self, *, force: bool = False) -> None:
        """Write the pending terminal records and publish the buffered events (``force``: even
        within the pause after a failed publish; the worker is stopping)."""
        if self.idle:
            return
        if self.pending:
            with self.lock:
                if self.pending:
                    self.write_pending([])
        self.publish(force=force)

    def publish(self, *, force: bool = False) -> None:
        """Publish the buffered job events in order (PublishBatch, 10 a call), then queue the
        deletion of the messages that waited for them (issue 14: an event is never lost to a
        deleted message). On a failure, one by one; an event that still fails stays buffered,
        with every later event of its job, and its message stays held (the heartbeat keeps it
        hidden) until a later try, at most every :data:`PUBLISH_RETRY_SECONDS`, gets it out. A
        worker that dies meanwhile leaves the message to come back: its next delivery finds
        the job terminal and publishes the event again.

        Runs without the write lock (SNS calls can take seconds each while SNS fails). Another
        thread's publish in progress: returns at once (that one takes the events buffered so
        far; later ones wait for the next call), unless ``force`` (the worker is stopping),
        which waits for it."""
        if not self.events or (not force and time.monotonic() < self._retry_after):
            return
        if not self._publishing.acquire(blocking=force):
            return
        try:
            self._publish_buffered()
        finally:
            self._publishing.release()

    def _publish_buffered(self) -> None:
        events, self.events = self.events, []  # no append is lost (see __init__)
        if not events:
            return
        out: list[Entry]
        kept: list[Entry]
        try:
            self.publisher.publish_many([record for record, _ in events])
            out, kept = events, []
        except Exception:
            log.exception("could not publish %d job events; retrying them one by one", len(events))
            out, kept = self._publish_one_by_one(events)
        if kept:
            log.error(
                "%d job events not published; their messages are kept until they are out "
                "(next try in %.0f s)",
                len(kept),
                self._retry_pause,
            )
            self._retry_after = time.monotonic() + self._retry_pause
            self._retry_pause = min(2 * self._retry_pause, PUBLISH_RETRY_MAX_SECONDS)
            self.events[:0] = kept  # ahead of what came meanwhile: each job's order holds
        else:
            self._retry_after = 0.0
            self._retry_pause = PUBLISH_RETRY_SECONDS
        for record, held in out:
            self._published(record)
            if held is not None:
                self.held.delete_later(held)

    def _published(self, record: JobRecord) -> None:
        """After ``record``'s event is out: a ``job.started`` key is left for the job's terminal
        write to clear (the worker's publisher defers those: ``EventPublisher.defer_started``);
        the publisher cleared any other event's keys itself."""
        if record["status"] == lifecycle.RUNNING:
            keys = outbox.pending_keys(record, lifecycle.EVENT_FOR_STATUS[lifecycle.RUNNING])
            if keys:
                self.started_out[record["job_id"]] = tuple(keys)

    def _publish_one_by_one(self, events: list[Entry]) -> tuple[list[Entry], list[Entry]]:
        """Publish ``events`` one at a time: ``(published, kept)``. After a job's event fails,
        its later events are kept too, untried (a job's events go out in order); after
        :data:`PUBLISH_FAILURES_IN_A_ROW` failures in a row, every later event is kept untried
        (SNS is out: trying each one would take botocore's retries per event)."""
        out: list[Entry] = []
        kept: list[Entry] = []
        failed_jobs: set[str] = set()
        in_a_row = 0
        for entry in events:
            record = entry[0]
            if record["job_id"] not in failed_jobs and in_a_row < PUBLISH_FAILURES_IN_A_ROW:
                try:
                    self.publisher.publish(record)
                except Exception:
                    in_a_row += 1
                    log.exception("could not publish %s %s", record["job_id"], record["status"])
                else:
                    in_a_row = 0
                    out.append(entry)
                    continue
            failed_jobs.add(record["job_id"])
            kept.append(entry)
        return out, kept

    def requeue(self, held: Held, job_id: str, attempts: int, *, delay: float) -> None:
        """``running -> queued`` at this attempt, publish ``job.queued``, then make the message
        visible after ``delay`` seconds."""
        self.flush()  # keep each job's events in order
        self.started_out.pop(job_id, None)
        try:
            back = self.store.apply(transitions.requeue(job_id, attempts))
        except TransitionRefused as exc:
            log.warning("%s", exc)
        else:
            try:
                self.publisher.publish(back)
            except Exception:  # it stays in the record's outbox; the sweeper publishes it
                log.exception("job.queued of %s not published", job_id)
        self.held.release([held], delay=delay)
