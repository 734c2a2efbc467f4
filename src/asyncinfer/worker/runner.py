"""The worker loop: long-poll a model's queue, run jobs in batches, keep messages invisible while
they run, finish jobs with conditional writes, and only then delete their messages.

Per batch of messages (up to the model's ``max_batch_size``):

1. parse each message; a job whose TTL passed while queued becomes ``expired``;
2. ``queued -> running`` (attempts + 1), a conditional write; a cancelled or finished job is
   skipped, a job found ``running`` (its last worker was lost: the message became visible again)
   goes ``running -> queued -> running`` so the lost worker's late writes are refused;
3. publish ``job.started``; read the input (inline or S3) and validate it;
4. run the model handler on the batch;
5. per job: store the output (S3 above 64 KB), make the job terminal (or back to ``queued`` for a
   retryable error), publish the event;
6. delete the finished messages (DeleteMessageBatch). A retryable failure instead leaves its
   message to reappear after a backoff; after maxReceiveCount receives SQS moves it to the
   dead-letter queue, where :mod:`asyncinfer.dlq` fails the job with ``max_attempts``.

A watcher thread extends the visibility timeout of every held message each heartbeat interval
(ChangeMessageVisibilityBatch), so a job that runs longer than the visibility timeout is never
delivered twice, and polls running jobs for cancel requests.

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
    ModelError,
    OutOfMemory,
    TransientError,
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
from asyncinfer.worker.protection import ScaleInProtection

log = logging.getLogger("asyncinfer.worker")

#: How often running jobs are checked for cancel requests, seconds.
CANCEL_POLL_SECONDS = 1.0
#: Longest a retryable failure waits before its message is visible again, seconds.
MAX_RETRY_DELAY_SECONDS = 300


class Worker:
    """One worker process for one model.

    Args:
        settings: runtime settings (queues, table, bucket, topic, timeouts).
        model: the model id this worker serves.
        handler: a built handler (default: the registry's, loaded on :meth:`run`).
        max_batch_size: most jobs per batch (default: the model's ``max_batch_size``).
        max_wait_seconds: how long to gather a batch once one message is in hand.
    """

    def __init__(
        self,
        settings: Settings,
        model: str,
        *,
        handler: ModelHandler | None = None,
        max_batch_size: int | None = None,
        max_wait_seconds: float = 0.05,
    ) -> None:
        self.settings = settings
        self.spec: ModelSpec = MODELS[model]
        self.queue_url = settings.queue_url(model)
        self.handler = handler
        self.max_batch_size = max_batch_size or self.spec.max_batch_size
        self.max_wait_seconds = max_wait_seconds
        self.store = JobStore(settings)
        self.payloads = PayloadStore(settings)
        self.events = EventPublisher(settings, self.payloads)
        self.sqs = clients.client("sqs", settings)
        self.inflight = InFlight()
        self.inbox: queue.Queue[Held] = queue.Queue()
        self.stopping = threading.Event()  # stop polling
        self.interrupt = threading.Event()  # stop running jobs (drain deadline passed)
        self.protection = ScaleInProtection()
        self.jobs_done = 0

    # ------------------------------------------------------------------ lifecycle
    def install_signal_handlers(self) -> None:
        """SIGTERM and SIGINT begin a graceful stop (main thread only)."""
        signal.signal(signal.SIGTERM, lambda *_: self.request_stop())
        signal.signal(signal.SIGINT, lambda *_: self.request_stop())

    def request_stop(self) -> None:
        """Stop polling now; interrupt running jobs after ``drain_seconds``."""
        if self.stopping.is_set():
            return
        log.info("stopping: no more polling; draining for %.0fs", self.settings.drain_seconds)
        self.stopping.set()
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
        """Serve until stopped (or until ``max_jobs`` messages were handled). Returns 0."""
        self.load()
        threads = [
            threading.Thread(target=self._poll_loop, name="poller", daemon=True),
            threading.Thread(target=self._watch_loop, name="watcher", daemon=True),
        ]
        for t in threads:
            t.start()
        log.info("worker ready: model=%s queue=%s", self.spec.id, self.queue_url)
        try:
            while not self.stopping.is_set():
                batch = self._next_batch()
                if batch:
                    self.protection.set(busy=True)
                    self.process(batch)
                    self.jobs_done += len(batch)
                    if max_jobs is not None and self.jobs_done >= max_jobs:
                        self.stopping.set()
                elif self.protection.enabled and not len(self.inflight):
                    self.protection.set(busy=False)
        finally:
            self.stopping.set()
            self._release_unstarted()
            self.protection.set(busy=False)
        log.info("worker stopped")
        return 0

    # ------------------------------------------------------------------ threads
    def _poll_loop(self) -> None:
        while not self.stopping.is_set():
            if self.inbox.qsize() >= self.max_batch_size:
                time.sleep(0.01)
                continue
            try:
                resp = self.sqs.receive_message(
                    QueueUrl=self.queue_url,
                    MaxNumberOfMessages=min(10, self.max_batch_size),
                    WaitTimeSeconds=self.settings.receive_wait_seconds,
                    MessageSystemAttributeNames=["ApproximateReceiveCount"],
                )
            except Exception:
                if self.stopping.is_set():
                    return
                log.exception("receive failed; retrying in 1s")
                time.sleep(1)
                continue
            for m in resp.get("Messages", []):
                held = Held(
                    message_id=m["MessageId"],
                    receipt=m["ReceiptHandle"],
                    body=m["Body"],
                    receive_count=int(m.get("Attributes", {}).get("ApproximateReceiveCount", 1)),
                )
                self.inflight.add(held)
                if self.stopping.is_set():
                    self._release([held])
                else:
                    self.inbox.put(held)

    def _watch_loop(self) -> None:
        next_beat = time.monotonic() + self.settings.heartbeat_interval
        while True:
            time.sleep(min(CANCEL_POLL_SECONDS, self.settings.heartbeat_interval))
            held = self.inflight.snapshot()
            try:
                if time.monotonic() >= next_beat:
                    next_beat = time.monotonic() + self.settings.heartbeat_interval
                    self._extend(held)
                self._poll_cancels([h for h in held if h.attempts is not None])
            except Exception:
                log.exception("heartbeat failed")

    def _extend(self, held: list[Held]) -> None:
        """Extend the visibility timeout of every held message (ChangeMessageVisibilityBatch)."""
        for i in range(0, len(held), 10):
            chunk = held[i : i + 10]
            resp = self.sqs.change_message_visibility_batch(
                QueueUrl=self.queue_url,
                Entries=[
                    {
                        "Id": str(n),
                        "ReceiptHandle": h.receipt,
                        "VisibilityTimeout": self.settings.visibility_timeout_seconds,
                    }
                    for n, h in enumerate(chunk)
                ],
            )
            for f in resp.get("Failed", []):
                log.warning("visibility extension failed: %s", f)

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

    def _next_batch(self) -> list[Held]:
        try:
            first = self.inbox.get(timeout=0.2)
        except queue.Empty:
            return []
        batch = [first]
        deadline = time.monotonic() + self.max_wait_seconds
        while len(batch) < self.max_batch_size:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            try:
                batch.append(self.inbox.get(timeout=left))
            except queue.Empty:
                break
        return batch

    # ------------------------------------------------------------------ one batch
    def process(self, batch: list[Held]) -> None:
        """Run one batch of held messages through the whole job path (steps 1 to 6)."""
        to_delete: list[Held] = []
        started: list[tuple[Held, dict[str, Any], WorkItem]] = []
        for held in batch:
            outcome = self._start(held)
            if outcome is None:
                to_delete.append(held)
            elif isinstance(outcome, tuple):
                started.append((held, *outcome))
            # else: left for redelivery (released)
        if started:
            results = self._run([item for _, _, item in started])
            for (held, record, _), result in zip(started, results, strict=True):
                if self._finish(held, record, result):
                    to_delete.append(held)
        self._delete(to_delete)

    def _start(self, held: Held) -> tuple[dict[str, Any], WorkItem] | bool | None:
        """Steps 1-3 for one message. Returns ``(record, item)`` for a job to run, ``None`` when
        the message is done with (delete it), ``False`` when it was released."""
        try:
            msg = JobMessage.model_validate_json(held.body)
        except ValidationError:
            log.error("malformed message %s: releasing it toward the DLQ", held.message_id)
            self._release([held])
            return False
        held.job_id = msg.job_id
        if parse(msg.expires_at) <= now():
            self._expire(msg.job_id)
            return None
        record = self._mark_running(msg.job_id)
        if record is None:
            return None
        held.attempts = record["attempts"]
        self.events.publish(record)
        log.info("job %s running (attempt %s)", msg.job_id, record["attempts"])
        item_input: Any
        try:
            raw = (
                msg.input if msg.input is not None else self.payloads.read_json(msg.input_ref or "")
            )
            item_input = self.spec.input_model.model_validate(raw)
        except ValidationError as exc:
            err = InvalidInput(f"input is not valid for {self.spec.id}: {exc.errors()[0]['msg']}")
            self._finish(held, record, err)
            return None
        except JobError as exc:
            if self._finish(held, record, exc):
                return None
            return False
        item = WorkItem(
            job_id=msg.job_id,
            input=item_input,
            raw_input=raw,
            attempt=record["attempts"],
            deadline=time.monotonic() + msg.timeout_seconds,
            cancel_event=held.cancel_event,
            stop_event=self.interrupt,
        )
        if record.get("cancel_requested"):
            held.cancel_event.set()
        return record, item

    def _expire(self, job_id: str) -> None:
        try:
            record = self.store.transition(
                job_id,
                from_status=lifecycle.QUEUED,
                to_status=lifecycle.EXPIRED,
                set_fields={
                    "completed_at": iso(now()),
                    "error": {"code": "expired", "message": "job expired in the queue (ttl)"},
                },
            )
        except TransitionRefused:
            return
        log.info("job %s expired", job_id)
        self.events.publish(record)

    def _mark_running(self, job_id: str) -> dict[str, Any] | None:
        """``queued -> running``; recovers a job whose last worker was lost. ``None`` when the
        job is gone, cancelled or finished (its message is deleted)."""
        for _ in range(2):
            try:
                return self.store.transition(
                    job_id,
                    from_status=lifecycle.QUEUED,
                    to_status=lifecycle.RUNNING,
                    increment_attempts=True,
                    set_fields={"started_at": iso(now())},
                    remove_fields=("completed_at",),
                )
            except TransitionRefused as exc:
                cur = exc.current
                if cur is None or lifecycle.is_terminal(cur["status"]):
                    log.info("job %s is %s: skipping", job_id, cur and cur["status"])
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

    def _run(self, items: list[WorkItem]) -> list[Result]:
        """Step 4: the handler on the batch; an exception applies to every item."""
        assert self.handler is not None
        try:
            results = self.handler.predict(items)
            if len(results) != len(items):
                raise ModelError(f"handler returned {len(results)} results for {len(items)} items")
            return results
        except (JobError, WorkerStopping) as exc:
            return [exc] * len(items)
        except MemoryError:
            return [OutOfMemory("the batch did not fit in memory")] * len(items)
        except Exception as exc:
            if type(exc).__name__ == "OutOfMemoryError":  # torch.cuda.OutOfMemoryError
                return [OutOfMemory(str(exc)[:500])] * len(items)
            log.exception("model %s raised", self.spec.id)
            return [TransientError(f"{type(exc).__name__}: {exc}"[:500])] * len(items)

    def _finish(self, held: Held, record: dict[str, Any], result: Result) -> bool:
        """Step 5 for one job. Returns True when its message should be deleted."""
        job_id, attempts = record["job_id"], record["attempts"]
        fields: dict[str, Any] = {"completed_at": iso(now())}
        try:
            if isinstance(result, dict):
                body = dumps(result)
                if len(body) > INLINE_OUTPUT_LIMIT_BYTES:
                    fields["output_ref"] = self.payloads.put_output(record["tenant"], job_id, body)
                else:
                    fields["output"] = body.decode()
                new = self._transition(job_id, attempts, lifecycle.SUCCEEDED, fields)
            elif isinstance(result, WorkerStopping):
                self._requeue(held, job_id, attempts, delay=0)
                return False
            elif isinstance(result, JobCancelled):
                fields["error"] = result.as_dict()
                if result.partial is not None:
                    fields["output"] = dumps(result.partial).decode()
                new = self._transition(job_id, attempts, lifecycle.CANCELLED, fields)
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
                new = self._transition(job_id, attempts, lifecycle.FAILED, fields)
        except TransitionRefused as exc:
            log.warning("%s", exc)
            return True
        log.info("job %s %s", job_id, new["status"])
        self.events.publish(new)
        return True

    def _transition(self, job_id: str, attempts: int, to: str, fields: dict[str, Any]) -> dict:
        return self.store.transition(
            job_id,
            from_status=lifecycle.RUNNING,
            to_status=to,
            attempts=attempts,
            set_fields=fields,
        )

    def _requeue(self, held: Held, job_id: str, attempts: int, *, delay: float) -> None:
        """``running -> queued`` at this attempt, then make the message visible after ``delay``."""
        try:
            back = self.store.transition(
                job_id,
                from_status=lifecycle.RUNNING,
                to_status=lifecycle.QUEUED,
                attempts=attempts,
                remove_fields=("started_at",),
            )
            self.events.publish(back)
        except TransitionRefused as exc:
            log.warning("%s", exc)
        self._release([held], delay=delay)

    # ------------------------------------------------------------------ message ops
    def _release(self, held: Iterable[Held], delay: float = 0) -> None:
        """Make messages visible again after ``delay`` seconds and stop holding them."""
        held = list(held)
        for i in range(0, len(held), 10):
            chunk = held[i : i + 10]
            try:
                self.sqs.change_message_visibility_batch(
                    QueueUrl=self.queue_url,
                    Entries=[
                        {"Id": str(n), "ReceiptHandle": h.receipt, "VisibilityTimeout": int(delay)}
                        for n, h in enumerate(chunk)
                    ],
                )
            except Exception:
                log.exception("could not release messages; they reappear after the timeout")
        for h in held:
            self.inflight.drop(h.message_id)

    def _delete(self, held: list[Held]) -> None:
        for i in range(0, len(held), 10):
            chunk = held[i : i + 10]
            resp = self.sqs.delete_message_batch(
                QueueUrl=self.queue_url,
                Entries=[{"Id": str(n), "ReceiptHandle": h.receipt} for n, h in enumerate(chunk)],
            )
            for f in resp.get("Failed", []):
                log.error("delete failed: %s", f)
        for h in held:
            self.inflight.drop(h.message_id)

    def _release_unstarted(self) -> None:
        pending: list[Held] = []
        while True:
            try:
                pending.append(self.inbox.get_nowait())
            except queue.Empty:
                break
        if pending:
            log.info("releasing %d unstarted messages", len(pending))
            self._release(pending)
