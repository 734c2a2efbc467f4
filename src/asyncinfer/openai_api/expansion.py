"""The batch expander: a Lambda fed by the batch queue (on the local stack the same handler,
fed by :mod:`asyncinfer.local.event_source`). Messages ``{"op", "batch_id"}``:

* ``expand``: a ``validating`` batch's file is read and validated whole (:mod:`.validation`):
  any bad line -> ``failed`` with ``errors.data`` naming the lines; else its requests are stored
  in chunks (:mod:`.chunks`), ``total`` set, and the batch is ``in_progress``. Then chunks are
  turned into jobs until the invocation's time budget is spent, and the rest is enqueued again
  (``expand``), so 50,000 lines never meet an API or Lambda timeout. A chunk is cut into groups
  of :data:`GROUP_LINES` lines, :data:`GROUP_THREADS` side by side, each made in bulk by
  :class:`~.line_jobs.LineJobs` (line items, then records, messages, ``job.queued`` and
  confirms a few AWS requests per hundred lines: about 0.3 a line amortised instead of the
  9 a line of :meth:`JobService.submit`; ``bench/batch_expansion.py`` prints them). Each line's
  job id is derived from the batch id and its ``custom_id``, so a re-run of a chunk (a crash, a
  duplicate message) finds the jobs it made and makes only the missing ones; ``next_line`` on
  the batch moves on only after a chunk (conditional on where it was). A chunk's groups that
  would begin more than :data:`LATE_SECONDS` past the invocation's deadline are left to the next
  invocation (``next_line`` moves to the first of their lines; the next invocation goes on from
  there), so a slow chunk cannot run the invocation past the function's timeout.
  Jobs run at the batch's priority, ``metadata`` ``batch_id`` and ``custom_id``, with the
  window as their TTL (the window's end cancels what is left).
* ``end``: a batch being ended early (``ending`` set: ``cancelled`` by the client, ``expired`` by
  ``check``) stops expanding and its lines not finished are cancelled through
  :meth:`JobService.cancel` (running ones stop at their next step); the last one's event
  finalizes the batch (:mod:`.finalize`).
* ``check``: one chain per batch, begun at create, at most every 15 minutes (SQS's largest
  delay) and at the window's end: a batch past ``expires_at`` is ended ``expired``; a batch that is
  ready is finalized (a missed event); a finalization that died is run again.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from functools import lru_cache
from typing import Any

from asyncinfer.aws import clients
from asyncinfer.core.errors import Conflict, NotFound, TransitionRefused
from asyncinfer.core.settings import get_settings
from asyncinfer.core.settings_parts import OpenAISettings
from asyncinfer.jobs.service import JobService
from asyncinfer.openai_api import batch_store as bs
from asyncinfer.openai_api.batch_events import publish_batch_event
from asyncinfer.openai_api.batch_store import BatchStore
from asyncinfer.openai_api.batches import enqueue
from asyncinfer.openai_api.chunks import read_chunk, write_chunks
from asyncinfer.openai_api.files import FileStore
from asyncinfer.openai_api.finalize import finalize, maybe_finalize
from asyncinfer.openai_api.line_jobs import LineJobs, idempotency_key, line_job_id
from asyncinfer.openai_api.validation import MAX_FILE_BYTES, validate_file

log = logging.getLogger("asyncinfer.openai.expansion")

__all__ = ["Expander", "handler", "idempotency_key", "line_job_id"]

#: Jobs cancelled side by side (boto3 clients are thread-safe).
SUBMIT_THREADS = 16
#: Lines submitted together (:class:`BulkSubmitter`: one transaction of their records, one of
#: their confirms): TransactWriteItems' 100 actions.
GROUP_LINES = 100
#: Groups of a chunk submitted side by side.
GROUP_THREADS = 4
#: Seconds of an invocation kept back from expanding (writes, the next message).
RESERVE_SECONDS = 30.0
#: Seconds after the deadline within which a chunk's lines may still begin; later ones wait for
#: the next invocation (which goes on from the first of them), so that a chunk
#: slower than the reserve (a busy emulator: 500 lines took 89 s) never runs the invocation past
#: the function's timeout.
LATE_SECONDS = 10.0
#: Time budget of one invocation without a Lambda context, seconds.
DEFAULT_BUDGET_SECONDS = 60.0
#: A finalization older than this is taken to have died and is run again, seconds.
FINALIZE_STALE_SECONDS = 900
#: Delay of the check of a batch being ended, seconds.
ENDING_CHECK_SECONDS = 30


class Expander:
    """Runs the batch queue's operations (see the module's docstring)."""

    def __init__(self, settings: OpenAISettings, jobs: JobService | None = None) -> None:
        self.settings = settings
        self.store = BatchStore(settings)
        self.jobs = jobs or JobService(settings.api)
        self.lines = LineJobs(self.store, self.jobs)
        self.sqs = clients.client("sqs", settings)
        self.files = FileStore(clients.client("s3", settings), settings.bucket)
        #: ``time.monotonic()`` time by which the current operation stops (see :meth:`handle`).
        self.deadline = float("inf")

    def handle(self, message: dict[str, Any], deadline: float) -> None:
        """Run one message; ``deadline`` is a ``time.monotonic()`` time to stop expanding by.

        Raises:
            InternalError: a job could not be submitted (the message is retried).
        """
        self.deadline = deadline
        record = self.store.get(str(message.get("batch_id", "")))
        if record is None:
            log.warning("batch queue message for no batch: %s", message)
            return
        op = message.get("op")
        if op == "expand":
            self.expand(record, deadline)
        elif op == "end":
            self.end(record)
        elif op == "check":
            self.check(record)
        else:
            log.error("unknown batch queue op: %s", message)

    # ------------------------------------------------------------------ expand
    def validate(self, record: dict[str, Any]) -> dict[str, Any] | None:
        """Validate a ``validating`` batch's file; returns the record ``in_progress``, or
        ``None`` where it failed (or moved on meanwhile)."""
        batch_id = record["job_id"]
        try:
            data = self.files.read(
                record["owner"], record["input_file_id"], max_bytes=MAX_FILE_BYTES
            )
            lines, errors = validate_file(data, record["endpoint"], self.settings.models)
        except NotFound:
            lines, errors = [], [_error("file_not_found", "the input file is gone")]
        except ValueError as exc:
            lines, errors = [], [_error("too_large", str(exc))]
        if errors:
            try:
                failed = self.store.transition(
                    batch_id,
                    from_status=bs.VALIDATING,
                    to_status=bs.FAILED,
                    set_fields={"errors": json.dumps(errors)},
                )
            except TransitionRefused:
                return None
            publish_batch_event(self.settings, failed)
            return None
        size = max(1, self.settings.batch_chunk_lines)
        write_chunks(self.settings, record["owner"], batch_id, lines, size)
        try:
            return self.store.transition(
                batch_id,
                from_status=bs.VALIDATING,
                to_status=bs.IN_PROGRESS,
                set_fields={"total": len(lines), "model": lines[0].model, "chunk_lines": size},
            )
        except TransitionRefused:
            return None

    def expand(self, record: dict[str, Any], deadline: float) -> None:
        """Validate (if needed) and expand chunks until ``deadline``; then enqueue the rest."""
        self.deadline = deadline
        if record["status"] == bs.VALIDATING:
            validated = self.validate(record)
            if validated is None:
                current = self.store.get(record["job_id"])
                if current is not None and current.get("ending"):
                    self.end(current)
                return
            record = validated
        while record["status"] == bs.IN_PROGRESS and not record.get("expanded"):
            if record.get("ending"):
                self.end(record)
                return
            if time.monotonic() >= deadline:
                enqueue(self.sqs, self.settings, {"op": "expand", "batch_id": record["job_id"]})
                return
            record = self.expand_chunk(record)
        if record.get("ending"):
            self.end(record)

    def expand_chunk(self, record: dict[str, Any]) -> dict[str, Any]:
        """Turn the chunk at ``next_line`` into jobs; returns the record after it."""
        batch_id, tenant = record["job_id"], record["owner"]
        size = int(record["chunk_lines"])
        start, total = int(record.get("next_line", 0)), int(record["total"])
        if start >= total:
            return self._expanded(record)
        k = start // size
        chunk = read_chunk(self.settings, record, k)
        todo = [(k * size + n, entry) for n, entry in enumerate(chunk) if k * size + n >= start]
        ttl_epoch = int(record.get("ttl") or 0) or int(time.time()) + 30 * 86400
        # The whole window, not what is left of it: the job's body (and so its idempotency key's
        # digest) must be the same when a chunk is run again; the window's end cancels the rest.
        ttl = max(10, min(259200, int(record["expires_at"]) - int(record["created_at"])))
        priority = str(record.get("priority", "low"))
        groups = [todo[i : i + GROUP_LINES] for i in range(0, len(todo), GROUP_LINES)]
        with ThreadPoolExecutor(max_workers=GROUP_THREADS) as pool:
            results = list(
                pool.map(lambda g: self._group(record, priority, ttl, ttl_epoch, g), groups)
            )
        errors = [r for r in results if isinstance(r, BaseException)]
        if errors:  # the chunk is run again later, idempotently
            raise errors[0]
        late = [g[0][0] for g, r in zip(groups, results, strict=True) if r is _LATE]
        made = [j for r in results if isinstance(r, list) for j in r]
        # Out of time: the lines before the first late group have their jobs (the pool begins
        # the groups in order, so the late ones are the last); the next invocation goes on there.
        self.store.advance(batch_id, start, min(late) if late else k * size + len(chunk))
        current = self.store.get(batch_id) or record
        if current.get("ending"):
            self._cancel_jobs(tenant, made)
        return current

    def _group(
        self,
        record: dict[str, Any],
        priority: str,
        ttl: int,
        ttl_epoch: int,
        group: list[tuple[int, list[Any]]],
    ) -> list[str] | BaseException | object:
        """Turn ``group`` (``(index, chunk entry)``: :data:`GROUP_LINES` lines) into jobs, in
        one of the chunk's threads: returns the ids of its lines' jobs, the exception that must
        make the chunk run again, or :data:`_LATE` (nothing written) once
        :data:`LATE_SECONDS` past the deadline."""
        if time.monotonic() >= self.deadline + LATE_SECONDS:
            return _LATE
        try:
            return self.lines.submit_group(record, priority, ttl, ttl_epoch, group)
        except Exception as exc:  # an AWS error: retried with the chunk
            return exc

    def _expanded(self, record: dict[str, Any]) -> dict[str, Any]:
        """Expansion is over: note it and finalize if every line is already done."""
        self.store.update(record["job_id"], {"expanded": True})
        maybe_finalize(self.settings, record["job_id"])
        return self.store.get(record["job_id"]) or record

    # ------------------------------------------------------------------ end and check
    def end(self, record: dict[str, Any]) -> None:
        """Stop expanding a batch being ended and cancel its lines not finished."""
        batch_id = record["job_id"]
        if record["status"] in bs.TERMINAL or record["status"] == bs.FINALIZING:
            return
        self.store.update(batch_id, {"expanded": True})
        counted = self.store.counted(record)
        open_jobs = [
            str(ln["line_job"])
            for ln in self.store.lines(batch_id)
            if ln.get("line_job") and not ln.get("done") and int(ln["idx"]) not in counted
        ]
        if not self._cancel_jobs(record["owner"], open_jobs):
            # Out of time (tens of thousands of lines): the rest in another invocation.
            enqueue(self.sqs, self.settings, {"op": "end", "batch_id": batch_id})
            return
        maybe_finalize(self.settings, batch_id)

    def _cancel_jobs(self, tenant: str, job_ids: list[str]) -> bool:
        """Cancel jobs side by side until this invocation's deadline; returns whether every one
        was cancelled (or was already terminal)."""

        def cancel(job_id: str) -> None:
            with contextlib.suppress(Conflict, NotFound):  # terminal: its event counts it
                self.jobs.cancel(tenant, job_id)

        step = SUBMIT_THREADS * 4
        with ThreadPoolExecutor(max_workers=SUBMIT_THREADS) as pool:
            for i in range(0, len(job_ids), step):
                if time.monotonic() >= self.deadline:
                    return False
                list(pool.map(cancel, job_ids[i : i + step]))
        return True

    def check(self, record: dict[str, Any]) -> None:
        """The batch's periodic check (see the module's docstring); enqueues the next one
        unless the batch ended."""
        batch_id = record["job_id"]
        status = record["status"]
        if status in bs.TERMINAL:
            return
        now = time.time()
        if status == bs.FINALIZING:
            if now - int(record.get("finalizing_at") or now) >= FINALIZE_STALE_SECONDS:
                finalize(self.settings, record)
                return
        elif not record.get("ending") and now >= int(record["expires_at"]):
            if self.store.update(batch_id, {"ending": bs.EXPIRED}, status=status):
                record = self.store.get(batch_id) or record
                self.end(record)
        else:
            maybe_finalize(self.settings, batch_id)
        current = self.store.get(batch_id) or record
        if current["status"] in bs.TERMINAL:
            return
        delay = (
            ENDING_CHECK_SECONDS
            if current.get("ending") or current["status"] == bs.FINALIZING
            else max(1, int(current["expires_at"]) - int(time.time()))
        )
        enqueue(self.sqs, self.settings, {"op": "check", "batch_id": batch_id}, delay=delay)


#: What :meth:`Expander._group` returns for lines it left to the next invocation.
_LATE = object()


def _error(code: str, message: str) -> dict[str, Any]:
    return {"code": code, "message": message, "param": None, "line": None}


@lru_cache(maxsize=1)
def _expander() -> Expander:
    return Expander(get_settings().openai)


def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    """The expander Lambda (SQS event source with ``ReportBatchItemFailures``, batch size 1):
    each record is one operation; one that raises is reported failed and comes back."""
    remaining = getattr(context, "get_remaining_time_in_millis", None)
    left = remaining() / 1000 if callable(remaining) else None
    budget = left - min(RESERVE_SECONDS, left / 3) if left is not None else None
    deadline = time.monotonic() + (budget if budget and budget > 0 else DEFAULT_BUDGET_SECONDS)
    failures = []
    for rec in event.get("Records", []):
        try:
            _expander().handle(json.loads(rec["body"]), deadline)
        except Exception:
            log.exception("batch operation failed: %.200s", rec.get("body"))
            failures.append({"itemIdentifier": rec["messageId"]})
    return {"batchItemFailures": failures}
