"""Finishing a worker's jobs (step 5 of :mod:`asyncinfer.worker.runner`): a handler's result
becomes a requeue now, or a terminal write (the output stored in S3 first when large) that goes
out with the next take's transaction, at once when the job must be written alone or the worker
is stopping; its event follows the write, and its message is deleted after the event.
:class:`~asyncinfer.worker.runner.Worker` has these methods (split from the runner).
"""

from __future__ import annotations

import logging
import threading
from dataclasses import replace

from asyncinfer.aws.payloads import PayloadStore
from asyncinfer.core.settings_parts import WorkerSettings
from asyncinfer.core.timeutil import iso, now
from asyncinfer.jobs.record import JobRecord
from asyncinfer.models.base import Result, WorkItem
from asyncinfer.models.registry import ModelSpec
from asyncinfer.worker import outcomes
from asyncinfer.worker.held import HeldMessages
from asyncinfer.worker.inflight import Held
from asyncinfer.worker.journal import Finished, Journal
from asyncinfer.worker.startup import StartTimes

log = logging.getLogger("asyncinfer.worker")


class Finishing:
    """The end of a job's attempt: mixed into :class:`~asyncinfer.worker.runner.Worker`, whose
    attributes these are."""

    spec: ModelSpec
    settings: WorkerSettings
    held: HeldMessages
    journal: Journal
    payloads: PayloadStore
    start_times: StartTimes
    stop_event: threading.Event
    _running: dict[str, tuple[Held, JobRecord]]

    @property
    def stopping(self) -> bool:
        """True once the worker takes no more work."""
        return self.stop_event.is_set()

    def finish(self, item: WorkItem, result: Result) -> None:
        """Take ``item``'s result. Its terminal write goes out with the next :meth:`take`'s
        transaction (or at once: when the job must be written alone, when the worker is
        stopping); its event follows the write, and its message is deleted after the event."""
        held, record = self._running.pop(item.job_id)
        held.finished = True  # no more heartbeat-time progress writes or cancel reads for it
        if isinstance(result, dict):
            self.start_times.finished(
                item.job_id, started=held.started, first_token_at=item.first_token_at
            )
        self._conclude(held, record, result, compute_seconds=item.compute_seconds)

    def _conclude(
        self, held: Held, record: JobRecord, result: Result, *, compute_seconds: float = 0.0
    ) -> None:
        """Step 5 for one job: requeue it now, or queue its terminal write for the next take
        (at once when it must be written alone or the worker is stopping). ``compute_seconds``:
        the job's share of the handler's compute time (seconds), recorded on a terminal job."""
        try:
            finished = self._terminal(held, record, result, compute_seconds)
        except Exception:
            # The result could not be recorded (an AWS fault): the message comes back after its
            # visibility timeout and the next attempt takes over from the job left running.
            log.exception("could not record the result of job %s", record["job_id"])
            self.held.release([held], delay=self.settings.visibility_timeout_seconds)
            return
        if finished is None:
            return
        self.journal.add(finished)
        if self.stopping:
            self.journal.flush()  # no take follows while the handler drains
        elif finished.alone:
            with self.journal.lock:
                self.journal.write_pending([])  # its event goes out with the next take's

    def _terminal(
        self, held: Held, record: JobRecord, result: Result, compute_seconds: float = 0.0
    ) -> Finished | None:
        """The terminal write of one job's result (the output stored in S3 first when large);
        ``None`` when the job went back to the queue instead."""
        entry = self.spec.entry
        outcome = outcomes.decide(
            result,
            record,
            completed_at=iso(now()),
            retry_delay_seconds=self.settings.retry_delay_seconds,
            reported=held.reported,
            compute_seconds=compute_seconds,
            price_per_hour=entry.compute.price_per_hour if entry is not None else None,
        )
        if isinstance(outcome, outcomes.Requeue):
            if outcome.delay:
                log.warning(
                    "job %s attempt %s: %s (retrying)",
                    outcome.job_id,
                    outcome.attempts,
                    outcome.reason,
                )
            self.journal.requeue(held, outcome.job_id, outcome.attempts, delay=outcome.delay)
            return None
        transition = outcome.transition
        if outcome.upload is not None:
            ref = self.payloads.put_output(record["tenant"], record["job_id"], outcome.upload)
            fields = {**transition.set_fields, "output_ref": ref}
            transition = replace(transition, set_fields=fields)
        return Finished(held, record, transition, outcome.alone)
