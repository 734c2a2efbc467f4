"""Counting batch lines as their jobs end, and finalizing batches (spec openai.md, "Batches").

* :func:`count_events`: the terminal job events (from the batch-events queue, an SQS queue
  subscribed to the topic, as the webhook dispatcher's is) of line jobs (``metadata.batch_id``,
  ``metadata.custom_id``) count their lines once (:meth:`BatchStore.count_lines`, exact without
  transactions: :mod:`.batch_counts`): ``succeeded`` in ``completed``, every other terminal
  status in ``failed``. A retried or duplicated event, or a job that is not a line of that
  batch, counts nothing. The counter Lambda counts the events of one invocation (up to its
  trigger's batch size) together: one read of each batch, one BatchGetItem of their lines, one
  counter write per chunk and one readiness check, instead of a read, a two-item transaction
  and a readiness check per event as before (that path's transactions cost the local stack's
  emulator a copy of the whole job table each: :mod:`.batch_counts`).
* :func:`maybe_finalize`: once expansion is over and every line that has a job is counted, the
  batch moves to ``finalizing`` (a conditional write: one caller wins; the files' counts are
  final), its output and error files are written in OpenAI's layout
  (:mod:`.layout`) through :class:`FileStore` (purpose ``batch_output``), and it ends
  ``completed``, or the ``expired`` / ``cancelled`` its ``ending`` says, with
  ``output_file_id`` / ``error_file_id``; then its event is published (:mod:`.batch_events`).
  Lines never expanded (a batch ended early) are in the error file as ``batch_expired`` /
  ``batch_cancelled`` and counted ``failed``.
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any

from asyncinfer.aws import clients
from asyncinfer.aws.payloads import PayloadStore
from asyncinfer.core.errors import TransitionRefused
from asyncinfer.core.lifecycle import is_terminal
from asyncinfer.core.settings_parts import OpenAISettings
from asyncinfer.jobs.record import JobRecord
from asyncinfer.jobs.store import JobStore
from asyncinfer.openai_api import batch_store as bs
from asyncinfer.openai_api.batch_events import publish_batch_event
from asyncinfer.openai_api.batch_store import BatchStore
from asyncinfer.openai_api.chunks import read_chunk
from asyncinfer.openai_api.files import FileStore
from asyncinfer.openai_api.layout import error_line, jsonl, output_line

log = logging.getLogger("asyncinfer.openai.finalize")

#: How long finalization waits for the line index to show every line (a GSI is eventually
#: consistent), seconds, before it hands the work back to be retried.
LINES_WAIT_SECONDS = 10.0


class LinesNotVisible(Exception):
    """The line index does not show every line yet; retry later (the message comes back)."""


def count_event(settings: OpenAISettings, event: dict[str, Any], tenant: str | None = None) -> bool:
    """Count the line of a terminal job ``event`` (api.md's body); returns whether it counted.
    ``tenant``: the event's ``tenant`` attribute, checked against the batch's owner."""
    return count_events(settings, [(event, tenant)]) == 1


def _line_of(event: dict[str, Any]) -> tuple[str, str, str, str] | None:
    """``(batch id, custom_id, job id, status)`` of a terminal job event of a batch line."""
    data = event.get("data") or {}
    status = data.get("status")
    meta = data.get("metadata") or {}
    batch_id, custom_id, job_id = meta.get("batch_id"), meta.get("custom_id"), data.get("id")
    if not (isinstance(status, str) and is_terminal(status) and batch_id and custom_id and job_id):
        return None
    return str(batch_id), str(custom_id), str(job_id), status


def count_events(settings: OpenAISettings, events: list[tuple[dict[str, Any], str | None]]) -> int:
    """Count the lines of terminal job events ``(event, tenant attribute)`` (one read of each
    batch, one counter write per chunk: :meth:`BatchStore.count_lines`), then finalize each
    batch that counted a line if it is ready. Returns how many lines counted now.

    Raises:
        LinesNotVisible, and what DynamoDB raises: nothing of a batch whose write failed was
        counted (the caller retries every event, and lines counted meanwhile count nothing).
    """
    by_batch: dict[str, list[tuple[str, str, str, str | None]]] = {}
    for event, tenant in events:
        line = _line_of(event)
        if line is not None:
            batch_id, custom_id, job_id, status = line
            by_batch.setdefault(batch_id, []).append((custom_id, job_id, status, tenant))
    store = BatchStore(settings)
    counted = 0
    for batch_id, lines in by_batch.items():
        rec = store.get(batch_id)
        if rec is None:
            continue
        owner = rec.get("owner")
        ended = [(c, j, s) for c, j, s, t in lines if t is None or t == owner]
        n = store.count_lines(rec, ended)
        counted += n
        if n:
            maybe_finalize(settings, batch_id)
    return counted


def ready(record: dict[str, Any]) -> bool:
    """Whether every line of the batch that has a job is counted and expansion is over."""
    done = int(record.get("completed", 0)) + int(record.get("failed", 0))
    running = record["status"] in (bs.IN_PROGRESS, bs.CANCELLING)
    # A batch ended while it was still validating has no lines at all.
    unvalidated = record["status"] == bs.VALIDATING and bool(record.get("ending"))
    return (
        (running or unvalidated)
        and bool(record.get("expanded"))
        and done >= int(record.get("next_line", 0))
    )


def maybe_finalize(settings: OpenAISettings, batch_id: str) -> dict[str, Any] | None:
    """Finalize the batch if it is :func:`ready`; returns the ended record, else ``None``."""
    store = BatchStore(settings)
    record = store.get(batch_id)
    if record is None or not ready(record):
        return None
    try:
        record = store.transition(batch_id, from_status=record["status"], to_status=bs.FINALIZING)
    except TransitionRefused:
        return None  # another caller finalizes it
    return finalize(settings, record)


def finalize(settings: OpenAISettings, record: dict[str, Any]) -> dict[str, Any]:
    """Write the output and error files of a ``finalizing`` batch and end it.

    Raises:
        LinesNotVisible: the line index lags behind the batch (the caller retries later).
    """
    store = BatchStore(settings)
    batch_id, tenant = record["job_id"], record["owner"]
    lines = _all_lines(store, record)
    # Strongly consistent: the job whose event woke this ended a moment ago (an eventually
    # consistent read may still show it running, or not at all: its answer lost for good).
    jobs = JobStore(settings).get_many(
        [ln["line_job"] for ln in lines if ln.get("line_job")], consistent=True
    )
    payloads = PayloadStore(settings)
    endpoint = record["endpoint"]
    outputs: list[dict[str, Any]] = []
    errors: list[dict[str, Any]] = []
    for ln in sorted(lines, key=lambda x: int(x.get("line", 0))):
        job = jobs.get(str(ln.get("line_job")))
        cid = ln["custom_id"]
        if job is None and ln.get("error_code"):
            errors.append(error_line(cid, None, ln["error_code"], ln.get("error_message", "")))
            continue
        if job is None:
            errors.append(error_line(cid, None, "internal", "the line's job was not found"))
            continue
        if job["status"] == "succeeded":
            try:
                output = _output(job, payloads)
            except Exception as exc:  # an unreadable output is the line's error, not the batch's
                errors.append(error_line(cid, job["job_id"], "internal", str(exc)[:500]))
                continue
            outputs.append(
                output_line(endpoint, cid, job["job_id"], job["model"], _created(job), output)
            )
        else:
            err = job.get("error") or {}
            code = err.get("code") or job["status"]
            if job["status"] in ("cancelled", "expired") and record.get("ending"):
                code = f"batch_{record['ending']}"
            errors.append(error_line(cid, job["job_id"], code, err.get("message") or code))
    ending = record.get("ending")
    unexpanded = _unexpanded(settings, record, ending) if ending else []
    errors.extend(unexpanded)
    files = FileStore(clients.client("s3", settings), settings.bucket)
    fields: dict[str, Any] = {}
    if outputs:
        fields["output_file_id"] = files.create(
            tenant, jsonl(outputs), filename=f"{batch_id}_output.jsonl", purpose="batch_output"
        )["id"]
    if errors:
        fields["error_file_id"] = files.create(
            tenant, jsonl(errors), filename=f"{batch_id}_error.jsonl", purpose="batch_output"
        )["id"]
    # The counts are the files' (the counters stopped when the batch left in_progress).
    fields["completed"], fields["failed"] = len(outputs), len(errors)
    final = ending or bs.COMPLETED
    ended = store.transition(
        batch_id, from_status=bs.FINALIZING, to_status=final, set_fields=fields
    )
    try:
        publish_batch_event(settings, ended)
    except Exception:
        log.exception("the end event of batch %s was not published", batch_id)
    return ended


def _all_lines(store: BatchStore, record: dict[str, Any]) -> list[dict[str, Any]]:
    want = int(record.get("next_line", 0))
    deadline = time.monotonic() + LINES_WAIT_SECONDS
    while True:
        with_jobs = [
            ln
            for ln in store.lines(record["job_id"])
            if int(ln.get("idx", want)) < want
            and (ln.get("line_job") or ln.get("error_code") or ln.get("done"))
        ]
        if len(with_jobs) >= want or time.monotonic() >= deadline:
            break
        time.sleep(0.5)
    if len(with_jobs) < want:
        raise LinesNotVisible(f"batch {record['job_id']}: {len(with_jobs)} of {want} lines seen")
    return with_jobs


def _unexpanded(
    settings: OpenAISettings, record: dict[str, Any], ending: str
) -> list[dict[str, Any]]:
    """Error lines of the lines that never got a job (a batch ended before its expansion)."""
    start, total = int(record.get("next_line", 0)), int(record.get("total", 0))
    size = int(record.get("chunk_lines") or settings.batch_chunk_lines)
    out: list[dict[str, Any]] = []
    message = "the batch expired before this request ran"
    if ending == bs.CANCELLED:
        message = "the batch was cancelled before this request ran"
    for k in range(start // size, (total + size - 1) // size if total else 0):
        for n, entry in enumerate(read_chunk(settings, record, k)):
            if k * size + n >= start:
                out.append(error_line(entry[1], None, f"batch_{ending}", message))
    return out


def _output(job: JobRecord, payloads: PayloadStore) -> Any:
    if job.get("output"):
        return json.loads(job["output"])
    if job.get("output_ref"):
        return payloads.read_json(job["output_ref"])
    return None


def _created(job: JobRecord) -> int:
    from asyncinfer.core.timeutil import parse

    stamp = job.get("completed_at") or job.get("created_at")
    return int(parse(stamp).timestamp()) if stamp else int(time.time())


def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    """The batch counter Lambda, fed by the batch-events queue (an SQS queue subscribed to the
    topic with raw delivery; ``ReportBatchItemFailures``): the terminal job events of batch
    lines in the invocation's records are counted together (:func:`count_events`); when that
    raises (e.g. :class:`LinesNotVisible`, an AWS error), every record of the batch of lines it
    was counting comes back (those counted already count nothing the next time)."""
    from asyncinfer.core.settings import get_settings

    settings = get_settings().openai
    failures: list[dict[str, str]] = []
    parsed: dict[str, list[tuple[str, tuple[dict[str, Any], str | None]]]] = {}
    for rec in event.get("Records", []):
        try:
            body = json.loads(rec["body"])
            if isinstance(body, dict) and body.get("Type") == "Notification":
                body = json.loads(body["Message"])
            tenant = (rec.get("messageAttributes") or {}).get("tenant", {}).get("stringValue")
            if isinstance(body, dict) and str(body.get("type", "")).startswith("job."):
                line = _line_of(body)
                key = line[0] if line else ""
                parsed.setdefault(key, []).append((rec["messageId"], (body, tenant)))
        except Exception:
            log.exception("batch event not counted: %.200s", rec.get("body"))
            failures.append({"itemIdentifier": rec["messageId"]})
    for key, items in parsed.items():
        if not key:
            continue
        try:
            count_events(settings, [e for _, e in items])
        except Exception:
            log.exception("batch events of %s not counted (%d records)", key, len(items))
            failures.extend({"itemIdentifier": mid} for mid, _ in items)
    return {"batchItemFailures": failures}
