"""The worker loop: long-poll a model's queues, run jobs in batches, keep messages invisible while
they run, finish jobs with conditional writes, and only then delete their messages.

The worker is the :class:`~asyncinfer.models.base.WorkSource` of its model handler: the handler's
``serve`` loop takes started jobs (dynamic batching, or continuous batching where the handler
admits jobs into a running batch) and hands each result back as soon as it has it.

Per job:

1. parse each message; a job whose TTL passed while queued for its first attempt becomes
   ``expired`` (one that started before goes on to step 2: leases, issue 14);
2. ``queued -> running`` (attempts + 1, and the job's lease, which the watcher's heartbeat renews;
   :mod:`asyncinfer.jobs.leases`), a conditional write; a cancelled or finished job is
   skipped, a job found ``running`` (its last worker was lost: the message became visible again)
   goes ``running -> queued -> running`` so the lost worker's late writes are refused;
3. publish ``job.started``; read the input (inline or S3) and validate it;
4. run the model handler on the batch;
5. per job: store the output (S3 above 64 KB), make the job terminal (or back to ``queued`` for a
   retryable error), publish the event;
6. delete the finished messages (DeleteMessageBatch, up to 10 a call). A retryable failure
   instead leaves its message to reappear after a backoff; after maxReceiveCount receives SQS
   moves it to the dead-letter queue, where :mod:`asyncinfer.functions.dlq` fails the job with
   ``max_attempts``.

AWS requests. Each :meth:`Worker.take` writes, in one TransactWriteItems call, the terminal
records of the jobs that finished since the last take and the ``running`` marks of the jobs it
starts, then publishes their events together (SNS PublishBatch, 10 a call): in a continuous
batch, where a finished job's slot goes to the next job at once, that is one write and one
publish for both. Every item of the transaction keeps its own condition (status, attempt), so a
late or duplicate write is refused as it is alone; when DynamoDB cancels the transaction, the
refused items are handled one by one as before (a refused start goes through step 2 alone) and
the others are written again (:meth:`~asyncinfer.jobs.store.JobStore.transition_many`). A
TransactWriteItems call returns no items, so the worker knows each record from what it wrote:

* a start goes into the transaction only on the message's first delivery, conditional on
  ``queued`` at attempt 0, and only when the message carries the record's other attributes
  (``created_at``, ``metadata``, ``webhook``; :mod:`asyncinfer.jobs.messages`); anything else (a
  redelivery, an older message) is marked alone with UpdateItem and its returned record;
* a job whose webhook takes ``job.queued`` or ``job.started`` events is written alone throughout,
  since the webhook dispatcher writes delivery state on its record while it waits and runs; so is
  a terminal write that would leave a progress count the worker may not know.

A lone terminal write with nothing to start goes out at once (UpdateItem). Transactional writes
consume twice the write capacity of plain ones: the cut is in requests, not in write units.
Messages are received 10 at a time at most and never more than the worker can start now (its
capacity less the jobs running and the messages in hand: :mod:`~asyncinfer.worker.intake`), so a
job becomes ``running`` (``started_at``, ``job.started``, attempts + 1) when its handler takes
it, not when its message arrives; after a short receive while jobs run the intake waits
``max_wait_ms`` so that the next one comes back fuller.
Finished messages are deleted 10 at a time, or once the oldest has waited
:data:`~asyncinfer.worker.held.DELETE_FLUSH_SECONDS`, or at once when the worker has no job in
progress (held messages keep it busy and count as load for scaling).

The parts, each an object with a narrow interface that the :class:`Worker` composes and hands
what it needs (imports run one way, from this module down; ``outcomes`` imports no other worker
module):

* :mod:`~asyncinfer.worker.intake`: receive by capacity, the inboxes and the priority rule;
* :mod:`~asyncinfer.worker.held`: the held messages: visibility, releases, batched deletes;
* :mod:`~asyncinfer.worker.journal`: pending terminal writes, buffered events, requeues;
* :mod:`~asyncinfer.worker.starts`: steps 1-3, and the recovery of lost attempts;
* :mod:`~asyncinfer.worker.outcomes`: step 5's decision, a pure function of result and record;
* :mod:`~asyncinfer.worker.watcher`: heartbeat, progress writes, cancel checks; it also writes
  terminal records that waited too long for a take, and deletes the messages whose deletion is
  due while the handler takes nothing (one long batch).

SIGTERM: stop polling; running jobs may go on for ``drain_seconds``, after which the handler is
interrupted and the jobs are released (``running -> queued``, visibility 0); held messages not yet
started are released too. The process exits 0 with no job left ``running``.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from typing import Any

from asyncinfer.aws import clients
from asyncinfer.aws.payloads import PayloadStore
from asyncinfer.core.settings_parts import WorkerSettings
from asyncinfer.jobs.events import EventPublisher
from asyncinfer.jobs.record import JobRecord
from asyncinfer.jobs.store import JobStore
from asyncinfer.models.base import ModelHandler, WorkItem
from asyncinfer.models.registry import MODELS, ModelSpec
from asyncinfer.worker.finishing import Finishing
from asyncinfer.worker.held import HeldMessages
from asyncinfer.worker.inflight import Held
from asyncinfer.worker.intake import Intake
from asyncinfer.worker.journal import Journal
from asyncinfer.worker.metrics import emit_job_metrics
from asyncinfer.worker.outcomes import quiet_webhook
from asyncinfer.worker.protection import ScaleInProtection
from asyncinfer.worker.starts import Starter
from asyncinfer.worker.startup import StartTimes
from asyncinfer.worker.watcher import Watcher

__all__ = ["Worker", "quiet_webhook"]

log = logging.getLogger("asyncinfer.worker")


class Worker(Finishing):
    """One worker process for one model: the :class:`~asyncinfer.models.base.WorkSource` of its
    handler, composed of an intake, the held messages, a journal of writes, a starter and a
    watcher.

    Args:
        settings: the worker's part of the settings (``Settings.worker``: queues, table,
            bucket, topic, timeouts).
        model: the model id this worker serves.
        handler: a built handler (default: the registry's, loaded on :meth:`run`).
        max_batch_size: most jobs in a batch (default: the model's ``max_batch_size``).
        max_wait_seconds: how long to gather a batch once one message is in hand, seconds.
        store, events, sqs: the job table, the event publisher and the SQS client (default:
            built from ``settings``); tests inject stubs.
    """

    def __init__(
        self,
        settings: WorkerSettings,
        model: str,
        *,
        handler: ModelHandler | None = None,
        max_batch_size: int | None = None,
        max_wait_seconds: float | None = None,
        store: JobStore | None = None,
        events: EventPublisher | None = None,
        sqs: Any = None,
    ) -> None:
        self.settings = settings
        self.spec: ModelSpec = MODELS[model]
        self.queues = settings.priority_queues(model)
        self.handler = handler
        self.max_batch_size = max_batch_size or settings.max_batch_size or self.spec.max_batch_size
        self.max_wait_seconds = (
            max_wait_seconds if max_wait_seconds is not None else settings.max_wait_ms / 1000
        )
        self.store = store or JobStore(settings)
        self.payloads = PayloadStore(settings)
        # job.started keys are cleared by the terminal write, not by a request per start.
        self.publisher = events or EventPublisher(settings, self.payloads, defer_started=True)
        self.stop_event = threading.Event()  # stop polling
        self.interrupt = threading.Event()  # stop running jobs (drain deadline passed)
        self.protection = ScaleInProtection(settings.ecs_agent_uri, settings.busy_file)
        self.jobs_done = 0
        self.max_jobs: int | None = None
        #: Time to ready, split (download, load, first token): :mod:`~asyncinfer.worker.startup`.
        self.start_times = StartTimes(model, emit=bool(settings.compute))
        self._running: dict[str, tuple[Held, JobRecord]] = {}
        # The main loop and the watcher both write records, publish and delete: one at a time
        # (see :mod:`~asyncinfer.worker.journal`).
        lock = threading.RLock()
        self.held = HeldMessages(
            sqs or clients.client("sqs", settings),
            before_delete=lambda: self.journal.flush(),
        )
        self.journal = Journal(
            self.store,
            self.publisher,
            self.held,
            lock=lock,
            visibility_timeout_seconds=settings.visibility_timeout_seconds,
            on_terminal=emit_job_metrics if settings.compute else None,
        )
        #: Most jobs running at once: ``max_batch_size`` for a handler that runs a batch as one
        #: step, 1 for one that runs items one at a time (set from the handler by :meth:`run`).
        self.capacity = self.max_batch_size
        self.intake = Intake(
            self.held,
            self.queues,
            capacity=self.capacity,
            running=lambda: len(self._running),
            stop_event=self.stop_event,
            receive_max=self._receive_max(),
            receive_wait_seconds=settings.receive_wait_seconds,
            max_wait_seconds=self.max_wait_seconds,
            stop_release_delay=self._stop_release_delay(),
            ready=lambda: self.handler is None or self.handler.ready(),
        )
        self.starter = Starter(
            self.spec,
            store=self.store,
            events=self.publisher,
            payloads=self.payloads,
            held=self.held,
            journal=self.journal,
            stop_event=self.interrupt,
            retry_delay_seconds=settings.retry_delay_seconds,
            max_attempts=settings.max_receive_count,
        )
        self.watcher = Watcher(
            self.store,
            self.held,
            self.journal,
            heartbeat_interval=settings.heartbeat_interval,
            visibility_timeout_seconds=settings.visibility_timeout_seconds,
        )

    # ------------------------------------------------------------------ parts, for tests
    @property
    def sqs(self) -> Any:
        """The SQS client of the held messages (and the intake)."""
        return self.held.sqs

    @sqs.setter
    def sqs(self, client: Any) -> None:
        self.held.sqs = client

    @property
    def inflight(self) -> Any:
        """The set of held messages."""
        return self.held.inflight

    @property
    def inboxes(self) -> Any:
        """The intake's inboxes, ``{priority: queue of Held}``."""
        return self.intake.inboxes

    def _watch_once(self) -> None:
        self.watcher.watch_once()

    def _delete_later(self, held: Held) -> None:
        self.held.delete_later(held)

    @property
    def _to_delete(self) -> list[Held]:
        return self.held.to_delete

    # ------------------------------------------------------------------ lifecycle
    def install_signal_handlers(self) -> None:
        """SIGTERM and SIGINT begin a graceful stop (main thread only)."""
        signal.signal(signal.SIGTERM, lambda *_: self.request_stop())
        signal.signal(signal.SIGINT, lambda *_: self.request_stop())

    def request_stop(self) -> None:
        """Stop polling now; interrupt running jobs after ``drain_seconds``."""
        if self.stop_event.is_set():
            return
        log.info("stopping: no more polling; draining for %.0fs", self.settings.drain_seconds)
        self.stop_event.set()
        self.intake.wake()
        timer = threading.Timer(self.settings.drain_seconds, self.interrupt.set)
        timer.daemon = True
        timer.start()

    def load(self) -> None:
        """Build and load the model handler (once), timing the weights' download apart from
        the rest (:attr:`start_times`)."""
        t0 = time.monotonic()
        with self.start_times.loading():
            if self.handler is None:
                self.handler = self.spec.load_handler(settings=self.settings.model_settings)
            self.handler.load()
        log.info("model %s loaded in %.2fs", self.spec.id, time.monotonic() - t0)

    def run(self, *, max_jobs: int | None = None) -> int:
        """Serve until stopped (or until ``max_jobs`` jobs were taken). Returns 0."""
        self.max_jobs = max_jobs
        self.load()
        assert self.handler is not None
        self.capacity = self.handler.capacity(self.max_batch_size)
        self.intake.capacity = self.capacity
        self.intake.receive_max = self._receive_max()
        self.intake.start()
        self.watcher.start()
        self.start_times.ready()
        log.info(
            "worker ready: model=%s queues=%s capacity=%d %s",
            self.spec.id,
            ",".join(self.queues),
            self.capacity,
            self.start_times.ready_fields(),
        )
        try:
            self.handler.serve(self, self.capacity)
        finally:
            self.stop_event.set()
            # Terminal writes still waiting for a take, and their events (a message whose event
            # does not go out is left to come back; its redelivery publishes the event again).
            self.journal.flush(force=True)
            self.held.flush_deletes()
            # A long poll in flight may still return messages: wait for it, so that they are
            # released now rather than left invisible until their visibility timeout.
            self.intake.join(self.settings.receive_wait_seconds + 5)
            self._release_unstarted()
            self.protection.set(busy=False)
        log.info("worker stopped")
        return 0

    # ------------------------------------------------------------------ WorkSource
    def take(self, max_items: int, timeout: float) -> list[WorkItem]:
        """Up to ``max_items`` started jobs (see :class:`~asyncinfer.models.base.WorkSource`).

        The terminal writes of jobs finished since the last call go out now: with the starts of
        this call when there is a message in hand, else alone at once (so that a crash can lose
        at most what finished right now)."""
        if self.stopping or not self.intake.backlog():
            self.journal.flush()
        if self.stopping:
            self.held.flush_deletes_due()
            return []
        if self.held.to_delete and not self._running:
            # Nothing in progress (idle, or between two batches of a handler that runs one batch
            # at a time): no later finish to share the call with soon, and held messages would
            # keep the worker busy (scale-in protection) and count as load (the backlog metric).
            self.held.flush_deletes()
        if not self._running and not len(self.inflight) and self.protection.enabled:
            self.protection.set(busy=False)
        self.intake.wait(timeout)
        # A short wait lets a burst arrive as one batch; a handler that asks without waiting
        # (timeout 0: continuous batching between decoding steps) takes what is there.
        held = self.intake.take(max_items, self.max_wait_seconds if timeout > 0 else 0.0)
        try:
            if held:
                self.protection.set(busy=True)
            items: list[WorkItem] = []
            # With the pending terminal writes, even for no starts.
            for s in self.starter.start_many(held, self._running):
                if s.item is None:
                    assert s.error is not None
                    s.held.finished = True  # its input was refused: the job ends with that error
                    self._conclude(s.held, s.record, s.error)
                    continue
                self._running[s.item.job_id] = (s.held, s.record)
                items.append(s.item)
        finally:
            self.intake.started(len(held))  # counted as running now, or deleted or released
        self.held.flush_deletes_due()
        self.jobs_done += len(items)
        if self.max_jobs is not None and self.jobs_done >= self.max_jobs:
            self.stop_event.set()
        return items

    def _receive_max(self) -> int:
        """Most messages one receive asks for: 10 (SQS ReceiveMessage), fewer for a worker that
        runs fewer at once."""
        return max(1, min(10, self.settings.receive_max_messages, self.capacity))

    # ------------------------------------------------------------------ stopping
    def _release_unstarted(self) -> None:
        pending = self.intake.drain()
        if pending:
            log.info("releasing %d unstarted messages", len(pending))
            self.held.release(pending, delay=self._stop_release_delay())

    def _stop_release_delay(self) -> float:
        """How long a message this worker releases as it stops stays invisible, seconds: one
        receive wait. Workers stopping together (a scale-in) each have a long poll in flight; a
        message released at once would be received, and released, by each of them in turn, and
        every receive counts toward maxReceiveCount: with three of them, a job that never ran
        went to the dead-letter queue. After one receive wait their polls have ended."""
        return float(self.settings.receive_wait_seconds)
