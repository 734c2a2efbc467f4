"""The sweeper. Four sweeps, each through the store's conditional transitions:

* expiry: queued jobs whose ``ttl_seconds`` passed before their first attempt become
  ``expired`` (error code ``expired``) and ``job.expired`` is published, even while no worker
  runs and nobody reads them. The job's SQS message stays in the queue; a worker that dequeues it
  later finds the job terminal and deletes the message without running it. Workers and ``GET``
  also expire due jobs they meet, so the sweeper's period bounds the delay, not correctness.
* outbox: events still pending in a record after ``Settings.outbox_grace_seconds`` (a failed
  publish, a writer that died before publishing) are published again
  (:mod:`asyncinfer.jobs.outbox`);
* lease takeover: running jobs whose lease lapsed (no live worker: killed, a SageMaker bridge
  that died before invoking the endpoint, a completion notification that never came) are taken
  back (:mod:`asyncinfer.jobs.leases`): requeued for another attempt, or failed with
  ``max_attempts``, or cancelled when a cancel was requested; their event is published. A worker
  job's message comes back by itself once its visibility timeout runs out (its worker no longer
  extends it); a SageMaker job's message was acknowledged when the bridge invoked the endpoint
  (the record has an ``inference_id``), so the sweeper sends the job's message again, built from
  the record, *before* the takeover write: a bridge that gets it first finds the job running with
  a lapsed lease and takes it back itself, and if the takeover write then fails the message still
  exists;
* lost hand-backs: a job handed back to the queue after it started (``queued``, attempts > 0: a
  retry, a takeover, a worker's recovery or stop) is in neither sweep above, so a lost message
  would leave it ``queued`` for ever. The hand-back keeps it in the running-lease index under the
  mark ``requeued`` with a requeue deadline (:mod:`asyncinfer.jobs.record`); a job still queued
  at that attempt past it gets its message sent again, built from the record, and a new
  deadline (:func:`resend_lost`). A duplicate is harmless: the worker that meets a job running
  under a live lease from another message deletes it (:mod:`asyncinfer.worker.starts`).

Each sweep runs even when another one failed (:func:`handler`).

In AWS a Lambda runs it every minute (EventBridge schedule); the local stack runs it every
``Settings.sweep_seconds`` (5 s).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.utilities.typing import LambdaContext

from asyncinfer.aws import clients
from asyncinfer.core import lifecycle
from asyncinfer.core.errors import SweepFailed, TransitionRefused
from asyncinfer.core.observability import instrument, powertools
from asyncinfer.core.settings import get_settings
from asyncinfer.core.settings_parts import SweeperSettings
from asyncinfer.core.timeutil import now, parse
from asyncinfer.jobs import leases, outbox, transitions
from asyncinfer.jobs.events import EventPublisher
from asyncinfer.jobs.messages import JobMessage
from asyncinfer.jobs.record import LEASE_FIELD, REQUEUED_MARK, JobRecord
from asyncinfer.jobs.store import JobStore

log = logging.getLogger("asyncinfer.functions.sweeper")

#: Lapsed jobs read from the running-lease index at a time (one Query page).
LEASE_PAGE = 100


def expire_due(settings: SweeperSettings, *, limit: int = 500) -> list[str]:
    """Expire up to ``limit`` queued jobs past their TTL; returns their ids. Each expiry is a
    conditional ``queued -> expired`` write, so a job that started meanwhile is left alone."""
    store = JobStore(settings)
    events = EventPublisher(settings)
    expired: list[str] = []
    while len(expired) < limit:
        ids = store.queued_past_expiry(int(time.time()), limit=min(100, limit - len(expired)))
        if not ids:
            break
        progressed = False
        for job_id in ids:
            record = store.expire(job_id)
            if record is None:
                continue
            progressed = True
            _publish(events, record)
            expired.append(job_id)
        if not progressed:
            break
    if expired:
        log.info("expired %d queued jobs past their ttl", len(expired))
    return expired


def take_back_lapsed(settings: SweeperSettings, *, limit: int = 500) -> list[JobRecord]:
    """Take back up to ``limit`` running jobs whose lease lapsed (see the module docstring);
    returns their records after the takeover (``queued``, ``failed`` or ``cancelled``). Each is
    a conditional write, so a job whose worker renewed its lease meanwhile is left alone."""
    store = JobStore(settings)
    events = EventPublisher(settings)
    sqs = clients.client("sqs", settings)
    taken: list[JobRecord] = []
    seen: set[str] = set()
    now_epoch = int(time.time())
    start: dict[str, Any] | None = None
    # One pass over the index, page after page: a page of jobs that cannot be taken back (an
    # AWS fault, a record the takeover cannot handle) no longer hides the lapsed jobs behind it
    # (before, each round read the first page again and stopped when all of it was seen).
    for _ in range(max(1, limit)):
        page, start = store.running_past_lease_page(
            now_epoch, limit=min(LEASE_PAGE, limit - len(taken)), start=start
        )
        ids = [j for j in page if j not in seen]
        seen.update(ids)
        for job_id in ids:
            try:
                record = _take_back_one(store, sqs, settings, job_id, now_epoch)
            except Exception:  # one job's AWS fault must not stop the sweep; next round retries
                log.exception("could not take back job %s", job_id)
                continue
            if record is not None:
                _publish(events, record)
                taken.append(record)
        if start is None or len(taken) >= limit:
            break
    if taken:
        log.info("took back %d running jobs whose lease lapsed", len(taken))
    return taken


def republish_pending(settings: SweeperSettings, *, limit: int = 500) -> int:
    """Publish again the events still pending in records' outboxes after
    ``Settings.outbox_grace_seconds`` (:func:`asyncinfer.jobs.outbox.republish_due`): events whose
    publish failed, or whose writer died before it published. Returns how many."""
    store = JobStore(settings)
    events = EventPublisher(settings, store=store)
    return outbox.republish_due(store, events, settings.outbox_grace_seconds, limit=limit)


def _publish(events: EventPublisher, record: JobRecord) -> None:
    """Publish the event of a transition the sweep wrote; an SNS failure is logged, never
    raised: the write is done, and the sweep goes on with the other jobs (before, one failed
    publish in an SNS outage ended the round, leaving the other lapsed or expired jobs as they
    were). The event stays in the record's outbox, and a later sweep publishes it
    (:func:`republish_pending`)."""
    try:
        events.publish(record)
    except Exception:
        log.exception(
            "job %s is %s but its event was not published", record["job_id"], record["status"]
        )


def _take_back_one(
    store: JobStore, sqs: Any, settings: SweeperSettings, job_id: str, now_epoch: int
) -> JobRecord | None:
    record = store.get(job_id)
    if record is None or not leases.lease_lapsed(record, now_epoch):
        return None
    transition = leases.takeover(record, now_epoch, settings.max_receive_count)
    if transition.to_status == lifecycle.QUEUED and _message_acknowledged(record):
        _send_again(sqs, settings, record)
    return leases.take_back(store, record, now_epoch, settings)


def _send_again(sqs: Any, settings: SweeperSettings, record: JobRecord) -> None:
    """Send the job's message again, built from its record, to its model's queue."""
    message = message_from_record(record)
    sqs.send_message(
        QueueUrl=settings.queue_url(record["model"], record.get("priority") or "normal"),
        MessageBody=message.dumps(),
        MessageGroupId=message.group_id,  # fair queues (asyncinfer.jobs.messages)
    )


def resend_lost(settings: SweeperSettings, *, limit: int = 500) -> dict[str, list[str]]:
    """The safety net of hand-backs (see the module docstring): up to ``limit`` jobs handed back
    after they started whose requeue deadline passed while they stayed queued at that attempt.
    Each one is

    * ``failed`` (``max_attempts``) when its ``attempts`` reached ``Settings.max_receive_count``
      (no attempt is left to start);
    * else sent its message again, built from the record, when the record names its input
      (``input_ref``: inputs stored in S3, and every SageMaker job), and given a new deadline
      (:meth:`JobStore.requeue_deadline`): at most one duplicate message per grace;
    * else (an inline input the record does not hold) left for its message while its TTL runs
      (new deadline), and ``failed`` (``max_attempts``) once the TTL passed: its message cannot
      be rebuilt.

    A job with attempts left whose queue has visible messages (``ApproximateNumberOfMessages``
    > 0, read once per queue and sweep) is only given a new deadline: its message may be
    waiting behind that backlog, and neither a duplicate (which would inflate the backlog metric
    workers scale on) nor a failure is called for while the queue is not drained.

    Every write is conditional on the job still queued at that attempt (a start meanwhile wins).
    Returns ``{"resent": [ids], "failed": [ids]}``. One job's AWS fault is logged and skipped."""
    store = JobStore(settings)
    events = EventPublisher(settings)
    sqs = clients.client("sqs", settings)
    out: dict[str, list[str]] = {"resent": [], "failed": []}
    seen: set[str] = set()
    now_epoch = int(time.time())
    start: dict[str, Any] | None = None
    backlog = _Backlog(sqs)
    for _ in range(max(1, limit)):
        page, start = store.running_past_lease_page(
            now_epoch, limit=min(LEASE_PAGE, limit), start=start, mark=REQUEUED_MARK
        )
        for job_id in [j for j in page if j not in seen]:
            seen.add(job_id)
            try:
                what = _resend_one(store, events, sqs, settings, job_id, now_epoch, backlog)
            except Exception:  # one job's AWS fault must not stop the sweep; next round retries
                log.exception("could not resend the message of job %s", job_id)
                continue
            if what is not None:
                out[what].append(job_id)
        if start is None or len(seen) >= limit:
            break
    if out["resent"] or out["failed"]:
        log.warning(
            "handed-back jobs past their requeue deadline: %d messages sent again, %d failed",
            len(out["resent"]),
            len(out["failed"]),
        )
    return out


def _resend_one(
    store: JobStore,
    events: EventPublisher,
    sqs: Any,
    settings: SweeperSettings,
    job_id: str,
    now_epoch: int,
    backlog: _Backlog,
) -> str | None:
    record = store.get(job_id)
    if (
        record is None
        or record.get("status") != lifecycle.QUEUED
        or record.get("running_mark") != REQUEUED_MARK
        or int(record.get(LEASE_FIELD) or 0) >= now_epoch
    ):
        return None
    attempts = int(record.get("attempts") or 0)
    reason = None
    if attempts >= settings.max_receive_count:
        reason = "no attempt is left"
    elif backlog.visible(settings.queue_url(record["model"], record.get("priority") or "normal")):
        _postpone(store, job_id, attempts)
        return None  # its message may be waiting behind the backlog
    elif not record.get("input_ref") and parse(record["expires_at"]) <= now():
        reason = "its message was lost with its inline input"
    if reason is not None:
        try:
            failed = store.apply(transitions.fail_lost_hand_back(record, now_epoch, reason))
        except TransitionRefused:
            return None
        _publish(events, failed)
        return "failed"
    if not record.get("input_ref"):
        log.error(
            "job %s: handed back, queued past its deadline, its input not in the record", job_id
        )
        _postpone(store, job_id, attempts)
        return None
    _send_again(sqs, settings, record)
    return "resent" if _postpone(store, job_id, attempts) else None


def _postpone(store: JobStore, job_id: str, attempts: int) -> bool:
    """A new requeue deadline for a job still queued at ``attempts``; False when it moved on."""
    return store.update_fields(
        job_id,
        status=lifecycle.QUEUED,
        attempts=attempts,
        set_fields={LEASE_FIELD: store.requeue_deadline()},
    )


class _Backlog:
    """Visible messages per queue URL (``ApproximateNumberOfMessages``), read once per sweep."""

    def __init__(self, sqs: Any) -> None:
        self.sqs = sqs
        self.seen: dict[str, int] = {}

    def visible(self, url: str) -> int:
        """The queue's visible messages (a failed read counts as a backlog: no duplicate and no
        failure on a guess)."""
        if url not in self.seen:
            try:
                attrs = self.sqs.get_queue_attributes(
                    QueueUrl=url, AttributeNames=["ApproximateNumberOfMessages"]
                )["Attributes"]
                self.seen[url] = int(attrs.get("ApproximateNumberOfMessages", 0))
            except Exception:
                log.exception("could not read the backlog of %s", url)
                self.seen[url] = 1
        return self.seen[url]


def _message_acknowledged(record: JobRecord) -> bool:
    """Whether the job's SQS message is gone while it runs: a SageMaker bridge acknowledges it
    once it invoked the endpoint for this attempt (and recorded the ``inference_id``)."""
    return bool(record.get("inference_id"))


def message_from_record(record: JobRecord) -> JobMessage:
    """The job's SQS message rebuilt from its record (the input by ``input_ref``, which the
    SageMaker bridge records for every job it invokes)."""
    return JobMessage(
        job_id=record["job_id"],
        tenant=record["tenant"],
        model=record["model"],
        priority=record.get("priority") or "normal",
        expires_at=record["expires_at"],
        timeout_seconds=int(record["timeout_seconds"]),
        input_ref=record.get("input_ref"),
        created_at=record.get("created_at"),
        metadata=record.get("metadata"),
        webhook=record.get("webhook"),
    )


@dataclass
class Sweep:
    """What one :func:`sweep` did: counts per step, and the steps that raised (name, error)."""

    expired: int = 0
    taken_back: int = 0
    resent: int = 0
    failed_hand_backs: int = 0
    republished: int = 0
    errors: list[tuple[str, Exception]] = field(default_factory=list)


def sweep(settings: SweeperSettings) -> Sweep:
    """One round of every sweep, in order: :func:`expire_due`, :func:`take_back_lapsed`,
    :func:`resend_lost`, :func:`republish_pending`. Each step runs even when an earlier one
    raised (an AWS fault in the expiry sweep no longer leaves lapsed leases and pending events
    for the next round); a step that raised is logged and listed in ``errors``. Never raises
    (the caller decides: the Lambda raises :class:`~asyncinfer.core.errors.SweepFailed`)."""
    out = Sweep()

    def step(name: str, run: Callable[[], Any]) -> Any:
        try:
            return run()
        except Exception as exc:
            log.exception("sweep step %s failed", name)
            out.errors.append((name, exc))
            return None

    out.expired = len(step("expire_due", lambda: expire_due(settings)) or ())
    out.taken_back = len(step("take_back_lapsed", lambda: take_back_lapsed(settings)) or ())
    lost = step("resend_lost", lambda: resend_lost(settings)) or {}
    out.resent, out.failed_hand_backs = len(lost.get("resent", ())), len(lost.get("failed", ()))
    out.republished = step("republish_pending", lambda: republish_pending(settings)) or 0
    return out


logger, tracer, metrics = powertools("asyncinfer-sweeper")


@instrument(logger, tracer, metrics)
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    """The scheduled sweeper Lambda (:func:`sweep`): ``{"expired": <count>, "taken_back":
    <count>}``; metrics ``JobsExpired``, ``LeasesLapsed``, ``HandBacksResent`` /
    ``HandBacksFailed`` (:func:`resend_lost`), ``EventsRepublished`` (pending events published
    again) and ``SweepStepErrors`` (steps that raised). After a step raised, the other steps
    still run and :class:`~asyncinfer.core.errors.SweepFailed` is raised at the end, so the
    Lambda's ``Errors`` metric and alarm show it."""
    done = sweep(get_settings().sweeper)
    for name, value in (
        ("JobsExpired", done.expired),
        ("LeasesLapsed", done.taken_back),
        ("HandBacksResent", done.resent),
        ("HandBacksFailed", done.failed_hand_backs),
        ("EventsRepublished", done.republished),
        ("SweepStepErrors", len(done.errors)),
    ):
        metrics.add_metric(name=name, unit=MetricUnit.Count, value=value)
    if done.errors:
        steps = ", ".join(name for name, _ in done.errors)
        raise SweepFailed(f"sweep steps failed: {steps}") from done.errors[0][1]
    return {"expired": done.expired, "taken_back": done.taken_back}
