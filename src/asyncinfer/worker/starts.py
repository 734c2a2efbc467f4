"""Starting jobs, and recovering the jobs of lost workers.

For each message taken (steps 1-3 of :mod:`asyncinfer.worker.runner`): parse it (a job whose
TTL passed while queued for its first attempt becomes ``expired``); ``queued -> running``
(attempts + 1; the store adds the job's lease), in one TransactWriteItems call with the pending
terminal writes where the message carries the whole record, else alone with UpdateItem; a job
found ``running`` is recovered by its lease. The lone start and the recovery of lost attempts
are :mod:`asyncinfer.worker.recovery` (:class:`~asyncinfer.worker.recovery.Recovery`, which
:class:`Starter` mixes in; its names are exported here too). Then read and validate the input.

The start transition is built in one place, :func:`start_transition`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any, cast

from pydantic import ValidationError

from asyncinfer.aws.payloads import PayloadStore
from asyncinfer.core import lifecycle
from asyncinfer.core.errors import InvalidInput, JobError, TransitionRefused
from asyncinfer.core.timeutil import iso, now, parse
from asyncinfer.jobs.events import EventPublisher
from asyncinfer.jobs.messages import JobMessage
from asyncinfer.jobs.record import JobRecord
from asyncinfer.jobs.store import JobStore, Transition
from asyncinfer.models.base import WorkItem
from asyncinfer.models.registry import ModelSpec
from asyncinfer.worker.held import HeldMessages
from asyncinfer.worker.inflight import Held
from asyncinfer.worker.journal import Journal
from asyncinfer.worker.outcomes import quiet_webhook
from asyncinfer.worker.recovery import (
    DELETE,
    MAX_VISIBILITY_SECONDS,
    RELEASE_MARGIN_SECONDS,
    REPUBLISHED,
    Leave,
    Recovery,
    start_transition,
)

log = logging.getLogger("asyncinfer.worker")

__all__ = [
    "DELETE",
    "MAX_VISIBILITY_SECONDS",
    "RELEASE_MARGIN_SECONDS",
    "REPUBLISHED",
    "Leave",
    "Recovery",
    "Started",
    "Starter",
    "queued_record",
    "start_transition",
]


@dataclass
class Started:
    """A job this worker started: its message, its running record and its work item (``None``
    with ``error`` set when its input was refused: the job is to be concluded with it)."""

    held: Held
    record: JobRecord
    item: WorkItem | None = None
    error: JobError | None = None


class Starter(Recovery):
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
