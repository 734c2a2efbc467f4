"""The worker's writes to the job table and its events: terminal records waiting to share the
next take's TransactWriteItems call, the buffered job events (published with SNS PublishBatch
before the messages of their jobs are deleted), and requeues.

One lock (the worker's write lock) serialises the main loop's and the watcher's writes, so that
events precede deletions and the two never write the same item at once (DynamoDB cancels a
transaction that meets another one on an item, and refuses a plain write to an item a
transaction is writing).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from asyncinfer import lifecycle
from asyncinfer.errors import TransitionRefused
from asyncinfer.events import EventPublisher
from asyncinfer.store import JobStore, Transition
from asyncinfer.worker.held import HeldMessages
from asyncinfer.worker.inflight import Held

log = logging.getLogger("asyncinfer.worker")


@dataclass
class Finished:
    """A terminal write waiting for the next take's transaction."""

    held: Held
    before: dict[str, Any]  # the running record
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
        on_terminal: Callable[[dict[str, Any]], None] | None = None,
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
        self.events: list[dict[str, Any]] = []

    # ------------------------------------------------------------------ queueing
    def add(self, finished: Finished) -> None:
        """Queue a terminal write for the next take (no lock: the decoding loop does not wait
        for a watcher write here)."""
        if not self.pending:
            self.pending_since = time.monotonic()
        self.pending.append(finished)

    def event(self, record: dict[str, Any]) -> None:
        """Buffer the event of ``record`` (published with the next batch of events)."""
        self.events.append(record)

    def pending_ids(self) -> set[str]:
        """The job ids whose terminal write is pending."""
        return {f.transition.job_id for f in self.pending}

    def pending_age(self) -> float:
        """How long the oldest pending terminal write has waited, seconds (0 with none)."""
        return time.monotonic() - self.pending_since if self.pending else 0.0

    @property
    def idle(self) -> bool:
        """Nothing to write and nothing to publish."""
        return not (self.pending or self.events)

    # ------------------------------------------------------------------ writing
    def write_pending(self, starts: list[Transition]) -> list[Any]:
        """Write the pending terminal records and ``starts`` (called under the lock): the
        batched ones in TransactWriteItems calls, the others alone; queue the events of the
        written ones and their messages' deletion. Returns the outcomes of ``starts``
        (:meth:`~asyncinfer.store.JobStore.transition_many`)."""
        pending, self.pending = self.pending, []
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

    def _finished(self, f: Finished, outcome: Any, new: dict[str, Any] | None = None) -> None:
        """After one terminal write: queue its event and its message's deletion."""
        t = f.transition
        if isinstance(outcome, TransitionRefused):
            if not t.shows_applied(outcome.current):
                log.warning("%s", outcome)
                self.held.delete_later(f.held)
                return
            new = outcome.current  # our own write, answered late
        elif outcome is not None:
            # Not written (an AWS fault): the message comes back after its visibility timeout
            # and the next attempt takes over from the job left running.
            log.error("could not record the result of job %s: %s", t.job_id, outcome)
            self.held.release([f.held], delay=self.visibility_timeout_seconds)
            return
        if new is None:
            new = t.applied_to(f.before)
        log.info("job %s %s", t.job_id, new["status"])
        self.events.append(new)  # published before the message is deleted
        if self.on_terminal is not None:
            self.on_terminal(new)
        self.held.delete_later(f.held)

    def flush(self) -> None:
        """Write the pending terminal records and publish the buffered events."""
        if self.idle:
            return
        with self.lock:
            if self.pending:
                self.write_pending([])
            self.publish()

    def publish(self) -> None:
        """Publish the buffered job events in order (PublishBatch, 10 a call); on a failure,
        one by one, and an event that still fails is logged as lost."""
        if not self.events:
            return
        with self.lock:
            events, self.events = self.events, []
            if not events:
                return
            try:
                self.publisher.publish_many(events)
            except Exception:
                log.exception(
                    "could not publish %d job events; retrying them one by one", len(events)
                )
                for record in events:
                    try:
                        self.publisher.publish(record)
                    except Exception:
                        log.exception("job event lost: %s %s", record["job_id"], record["status"])

    def requeue(self, held: Held, job_id: str, attempts: int, *, delay: float) -> None:
        """``running -> queued`` at this attempt, publish ``job.queued``, then make the message
        visible after ``delay`` seconds."""
        self.flush()  # keep each job's events in order
        try:
            back = self.store.transition(
                job_id,
                from_status=lifecycle.RUNNING,
                to_status=lifecycle.QUEUED,
                attempts=attempts,
                remove_fields=("started_at", "progress_tokens", "output"),
            )
            self.publisher.publish(back)
        except TransitionRefused as exc:
            log.warning("%s", exc)
        self.held.release([held], delay=delay)
