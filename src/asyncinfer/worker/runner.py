"""The worker loop: long-poll a model's queues, run jobs in batches, keep messages invisible while
they run, finish jobs with conditional writes, and only then delete their messages.

The worker is the :class:`~asyncinfer.models.base.WorkSource` of its model handler: the handler's
``serve`` loop takes started jobs (dynamic batching, or continuous batching where the handler
admits jobs into a running batch) and hands each result back as soon as it has it.

Per job:

1. parse each message; a job whose TTL passed while queued becomes ``expired``;
2. ``queued -> running`` (attempts + 1), a conditional write; a cancelled or finished job is
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

Priorities: each class (high, normal, low) with its own queue has its own poller. Admission is by
strict priority, except that every fifth admission while a higher class has backlog goes to a
lower class (normal and low in turn), so lower classes get at least a fifth of the slots and are
never starved.

A watcher thread extends the visibility timeout of every held message each heartbeat interval
(ChangeMessageVisibilityBatch), so a job that runs longer than the visibility timeout is never
delivered twice; polls running jobs for cancel requests (BatchGetItem) every second; and writes
progress (``progress_tokens`` and the partial output) every two seconds per job, all jobs in
one TransactWriteItems call.

SIGTERM: stop polling; running jobs may go on for ``drain_seconds``, after which the handler is
interrupted and the jobs are released (``running -> queued``, visibility 0); held messages not yet
started are released too. The process exits 0 with no job left ``running``.
"""

from __future__ import annotations

import logging
import queue
import signal
import threading
import time
from collections.abc import Iterable
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
from asyncinfer.store import JobStore
from asyncinfer.timeutil import iso, now, parse
from asyncinfer.worker.inflight import Held, InFlight
from asyncinfer.worker.metrics import emit_job_metrics
from asyncinfer.worker.protection import ScaleInProtection

log = logging.getLogger("asyncinfer.worker")

#: How often running jobs write progress and are checked for cancel requests, seconds.
CANCEL_POLL_SECONDS = 2.0
#: Finished jobs' messages are deleted in batches: when 10 are pending, or this often, seconds
#: (a message not yet deleted stays invisible under the heartbeat; a redelivery finds its job
#: terminal and deletes it).
DELETE_FLUSH_SECONDS = 1.0
#: Longest a retryable failure waits before its message is visible again, seconds.
MAX_RETRY_DELAY_SECONDS = 300


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
        self._to_delete: list[Held] = []
        self._deleted_at = 0.0
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
        """Up to ``max_items`` started jobs (see :class:`~asyncinfer.models.base.WorkSource`)."""
        # Events of jobs finished since the last call go out now (one PublishBatch for a step's
        # worth), so that a crash can lose at most the events of the jobs finishing right now.
        self._publish_events()
        if self._to_delete and time.monotonic() - self._deleted_at >= DELETE_FLUSH_SECONDS:
            self._flush_deletes()
        if self.stopping:
            return []
        if not self._running and not len(self.inflight) and self.protection.enabled:
            self.protection.set(busy=False)
        deadline = time.monotonic() + timeout
        with self.arrived:
            while not self._backlog() and not self.stopping:
                left = deadline - time.monotonic()
                if left <= 0:
                    return []
                self.arrived.wait(left)
        if self.stopping:
            return []
        # A short wait lets a burst arrive as one batch.
        gather_until = time.monotonic() + self.max_wait_seconds
        while self._backlog() < max_items and time.monotonic() < gather_until:
            time.sleep(0.005)
        items: list[WorkItem] = []
        while len(items) < max_items and not self.stopping:
            held = self._next_held()
            if held is None:
                break
            self.protection.set(busy=True)
            try:
                item = self._start(held)
            except Exception:
                # A fault on one message (AWS, a malformed record) must not take the worker and
                # the rest of the batch down: give the message back; SQS's maxReceiveCount bounds
                # how often it comes back before the DLQ handler fails its job.
                log.exception("could not start the job of message %s", held.message_id)
                self._running.pop(held.job_id or "", None)
                self._release([held], delay=self.settings.retry_delay_seconds)
                continue
            if item is not None:
                items.append(item)
        self._publish_events()
        self.jobs_done += len(items)
        if self.max_jobs is not None and self.jobs_done >= self.max_jobs:
            self.stop_event.set()
        return items

    def finish(self, item: WorkItem, result: Result) -> None:
        """Record ``item``'s result now; its message is deleted with the next batch of deletes."""
        held, record = self._running.pop(item.job_id)
        held.finished = True  # no more heartbeat-time progress writes or cancel reads for it
        try:
            done = self._finish(held, record, result)
        except Exception:
            # The result could not be recorded (an AWS fault): the message comes back after its
            # visibility timeout and the next attempt takes over from the job left running.
            log.exception("could not record the result of job %s", item.job_id)
            self._release([held], delay=self.settings.visibility_timeout_seconds)
            return
        if done:
            self._to_delete.append(held)
            if len(self._to_delete) >= 10:
                self._flush_deletes()

    def _backlog(self) -> int:
        return sum(q.qsize() for q in self.inboxes.values())

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
        while not self.stop_event.is_set():
            if inbox.qsize() >= self.max_batch_size:
                time.sleep(0.01)
                continue
            try:
                resp = self.sqs.receive_message(
                    QueueUrl=url,
                    MaxNumberOfMessages=min(10, self.max_batch_size),
                    WaitTimeSeconds=self.settings.receive_wait_seconds,
                    MessageSystemAttributeNames=["ApproximateReceiveCount"],
                )
            except Exception:
                if self.stop_event.is_set():
                    return
                log.exception("receive failed; retrying in 1s")
                time.sleep(1)
                continue
            for m in resp.get("Messages", []):
                held = Held(
                    message_id=m["MessageId"],
                    receipt=m["ReceiptHandle"],
                    body=m["Body"],
                    queue_url=url,
                    receive_count=int(m.get("Attributes", {}).get("ApproximateReceiveCount", 1)),
                )
                self.inflight.add(held)
                if self.stop_event.is_set():
                    self._release([held])
                else:
                    inbox.put(held)
            with self.arrived:
                self.arrived.notify_all()

    def _watch_loop(self) -> None:
        next_beat = time.monotonic() + self.settings.heartbeat_interval
        while True:
            time.sleep(min(CANCEL_POLL_SECONDS, self.settings.heartbeat_interval))
            held = self.inflight.snapshot()
            try:
                if time.monotonic() >= next_beat:
                    next_beat = time.monotonic() + self.settings.heartbeat_interval
                    self._extend(held)
                running = [h for h in held if h.attempts is not None and not h.finished]
                reported = self._flush_progress(running)
                # Jobs that wrote progress learnt of a cancel from that write's condition; only
                # the others need a read.
                self._poll_cancels([h for h in running if h.job_id not in reported])
            except Exception:
                log.exception("heartbeat failed")

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
        not asked to cancel. A job whose write is refused gets its cancel event set (it was
        cancelled, or it is no longer this worker's). Returns the ids written or refused."""
        updates = []
        by_id: dict[str, Held] = {}
        for h in running:
            progress, h.progress = h.progress, None
            if progress is not None and h.job_id and h.attempts is not None:
                tokens, partial = progress
                fields: dict[str, Any] = {"progress_tokens": tokens}
                if partial:
                    fields["output"] = dumps(partial).decode()
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

    # ------------------------------------------------------------------ one job
    def _start(self, held: Held) -> WorkItem | None:
        """Steps 1-3 for one message: the started job's work item, or ``None`` (the message was
        deleted or released)."""
        try:
            msg = JobMessage.model_validate_json(held.body)
        except ValidationError:
            log.error("malformed message %s: releasing it toward the DLQ", held.message_id)
            self._release([held])
            return None
        held.job_id = msg.job_id
        if parse(msg.expires_at) <= now():
            self._expire(msg.job_id)
            self._to_delete.append(held)
            return None
        record = self._mark_running(msg.job_id, redelivered=held.receive_count > 1)
        if record is None:
            self._to_delete.append(held)
            return None
        held.attempts = record["attempts"]
        self._events.append(record)  # job.started, published with the batch's others
        log.info("job %s running (attempt %s)", msg.job_id, record["attempts"])
        try:
            raw = (
                msg.input if msg.input is not None else self.payloads.read_json(msg.input_ref or "")
            )
            item_input = self.spec.input_model.model_validate(raw)
        except ValidationError as exc:
            err = InvalidInput(f"input is not valid for {self.spec.id}: {exc.errors()[0]['msg']}")
            if self._finish(held, record, err):
                self._to_delete.append(held)
            return None
        except JobError as exc:
            if self._finish(held, record, exc):
                self._to_delete.append(held)
            return None

        def on_progress(tokens: int, partial: dict[str, Any]) -> None:
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

    def _expire(self, job_id: str) -> None:
        record = self.store.expire(job_id)
        if record is not None:
            log.info("job %s expired", job_id)
            self.events.publish(record)

    def _mark_running(self, job_id: str, *, redelivered: bool = False) -> dict[str, Any] | None:
        """``queued -> running``; recovers a job whose last worker was lost. ``None`` when the
        job is gone, cancelled or finished (its message is deleted).

        A redelivered message whose job a worker already finished means that worker died
        between the terminal write and deleting the message, maybe before publishing the event:
        the terminal event is published again (at least once; webhook receivers dedupe on the
        ``webhook-id``, which is the same for the same job, event and attempt)."""
        for _ in range(2):
            try:
                return self.store.transition(
                    job_id,
                    from_status=lifecycle.QUEUED,
                    to_status=lifecycle.RUNNING,
                    increment_attempts=True,
                    set_fields={"started_at": iso(now())},
                    remove_fields=("completed_at", "progress_tokens", "output"),
                )
            except TransitionRefused as exc:
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
                if cur["status"] != lifecycle.RUNNING:
                    return None
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

    def _finish(self, held: Held, record: dict[str, Any], result: Result) -> bool:
        """Step 5 for one job. Returns True when its message should be deleted."""
        job_id, attempts = record["job_id"], record["attempts"]
        fields: dict[str, Any] = {"completed_at": iso(now())}
        try:
            if isinstance(result, dict):
                usage = result.get("usage")
                if isinstance(usage, dict) and "completion_tokens" in usage:
                    fields["progress_tokens"] = usage["completion_tokens"]
                body = dumps(result)
                if len(body) > INLINE_OUTPUT_LIMIT_BYTES:
                    fields["output_ref"] = self.payloads.put_output(record["tenant"], job_id, body)
                    new = self._transition(
                        job_id, attempts, lifecycle.SUCCEEDED, fields, ["output"]
                    )
                else:
                    fields["output"] = body.decode()
                    new = self._transition(job_id, attempts, lifecycle.SUCCEEDED, fields)
            elif isinstance(result, WorkerStopping):
                self._requeue(held, job_id, attempts, delay=0)
                return False
            elif isinstance(result, JobCancelled):
                fields["error"] = result.as_dict()
                remove = []
                if result.partial is not None:
                    fields["output"] = dumps(result.partial).decode()
                    usage = result.partial.get("usage")
                    if isinstance(usage, dict) and "completion_tokens" in usage:
                        fields["progress_tokens"] = usage["completion_tokens"]
                else:
                    remove = ["output"]  # a progress snapshot is not a result
                new = self._transition(job_id, attempts, lifecycle.CANCELLED, fields, remove)
            elif result.retryable:
                delay = min(
                    MAX_RETRY_DELAY_SECONDS,
                    self.settings.retry_delay_seconds * 2 ** max(0, attempts - 1),
                )
                log.warning("job %s attempt %s: %s (retrying)", job_id, attempts, result.message)
                self._requeue(held, job_id, attempts, delay=delay)
                return False
            else:
                fields["error"] = result.as_dict()
                # The last progress snapshot is not the job's output.
                new = self._transition(
                    job_id, attempts, lifecycle.FAILED, fields, ["output", "progress_tokens"]
                )
        except TransitionRefused as exc:
            log.warning("%s", exc)
            return True
        log.info("job %s %s", job_id, new["status"])
        self._events.append(new)  # published before the message is deleted
        if self.settings.compute:
            emit_job_metrics(new)
        return True

    def _transition(
        self,
        job_id: str,
        attempts: int,
        to: str,
        fields: dict[str, Any],
        remove: list[str] | None = None,
    ) -> dict[str, Any]:
        return self.store.transition(
            job_id,
            from_status=lifecycle.RUNNING,
            to_status=to,
            attempts=attempts,
            set_fields=fields,
            remove_fields=remove or (),
        )

    def _requeue(self, held: Held, job_id: str, attempts: int, *, delay: float) -> None:
        """``running -> queued`` at this attempt, then make the message visible after ``delay``."""
        self._publish_events()  # keep each job's events in order
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

    def _flush_deletes(self) -> None:
        """Delete finished messages, up to 10 per DeleteMessageBatch call."""
        self._publish_events()  # a job's event goes out before its message is deleted
        held, self._to_delete = self._to_delete, []
        self._deleted_at = time.monotonic()
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
        events, self._events = self._events, []
        if not events:
            return
        try:
            self.events.publish_many(events)
        except Exception:
            log.exception("could not publish %d job events; retrying them one by one", len(events))
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
            self._release(pending)
