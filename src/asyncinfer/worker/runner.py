"""The worker loop: long-poll a model's queues, run jobs in batches, keep messages invisible while
they run, finish jobs with conditional writes, and only then delete their messages.

The worker is the :class:`~asyncinfer.models.base.WorkSource` of its model handler: the handler's
``serve`` loop takes started jobs (dynamic batching, or continuous batching where the handler
admits jobs into a running batch) and hands each result back as soon as it has it.

Per job:

1. parse each message; a job whose TTL passed while queued for its first attempt becomes
   ``expired`` (one that started before goes on to step 2: leases, issue 14);
2. ``queued -> running`` (attempts + 1, and the job's lease, which the watcher's heartbeat renews;
   :mod:`asyncinfer.leases`), a conditional write; a cancelled or finished job is
   skipped, a job found ``running`` (its last worker was lost: the message became visible again)
   goes ``running -> queued -> running`` so the lost worker's late writes are refused;
3. publish ``job.started``; read the input (inline or S3) and validate it;
4. run the model handler on the batch;
5. per job: store the output (S3 above 64 KB), make the job terminal (or back to ``queued`` for a
   retryable error), publish the event;
6. delete the finished messages (DeleteMessageBatch, up to 10 a call). A retryable failure
   instead leaves its message to reappear after a backoff; after maxReceiveCount receives SQS
   moves it to the dead-letter queue, where :mod:`asyncinfer.dlq` fails the job with
   ``max_attempts``.

AWS requests. Each :meth:`Worker.take` writes, in one TransactWriteItems call, the terminal
records of the jobs that finished since the last take and the ``running`` marks of the jobs it
starts, then publishes their events together (SNS PublishBatch, 10 a call): in a continuous
batch, where a finished job's slot goes to the next job at once, that is one write and one
publish for both. Every item of the transaction keeps its own condition (status, attempt), so a
late or duplicate write is refused as it is alone; when DynamoDB cancels the transaction, the
refused items are handled one by one as before (a refused start goes through step 2 alone) and
the others are written again (:meth:`~asyncinfer.store.JobStore.transition_many`). A
TransactWriteItems call returns no items, so the worker knows each record from what it wrote:

* a start goes into the transaction only on the message's first delivery, conditional on
  ``queued`` at attempt 0, and only when the message carries the record's other attributes
  (``created_at``, ``metadata``, ``webhook``; :mod:`asyncinfer.messages`); anything else (a
  redelivery, an older message) is marked alone with UpdateItem and its returned record;
* a job whose webhook takes ``job.queued`` or ``job.started`` events is written alone throughout,
  since the webhook dispatcher writes delivery state on its record while it waits and runs; so is
  a terminal write that would leave a progress count the worker may not know.

A lone terminal write with nothing to start goes out at once (UpdateItem). Transactional writes
consume twice the write capacity of plain ones: the cut is in requests, not in write units.
Messages are received 10 at a time (fewer for a worker that runs fewer jobs at once), only
while the worker has room for more jobs (or its inbox of that class is empty), and after a short
receive while jobs run the poller waits ``max_wait_ms`` so that the next one comes back fuller.
Finished messages are deleted 10 at a time, or once the oldest has waited
:data:`DELETE_FLUSH_SECONDS`, or at once when the worker has no job in progress (held messages
keep it busy and count as load for scaling).

Priorities: each class (high, normal, low) with its own queue has its own poller. Admission is by
strict priority, except that every fifth admission while a higher class has backlog goes to a
lower class (normal and low in turn), so lower classes get at least a fifth of the slots and are
never starved.

A watcher thread extends the visibility timeout of every held message each heartbeat interval
(ChangeMessageVisibilityBatch), so a job that runs longer than the visibility timeout is never
delivered twice. Every :data:`CANCEL_POLL_SECONDS` it writes the progress of the running jobs
(``progress_tokens`` and the partial output, all jobs in one TransactWriteItems call, each
conditional on no cancel request: a refused write is the cancel signal; a job with no new
progress since the last round, a slow step, has its last count written again as its check) and
reads the cancel requests of the running jobs that have written no progress yet (BatchGetItem).
A job that started less than :data:`CHECK_AFTER_SECONDS` ago is left out of both, so a shorter
job costs neither; a cancel request is still seen at most ``CHECK_AFTER_SECONDS +
CANCEL_POLL_SECONDS`` (3 s) after it was made, and the job stops at its next step. The watcher also
writes terminal records that waited :data:`PENDING_FLUSH_SECONDS` for a take, and deletes the
messages whose deletion is due while the handler takes nothing (one long batch).

SIGTERM: stop polling; running jobs may go on for ``drain_seconds``, after which the handler is
interrupted and the jobs are released (``running -> queued``, visibility 0); held messages not yet
started are released too. The process exits 0 with no job left ``running``.
"""

from __future__ import annotations

import json
import logging
import queue
import signal
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from asyncinfer import clients, lifecycle
from asyncinfer.errors import (
    InvalidInput,
    JobCancelled,
    JobError,
    TransitionRefused,
    WorkerStopping,
)
from asyncinfer.events import EventPublisher
from asyncinfer.messages import JobMessage
from asyncinfer.models.base import ModelHandler, Result, WorkItem
from asyncinfer.models.registry import MODELS, ModelSpec
from asyncinfer.payloads import PayloadStore, dumps
from asyncinfer.settings import INLINE_OUTPUT_LIMIT_BYTES, Settings
from asyncinfer.store import LEASE_FIELD, JobStore, Transition
from asyncinfer.timeutil import iso, now, parse
from asyncinfer.worker.inflight import Held, InFlight
from asyncinfer.worker.metrics import emit_job_metrics
from asyncinfer.worker.protection import ScaleInProtection

log = logging.getLogger("asyncinfer.worker")

#: How often running jobs write progress and are checked for cancel requests, seconds.
CANCEL_POLL_SECONDS = 2.0
#: A job is left out of progress writes and cancel reads until it has run this long, seconds.
CHECK_AFTER_SECONDS = 1.0
#: Finished jobs' messages are deleted in batches: when 10 are pending, once the oldest has
#: waited this long, seconds, or at once when the worker has no job in progress (a message not
#: yet deleted stays invisible under the heartbeat; a redelivery finds its job terminal and
#: deletes it).
DELETE_FLUSH_SECONDS = 5.0
#: Terminal records wait for the next take to share its write; the watcher writes those that
#: waited this long (a handler that does not come back for more work), seconds.
PENDING_FLUSH_SECONDS = 1.0
#: Longest a retryable failure waits before its message is visible again, seconds.
MAX_RETRY_DELAY_SECONDS = 300
#: Webhook events whose delivery the dispatcher records on a job before it is terminal.
_EARLY_EVENTS = frozenset({"job.queued", "job.started"})
#: What a start removes: a lost attempt's leftovers.
_START_REMOVES = ("completed_at", "progress_tokens", "output")


def quiet_webhook(webhook: str | None) -> bool:
    """Whether a job with this ``webhook`` attribute (JSON text) has a record that only the
    worker writes from submit until its terminal event (cancel requests aside, which are not part
    of the job object): true without a webhook, or with one that takes terminal events only."""
    if not webhook:
        return True
    try:
        events = json.loads(webhook).get("events")
    except (ValueError, AttributeError):
        return False
    return not (set(events or ()) & _EARLY_EVENTS)


@dataclass
class _Finished:
    """A terminal write waiting for the next take's transaction."""

    held: Held
    before: dict[str, Any]  # the running record
    transition: Transition
    alone: bool  # written alone with UpdateItem; its returned record makes the event


class Worker:
    """One worker process for one model.

    Args:
        settings: runtime settings (queues, table, bucket, topic, timeouts).
        model: the model id this worker serves.
        handler: a built handler (default: the registry's, loaded on :meth:`run`).
        max_batch_size: most jobs in a batch (default: the model's ``max_batch_size``).
        max_wait_seconds: how long to gather a batch once one message is in hand, seconds.
    """

    #: One admission in this many goes to a lower class while a higher class has backlog.
    LOWER_CLASS_EVERY = 5

    def __init__(
        self,
        settings: Settings,
        model: str,
        *,
        handler: ModelHandler | None = None,
        max_batch_size: int | None = None,
        max_wait_seconds: float | None = None,
    ) -> None:
        self.settings = settings
        self.spec: ModelSpec = MODELS[model]
        self.queues = settings.priority_queues(model)
        self.handler = handler
        self.max_batch_size = max_batch_size or settings.max_batch_size or self.spec.max_batch_size
        self.max_wait_seconds = (
            max_wait_seconds if max_wait_seconds is not None else settings.max_wait_ms / 1000
        )
        self.store = JobStore(settings)
        self.payloads = PayloadStore(settings)
        self.events = EventPublisher(settings, self.payloads)
        self.sqs = clients.client("sqs", settings)
        self.inflight = InFlight()
        self.inboxes: dict[str, queue.Queue[Held]] = {p: queue.Queue() for p in self.queues}
        self.arrived = threading.Condition()
        self.stop_event = threading.Event()  # stop polling
        self.interrupt = threading.Event()  # stop running jobs (drain deadline passed)
        self.protection = ScaleInProtection()
        self.jobs_done = 0
        self.max_jobs: int | None = None
        self._admitted = 0
        self._lower_turn = 0
        self._running: dict[str, tuple[Held, dict[str, Any]]] = {}
        # The main loop and the watcher both write records, publish and delete: one at a time,
        # so that events precede deletions and the two never write the same item at once
        # (DynamoDB cancels a transaction that meets another one on an item, and refuses a plain
        # write to an item a transaction is writing). The lists are appended to without it:
        # taking one over (``a, self.a = self.a, []``) loses no append.
        self._lock = threading.RLock()
        self._pending: list[_Finished] = []
        self._pending_since = 0.0
        self._to_delete: list[Held] = []
        self._delete_since = 0.0
        self._events: list[dict[str, Any]] = []

    # ------------------------------------------------------------------ lifecycle
    @property
    def stopping(self) -> bool:
        """True once the worker takes no more work."""
        return self.stop_event.is_set()

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
        with self.arrived:
            self.arrived.notify_all()
        timer = threading.Timer(self.settings.drain_seconds, self.interrupt.set)
        timer.daemon = True
        timer.start()

    def load(self) -> None:
        """Build and load the model handler (once)."""
        if self.handler is None:
            self.handler = self.spec.load_handler(cache_dir=self.settings.model_cache_dir)
        t0 = time.monotonic()
        self.handler.load()
        log.info("model %s loaded in %.2fs", self.spec.id, time.monotonic() - t0)

    def run(self, *, max_jobs: int | None = None) -> int:
        """Serve until stopped (or until ``max_jobs`` jobs were taken). Returns 0."""
        self.max_jobs = max_jobs
        self.load()
        assert self.handler is not None
        pollers = [
            threading.Thread(
                target=self._poll_loop, args=(priority, url), name=f"poll-{priority}", daemon=True
            )
            for priority, url in self.queues.items()
        ]
        for t in pollers:
            t.start()
        threading.Thread(target=self._watch_loop, name="watcher", daemon=True).start()
        log.info("worker ready: model=%s queues=%s", self.spec.id, ",".join(self.queues))
        try:
            self.handler.serve(self, self.max_batch_size)
        finally:
            self.stop_event.set()
            self._flush()  # terminal writes still waiting for a take, and their events
            self._flush_deletes()
            # A long poll in flight may still return messages: wait for it, so that they are
            # released now rather than left invisible until their visibility timeout.
            deadline = time.monotonic() + self.settings.receive_wait_seconds + 5
            for t in pollers:
                t.join(timeout=max(0.0, deadline - time.monotonic()))
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
        if self.stopping or not self._backlog():
            self._flush()
        if self.stopping:
            self._flush_deletes_due()
            return []
        if self._to_delete and not self._running:
            # Nothing in progress (idle, or between two batches of a handler that runs one batch
            # at a time): no later finish to share the call with soon, and held messages would
            # keep the worker busy (scale-in protection) and count as load (the backlog metric).
            self._flush_deletes()
        if not self._running and not len(self.inflight) and self.protection.enabled:
            self.protection.set(busy=False)
        deadline = time.monotonic() + timeout
        with self.arrived:
            while not self._backlog() and not self.stopping:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self.arrived.wait(left)
        held: list[Held] = []
        if self._backlog() and not self.stopping:
            # A short wait lets a burst arrive as one batch; a handler that asks without waiting
            # (timeout 0: continuous batching between decoding steps) takes what is there.
            gather_until = time.monotonic() + (self.max_wait_seconds if timeout > 0 else 0.0)
            while self._backlog() < max_items and time.monotonic() < gather_until:
                time.sleep(0.005)
            while len(held) < max_items and not self.stopping:
                h = self._next_held()
                if h is None:
                    break
                held.append(h)
        if held:
            self.protection.set(busy=True)
        items = self._start_many(held)  # with the pending terminal writes, even for no starts
        self._flush_deletes_due()
        self.jobs_done += len(items)
        if self.max_jobs is not None and self.jobs_done >= self.max_jobs:
            self.stop_event.set()
        return items

    def finish(self, item: WorkItem, result: Result) -> None:
        """Take ``item``'s result. Its terminal write goes out with the next :meth:`take`'s
        transaction (or at once: when the job must be written alone, when the worker is
        stopping); its event follows the write, and its message is deleted after the event."""
        held, record = self._running.pop(item.job_id)
        held.finished = True  # no more heartbeat-time progress writes or cancel reads for it
        self._conclude(held, record, result)

    def _backlog(self) -> int:
        return sum(q.qsize() for q in self.inboxes.values())

    def _room(self) -> int:
        """How many more jobs the worker could start now."""
        return self.max_batch_size - len(self._running) - self._backlog()

    def _next_held(self) -> Held | None:
        """The next message by the priority rule (see the module docstring)."""
        order = [p for p in ("high", "normal", "low") if p in self.inboxes]
        waiting = [p for p in order if self.inboxes[p].qsize()]
        if not waiting:
            return None
        pick = waiting[0]
        lower = waiting[1:]
        self._admitted += 1
        if lower and self._admitted % self.LOWER_CLASS_EVERY == 0:
            pick = lower[self._lower_turn % len(lower)]
            self._lower_turn += 1
        try:
            return self.inboxes[pick].get_nowait()
        except queue.Empty:
            return None

    # ------------------------------------------------------------------ threads
    def _poll_loop(self, priority: str, url: str) -> None:
        inbox = self.inboxes[priority]
        # 10 a call at most (SQS ReceiveMessage); fewer for a worker that runs fewer at once.
        most = max(1, min(10, self.settings.receive_max_messages, self.max_batch_size))
        while not self.stop_event.is_set():
            # Receive while there is room for more jobs; a class whose inbox is empty receives
            # anyway, so that the priority rule has its messages in hand when a slot frees.
            if inbox.qsize() and self._room() <= 0:
                time.sleep(0.01)
                continue
            try:
                resp = self.sqs.receive_message(
                    QueueUrl=url,
                    MaxNumberOfMessages=most,
                    WaitTimeSeconds=self.settings.receive_wait_seconds,
                    MessageSystemAttributeNames=["ApproximateReceiveCount"],
                )
            except Exception:
                if self.stop_event.is_set():
                    return
                log.exception("receive failed; retrying in 1s")
                time.sleep(1)
                continue
            messages = resp.get("Messages", [])
            for m in messages:
                held = Held(
                    message_id=m["MessageId"],
                    receipt=m["ReceiptHandle"],
                    body=m["Body"],
                    queue_url=url,
                    receive_count=int(m.get("Attributes", {}).get("ApproximateReceiveCount", 1)),
                )
                self.inflight.add(held)
                if self.stop_event.is_set():
                    self._release([held], delay=self._stop_release_delay())
                else:
                    inbox.put(held)
            with self.arrived:
                self.arrived.notify_all()
            if messages and len(messages) < most and self._running:
                # Messages are coming in one by one while jobs run: let a few more arrive, so
                # that the next receive (and the start of what it brings) is fuller.
                self.stop_event.wait(self.max_wait_seconds)

    def _watch_loop(self) -> None:
        next_beat = time.monotonic() + self.settings.heartbeat_interval
        while True:
            time.sleep(min(CANCEL_POLL_SECONDS, self.settings.heartbeat_interval))
            try:
                if time.monotonic() >= next_beat:
                    next_beat = time.monotonic() + self.settings.heartbeat_interval
                    self._extend(self.inflight.snapshot())
                    self._renew_leases(self.inflight.snapshot())  # leases (issue 14)
                self._watch_once()
            except Exception:
                log.exception("heartbeat failed")

    def _watch_once(self) -> None:
        """One watcher round besides the heartbeat: write the terminal records that waited too
        long for a take, delete the messages whose deletion is due, then write the progress of
        the running jobs that ran at least
        :data:`CHECK_AFTER_SECONDS`, and read the cancel requests of those that wrote none."""
        if self._pending and time.monotonic() - self._pending_since >= PENDING_FLUSH_SECONDS:
            self._flush()
        self._flush_deletes_due()  # a handler busy with one long batch takes nothing meanwhile
        since = time.monotonic() - CHECK_AFTER_SECONDS
        running = [
            h
            for h in self.inflight.snapshot()
            if h.attempts is not None and not h.finished and h.started <= since
        ]
        with self._lock:
            reported = self._flush_progress(running)
        # Jobs that wrote progress learnt of a cancel from that write's condition; only the
        # others need a read.
        self._poll_cancels([h for h in running if h.job_id not in reported])

    # --- leases (issue 14): the heartbeat renews the lease of every running job -------------
    def _renew_leases(self, held: list[Held]) -> None:
        """Move on the lease of the running jobs (:meth:`JobStore.renew_leases`). A refused
        renewal means the job is no longer this worker's (the sweeper took it back after its
        lease lapsed): it is stopped like a cancelled one, and its refused terminal write
        releases its message (:meth:`_finished`)."""
        running = [h for h in held if h.job_id and h.attempts is not None and not h.finished]
        with self._lock:
            refused = self.store.renew_leases([(h.job_id or "", h.attempts or 0) for h in running])
        for h in running:
            if h.job_id in refused:
                h.cancel_event.set()

    # --- end leases ---------------------------------------------------------------------------
    def _extend(self, held: list[Held]) -> None:
        """Extend the visibility timeout of every held message (ChangeMessageVisibilityBatch)."""
        self._change_visibility(held, self.settings.visibility_timeout_seconds)

    def _poll_cancels(self, running: list[Held]) -> None:
        if not running:
            return
        records = self.store.get_many(
            [h.job_id for h in running if h.job_id], attributes=("cancel_requested", "status")
        )
        for h in running:
            rec = records.get(h.job_id or "")
            if rec and rec.get("cancel_requested"):
                h.cancel_event.set()

    def _flush_progress(self, running: list[Held]) -> set[str]:
        """Write the progress that handlers reported since the last flush, all jobs in one
        TransactWriteItems call, each conditional on the job still running at its attempt and
        not asked to cancel. A job that reported before but not since (a slow step) has its
        last count written again: the write is its cancel check, in the same call. A job whose
        write is refused gets its cancel event set (it was cancelled, or it is no longer this
        worker's). Returns the ids written or refused: the others need a cancel read."""
        updates = []
        by_id: dict[str, Held] = {}
        for h in running:
            if not h.job_id or h.attempts is None:
                continue
            progress, h.progress = h.progress, None
            fields: dict[str, Any]
            if progress is not None:
                tokens, partial = progress
                fields = {"progress_tokens": tokens}
                if partial:
                    fields["output"] = dumps(partial).decode()
                h.written_tokens = tokens
            elif h.written_tokens is not None:
                fields = {"progress_tokens": h.written_tokens}
            else:
                continue
            updates.append((h.job_id, h.attempts, fields))
            by_id[h.job_id] = h
        if not updates:
            return set()
        refused = self.store.update_fields_many(
            updates, status=lifecycle.RUNNING, unless="cancel_requested"
        )
        for job_id in refused:
            by_id[job_id].cancel_event.set()
        return set(by_id)

    # ------------------------------------------------------------------ starting jobs
    def _start_many(self, held: list[Held]) -> list[WorkItem]:
        """Steps 1-3 for the messages in ``held``, in one write with the pending terminal
        writes: the started jobs' work items (the other messages were deleted or released)."""
        batched: list[tuple[Held, JobMessage, Transition]] = []
        alone: list[tuple[Held, JobMessage]] = []
        pending_ids = {f.transition.job_id for f in self._pending}
        for h in held:
            try:
                msg = self._parse(h)
            except Exception:
                log.exception("could not start the job of message %s", h.message_id)
                self._release([h], delay=self.settings.retry_delay_seconds)
                continue
            if msg is None:
                continue
            job_id = msg.job_id
            if (
                h.receive_count == 1
                and msg.created_at is not None
                and quiet_webhook(msg.webhook)
                and job_id not in pending_ids
                and job_id not in self._running
            ):
                pending_ids.add(job_id)
                start = Transition(
                    job_id,
                    from_status=lifecycle.QUEUED,
                    to_status=lifecycle.RUNNING,
                    attempts=0,
                    increment_attempts=True,
                    # leases (issue 14): the start takes the job's lease
                    set_fields={"started_at": iso(now()), LEASE_FIELD: self.store.lease_until()},
                    remove_fields=_START_REMOVES,
                )
                batched.append((h, msg, start))
            else:
                alone.append((h, msg))

        started: list[tuple[Held, JobMessage, dict[str, Any]]] = []
        if not (batched or alone or self._pending or self._events):
            return []  # nothing to write: no wait for the watcher's lock in the decoding loop
        with self._lock:
            outcomes = self._write_pending([t for _, _, t in batched])
            retry: list[tuple[Held, JobMessage, Any, str | None]] = [
                (h, msg, None, None) for h, msg in alone
            ]
            for (h, msg, start), outcome in zip(batched, outcomes, strict=True):
                if outcome is None:
                    started.append((h, msg, start.applied_to(_queued_record(msg))))
                else:
                    # Refused, or not written: step 2 alone decides from the record as it is.
                    retry.append((h, msg, outcome, start.set_fields["started_at"]))
            for h, msg, outcome, started_at in retry:
                try:
                    record = self._mark_running(
                        msg.job_id,
                        redelivered=h.receive_count > 1,
                        refused=outcome if isinstance(outcome, TransitionRefused) else None,
                        started_at=started_at,
                    )
                except Exception:
                    log.exception("could not start the job of message %s", h.message_id)
                    self._release([h], delay=self.settings.retry_delay_seconds)
                    continue
                if record is None:
                    self._delete_later(h)
                else:
                    started.append((h, msg, record))
            for h, _, record in started:
                h.attempts = record["attempts"]
                h.started = time.monotonic()
                self._events.append(record)  # job.started, published with the batch's others
                log.info("job %s running (attempt %s)", record["job_id"], record["attempts"])

        items: list[WorkItem] = []
        for h, msg, record in started:
            try:
                item = self._work_item(h, msg, record)
            except Exception:
                # A fault on one job (AWS, a malformed record) must not take the worker and the
                # rest of the batch down: give the message back; the next delivery finds the job
                # running and retries it as a lost attempt, and SQS's maxReceiveCount bounds how
                # often it comes back before the DLQ handler fails its job.
                log.exception("could not start the job of message %s", h.message_id)
                self._running.pop(record["job_id"], None)
                self._release([h], delay=self.settings.retry_delay_seconds)
                continue
            if item is not None:
                items.append(item)
        self._publish_events()
        return items

    def _parse(self, held: Held) -> JobMessage | None:
        """Step 1 for one message: its job message, or ``None`` (it was released or the job
        expired)."""
        try:
            msg = JobMessage.model_validate_json(held.body)
        except ValidationError:
            log.error("malformed message %s: releasing it toward the DLQ", held.message_id)
            self._release([held])
            return None
        held.job_id = msg.job_id
        # leases (issue 14): only a job that never started expires; one handed back after it
        # started (a lost attempt, a retry) goes on to the start, which decides from its record.
        if parse(msg.expires_at) <= now() and self._expire(msg.job_id):
            self._delete_later(held)
            return None
        return msg

    def _work_item(self, held: Held, msg: JobMessage, record: dict[str, Any]) -> WorkItem | None:
        """Step 3 for one started job: read and validate its input; ``None`` when it failed."""
        try:
            raw = (
                msg.input if msg.input is not None else self.payloads.read_json(msg.input_ref or "")
            )
            item_input = self.spec.input_model.model_validate(raw)
        except ValidationError as exc:
            err = InvalidInput(f"input is not valid for {self.spec.id}: {exc.errors()[0]['msg']}")
            held.finished = True
            self._conclude(held, record, err)
            return None
        except JobError as exc:
            held.finished = True
            self._conclude(held, record, exc)
            return None

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
            stop_event=self.interrupt,
            on_progress=on_progress,
        )
        if record.get("cancel_requested"):
            held.cancel_event.set()
        self._running[msg.job_id] = (held, record)
        return item

    def _expire(self, job_id: str) -> bool:
        """Expire a queued, never started job; False when it was not (leases, issue 14)."""
        record = self.store.expire(job_id)
        if record is not None:
            log.info("job %s expired", job_id)
            self.events.publish(record)
        return record is not None

    def _mark_running(
        self,
        job_id: str,
        *,
        redelivered: bool = False,
        refused: TransitionRefused | None = None,
        started_at: str | None = None,
    ) -> dict[str, Any] | None:
        """``queued -> running`` with UpdateItem; recovers a job whose last worker was lost.
        ``None`` when the job is gone, cancelled or finished (its message is deleted).

        ``refused``: a transaction's refusal of this start, to decide from before writing.
        ``started_at``: the start time a transaction of this worker may already have written
        for this job (a call that failed may have committed): a record that shows it is ours.

        A redelivered message whose job a worker already finished means that worker died
        between the terminal write and deleting the message, maybe before publishing the event:
        the terminal event is published again (at least once; webhook receivers dedupe on the
        ``webhook-id``, which is the same for the same job, event and attempt)."""
        mine = {started_at} if started_at else set()
        for _ in range(3):
            exc, refused = refused, None
            if exc is None:
                at = iso(now())
                mine.add(at)
                try:
                    return self.store.transition(
                        job_id,
                        from_status=lifecycle.QUEUED,
                        to_status=lifecycle.RUNNING,
                        increment_attempts=True,
                        set_fields={"started_at": at},
                        remove_fields=_START_REMOVES,
                    )
                except TransitionRefused as e:
                    exc = e
            cur = exc.current
            if cur is None or lifecycle.is_terminal(cur["status"]):
                log.info("job %s is %s: skipping", job_id, cur and cur["status"])
                if (
                    redelivered
                    and cur is not None
                    and cur["status"] in (lifecycle.SUCCEEDED, lifecycle.FAILED)
                    and cur.get("started_at")
                ):
                    self._events.append(cur)
                return None
            if cur["status"] == lifecycle.QUEUED:
                continue  # queued at another attempt than a transaction assumed: write it alone
            if cur["status"] != lifecycle.RUNNING:
                return None
            if cur.get("started_at") in mine:
                return cur  # our own write, answered late
            # The message became visible again while the job was running: the worker that
            # held it is gone. Put the job back so that its late writes are refused.
            log.warning("job %s: previous attempt %s was lost", job_id, cur.get("attempts"))
            try:
                back = self.store.transition(
                    job_id,
                    from_status=lifecycle.RUNNING,
                    to_status=lifecycle.QUEUED,
                    attempts=cur.get("attempts"),
                )
                self.events.publish(back)
            except TransitionRefused:
                pass
        return None

    # ------------------------------------------------------------------ finishing jobs
    def _conclude(self, held: Held, record: dict[str, Any], result: Result) -> None:
        """Step 5 for one job: requeue it now, or queue its terminal write for the next take
        (at once when it must be written alone or the worker is stopping)."""
        try:
            finished = self._terminal(held, record, result)
        except Exception:
            # The result could not be recorded (an AWS fault): the message comes back after its
            # visibility timeout and the next attempt takes over from the job left running.
            log.exception("could not record the result of job %s", record["job_id"])
            self._release([held], delay=self.settings.visibility_timeout_seconds)
            return
        if finished is None:
            return
        # No lock to queue it (the swaps of these lists are atomic): the decoding loop does not
        # wait for a watcher write here.
        if not self._pending:
            self._pending_since = time.monotonic()
        self._pending.append(finished)
        if self.stopping:
            self._flush()  # no take follows while the handler drains
        elif finished.alone:
            with self._lock:
                self._write_pending([])  # its event goes out with the next take's

    def _terminal(self, held: Held, record: dict[str, Any], result: Result) -> _Finished | None:
        """The terminal write of one job's result (the output stored in S3 first when large);
        ``None`` when the job went back to the queue instead."""
        job_id, attempts = record["job_id"], record["attempts"]
        fields: dict[str, Any] = {"completed_at": iso(now())}
        remove: list[str] = []
        if isinstance(result, dict):
            to = lifecycle.SUCCEEDED
            usage = result.get("usage")
            if isinstance(usage, dict) and "completion_tokens" in usage:
                fields["progress_tokens"] = usage["completion_tokens"]
            body = dumps(result)
            if len(body) > INLINE_OUTPUT_LIMIT_BYTES:
                fields["output_ref"] = self.payloads.put_output(record["tenant"], job_id, body)
                remove.append("output")
            else:
                fields["output"] = body.decode()
        elif isinstance(result, WorkerStopping):
            self._requeue(held, job_id, attempts, delay=0)
            return None
        elif isinstance(result, JobCancelled):
            to = lifecycle.CANCELLED
            fields["error"] = result.as_dict()
            if result.partial is not None:
                fields["output"] = dumps(result.partial).decode()
                usage = result.partial.get("usage")
                if isinstance(usage, dict) and "completion_tokens" in usage:
                    fields["progress_tokens"] = usage["completion_tokens"]
            else:
                remove.append("output")  # a progress snapshot is not a result
        elif result.retryable:
            delay = min(
                MAX_RETRY_DELAY_SECONDS,
                self.settings.retry_delay_seconds * 2 ** max(0, attempts - 1),
            )
            log.warning("job %s attempt %s: %s (retrying)", job_id, attempts, result.message)
            self._requeue(held, job_id, attempts, delay=delay)
            return None
        else:
            to = lifecycle.FAILED
            fields["error"] = result.as_dict()
            # The last progress snapshot is not the job's output.
            remove += ["output", "progress_tokens"]
        transition = Transition(
            job_id,
            from_status=lifecycle.RUNNING,
            to_status=to,
            attempts=attempts,
            set_fields=fields,
            remove_fields=tuple(remove),
        )
        # Written alone when the worker cannot know the record it leaves: the webhook
        # dispatcher may have written it, or a progress write may have left a count there.
        settles_progress = "progress_tokens" in fields or "progress_tokens" in remove
        alone = not quiet_webhook(record.get("webhook")) or (held.reported and not settles_progress)
        return _Finished(held, record, transition, alone)

    def _write_pending(self, starts: list[Transition]) -> list[Any]:
        """Write the pending terminal records and ``starts`` (called under the lock): the
        batched ones in TransactWriteItems calls, the others alone; queue the events of the
        written ones and their messages' deletion. Returns the outcomes of ``starts``
        (:meth:`~asyncinfer.store.JobStore.transition_many`)."""
        pending, self._pending = self._pending, []
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

    def _finished(self, f: _Finished, outcome: Any, new: dict[str, Any] | None = None) -> None:
        """After one terminal write: queue its event and its message's deletion."""
        t = f.transition
        if isinstance(outcome, TransitionRefused):
            if not t.shows_applied(outcome.current):
                log.warning("%s", outcome)
                # leases (issue 14): taken back to queued after its lease lapsed: the next
                # attempt needs this message.
                if outcome.current and outcome.current.get("status") == lifecycle.QUEUED:
                    self._release([f.held])
                    return
                self._delete_later(f.held)
                return
            new = outcome.current  # our own write, answered late
        elif outcome is not None:
            # Not written (an AWS fault): the message comes back after its visibility timeout
            # and the next attempt takes over from the job left running.
            log.error("could not record the result of job %s: %s", t.job_id, outcome)
            self._release([f.held], delay=self.settings.visibility_timeout_seconds)
            return
        if new is None:
            new = t.applied_to(f.before)
        log.info("job %s %s", t.job_id, new["status"])
        self._events.append(new)  # published before the message is deleted
        if self.settings.compute:
            emit_job_metrics(new)
        self._delete_later(f.held)

    def _flush(self) -> None:
        """Write the pending terminal records and publish the buffered events."""
        if not (self._pending or self._events):
            return
        with self._lock:
            if self._pending:
                self._write_pending([])
            self._publish_events()

    def _requeue(self, held: Held, job_id: str, attempts: int, *, delay: float) -> None:
        """``running -> queued`` at this attempt, then make the message visible after ``delay``."""
        self._flush()  # keep each job's events in order
        try:
            back = self.store.transition(
                job_id,
                from_status=lifecycle.RUNNING,
                to_status=lifecycle.QUEUED,
                attempts=attempts,
                remove_fields=("started_at", "progress_tokens", "output"),
            )
            self.events.publish(back)
        except TransitionRefused as exc:
            log.warning("%s", exc)
        self._release([held], delay=delay)

    # ------------------------------------------------------------------ message ops
    def _by_queue(self, held: Iterable[Held]) -> dict[str, list[Held]]:
        out: dict[str, list[Held]] = {}
        for h in held:
            out.setdefault(h.queue_url, []).append(h)
        return out

    def _change_visibility(self, held: Iterable[Held], seconds: float) -> None:
        for url, group in self._by_queue(held).items():
            for i in range(0, len(group), 10):
                chunk = group[i : i + 10]
                resp = self.sqs.change_message_visibility_batch(
                    QueueUrl=url,
                    Entries=[
                        {
                            "Id": str(n),
                            "ReceiptHandle": h.receipt,
                            "VisibilityTimeout": int(seconds),
                        }
                        for n, h in enumerate(chunk)
                    ],
                )
                for f in resp.get("Failed", []):
                    log.warning("visibility change failed: %s", f)

    def _release(self, held: Iterable[Held], delay: float = 0) -> None:
        """Make messages visible again after ``delay`` seconds and stop holding them."""
        held = list(held)
        try:
            self._change_visibility(held, delay)
        except Exception:
            log.exception("could not release messages; they reappear after the timeout")
        for h in held:
            self.inflight.drop(h.message_id)

    def _delete_later(self, held: Held) -> None:
        """Queue a message for the next batch of deletes."""
        if not self._to_delete:
            self._delete_since = time.monotonic()
        self._to_delete.append(held)

    def _flush_deletes_due(self) -> None:
        """Delete the finished messages when 10 are pending or the oldest waited long enough."""
        if self._to_delete and (
            len(self._to_delete) >= 10
            or time.monotonic() - self._delete_since >= DELETE_FLUSH_SECONDS
        ):
            self._flush_deletes()

    def _flush_deletes(self) -> None:
        """Delete finished messages, up to 10 per DeleteMessageBatch call."""
        with self._lock:
            self._flush()  # a job's terminal write and event go before its message's deletion
            held, self._to_delete = self._to_delete, []
        for url, group in self._by_queue(held).items():
            for i in range(0, len(group), 10):
                chunk = group[i : i + 10]
                resp = self.sqs.delete_message_batch(
                    QueueUrl=url,
                    Entries=[
                        {"Id": str(n), "ReceiptHandle": h.receipt} for n, h in enumerate(chunk)
                    ],
                )
                for f in resp.get("Failed", []):
                    log.error("delete failed: %s", f)
        for h in held:
            self.inflight.drop(h.message_id)

    def _publish_events(self) -> None:
        """Publish the buffered job events in order (PublishBatch, 10 a call)."""
        if not self._events:
            return
        with self._lock:
            events, self._events = self._events, []
            if not events:
                return
            try:
                self.events.publish_many(events)
            except Exception:
                log.exception(
                    "could not publish %d job events; retrying them one by one", len(events)
                )
                for record in events:
                    try:
                        self.events.publish(record)
                    except Exception:
                        log.exception("job event lost: %s %s", record["job_id"], record["status"])

    def _release_unstarted(self) -> None:
        pending: list[Held] = []
        for inbox in self.inboxes.values():
            while True:
                try:
                    pending.append(inbox.get_nowait())
                except queue.Empty:
                    break
        if pending:
            log.info("releasing %d unstarted messages", len(pending))
            self._release(pending, delay=self._stop_release_delay())

    def _stop_release_delay(self) -> float:
        """How long a message this worker releases as it stops stays invisible, seconds: one
        receive wait. Workers stopping together (a scale-in) each have a long poll in flight; a
        message released at once would be received, and released, by each of them in turn, and
        every receive counts toward maxReceiveCount: with three of them, a job that never ran
        went to the dead-letter queue. After one receive wait their polls have ended."""
        return float(self.settings.receive_wait_seconds)


def _queued_record(msg: JobMessage) -> dict[str, Any]:
    """The record of a job waiting for its first attempt, from its message (which carries every
    attribute the job object shows; :mod:`asyncinfer.messages`)."""
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
    return {k: v for k, v in record.items() if v is not None}
