"""What a job's result does to its record: a pure function, no I/O, no other worker module.

:func:`decide` maps ``(result, record)`` to a :class:`Finish` (the terminal transition, and
whether it must be written alone) or a :class:`Requeue` (``running -> queued`` and the message
back after a delay). The runner carries out what it says: it stores a large output in S3
first (:attr:`Finish.upload`), then writes, publishes and deletes.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from asyncinfer.aws.payloads import dumps
from asyncinfer.core import lifecycle
from asyncinfer.core.errors import JobCancelled, JobError, WorkerStopping
from asyncinfer.core.settings import INLINE_OUTPUT_LIMIT_BYTES
from asyncinfer.jobs.record import JobRecord
from asyncinfer.jobs.transitions import Transition

#: Longest a retryable failure waits before its message is visible again, seconds.
MAX_RETRY_DELAY_SECONDS = 300
#: Webhook events whose delivery the dispatcher records on a job before it is terminal.
EARLY_EVENTS = frozenset({"job.queued", "job.started"})


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
    return not (set(events or ()) & EARLY_EVENTS)


@dataclass(frozen=True)
class Finish:
    """The job ends: write ``transition`` (``running -> succeeded|failed|cancelled``).

    Attributes:
        transition: the conditional terminal write (status ``running`` at the job's attempt).
        alone: written alone with UpdateItem, its returned record making the event (the webhook
            dispatcher may have written the record, or a progress write left a count there).
        upload: the output's JSON bytes when larger than ``INLINE_OUTPUT_LIMIT_BYTES`` (64 KB):
            store them in S3 and add ``output_ref`` to the transition before writing.
    """

    transition: Transition
    alone: bool
    upload: bytes | None = None


@dataclass(frozen=True)
class Requeue:
    """The job goes back to the queue at its attempt; its message is visible after ``delay``
    seconds (0 for a worker that gave it back unfinished, a backoff for a retryable error)."""

    job_id: str
    attempts: int
    delay: float
    reason: str = ""


Outcome = Finish | Requeue


def retry_delay(retry_delay_seconds: float, attempts: int) -> float:
    """The backoff before attempt ``attempts + 1``, seconds: ``retry_delay_seconds`` doubled per
    attempt after the first, at most :data:`MAX_RETRY_DELAY_SECONDS`."""
    return min(MAX_RETRY_DELAY_SECONDS, retry_delay_seconds * 2 ** max(0, attempts - 1))


def _tokens(output: Any) -> Any:
    """``output["usage"]["completion_tokens"]`` when there is one, else ``None``."""
    usage = output.get("usage") if isinstance(output, dict) else None
    if isinstance(usage, dict) and "completion_tokens" in usage:
        return usage["completion_tokens"]
    return None


def cost_fields(compute_seconds: float, price_per_hour: float | None) -> dict[str, float]:
    """The job record's ``compute_seconds`` (seconds, rounded to microseconds) and, with a
    ``price_per_hour`` (USD per worker-hour, the catalogue entry's ``compute.price_per_hour``),
    ``cost_usd`` = ``compute_seconds * price_per_hour / 3600`` (USD, 6 significant digits: a
    job's cost can be a fraction of a micro-dollar), as
    shared/spec/models.md ("What a job shows") defines them."""
    seconds = max(0.0, float(compute_seconds))
    fields = {"compute_seconds": round(seconds, 6)}
    if price_per_hour is not None:
        fields["cost_usd"] = float(f"{seconds * float(price_per_hour) / 3600.0:.6g}")
    return fields


def decide(
    result: dict[str, Any] | JobError | WorkerStopping,
    record: JobRecord,
    *,
    completed_at: str,
    retry_delay_seconds: float,
    reported: bool = False,
    compute_seconds: float | None = None,
    price_per_hour: float | None = None,
) -> Outcome:
    """The outcome of one job's ``result``.

    Args:
        result: the handler's output dict, a :class:`JobError` or :class:`WorkerStopping`.
        record: the job's running record (``job_id``, ``attempts``, ``webhook``).
        completed_at: the ISO-8601 time to record as ``completed_at``.
        retry_delay_seconds: the base of a retryable error's backoff (seconds).
        reported: the handler reported progress for it (a count may be on the record).
        compute_seconds: the job's share of the worker's compute time in this attempt, seconds
            (:attr:`~asyncinfer.models.base.WorkItem.compute_seconds`); a terminal write records
            it, with ``cost_usd`` when ``price_per_hour`` (USD per worker-hour) is given
            (:func:`cost_fields`); ``None``: nothing recorded.
        price_per_hour: the entry's ``compute.price_per_hour``, or ``None``.
    """
    job_id, attempts = record["job_id"], record["attempts"]
    fields: dict[str, Any] = {"completed_at": completed_at}
    if compute_seconds is not None:
        fields.update(cost_fields(compute_seconds, price_per_hour))
    remove: list[str] = []
    upload: bytes | None = None
    if isinstance(result, dict):
        to = lifecycle.SUCCEEDED
        tokens = _tokens(result)
        if tokens is not None:
            fields["progress_tokens"] = tokens
        body = dumps(result)
        if len(body) > INLINE_OUTPUT_LIMIT_BYTES:
            upload = body
            remove.append("output")
        else:
            fields["output"] = body.decode()
    elif isinstance(result, WorkerStopping):
        return Requeue(job_id, attempts, 0.0, "worker stopping")
    elif isinstance(result, JobCancelled):
        to = lifecycle.CANCELLED
        fields["error"] = result.as_dict()
        if result.partial is not None:
            fields["output"] = dumps(result.partial).decode()
            tokens = _tokens(result.partial)
            if tokens is not None:
                fields["progress_tokens"] = tokens
        else:
            remove.append("output")  # a progress snapshot is not a result
    elif result.retryable:
        return Requeue(job_id, attempts, retry_delay(retry_delay_seconds, attempts), result.message)
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
        # Not through the outbox: the message is kept until the event is out, and a redelivery
        # publishes it again (asyncinfer.worker.journal).
        outboxed=False,
    )
    # Written alone when the worker cannot know the record it leaves: the webhook dispatcher
    # may have written it, or a progress write may have left a count there.
    settles_progress = "progress_tokens" in fields or "progress_tokens" in remove
    alone = not quiet_webhook(record.get("webhook")) or (reported and not settles_progress)
    return Finish(transition, alone, upload)
