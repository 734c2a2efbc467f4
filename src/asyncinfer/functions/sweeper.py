"""The sweeper. Three sweeps, each through the store's conditional transitions:

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
  exists.

In AWS a Lambda runs it every minute (EventBridge schedule); the local stack runs it every
``Settings.sweep_seconds`` (5 s).
"""

from __future__ import annotations

import logging
import time
from typing import Any

from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.utilities.typing import LambdaContext

from asyncinfer.aws import clients
from asyncinfer.core import lifecycle
from asyncinfer.core.observability import instrument, powertools
from asyncinfer.core.settings import get_settings
from asyncinfer.core.settings_parts import SweeperSettings
from asyncinfer.jobs import leases, outbox
from asyncinfer.jobs.events import EventPublisher
from asyncinfer.jobs.messages import JobMessage
from asyncinfer.jobs.record import JobRecord
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
        message = message_from_record(record)
        sqs.send_message(
            QueueUrl=settings.queue_url(record["model"], record.get("priority") or "normal"),
            MessageBody=message.dumps(),
            MessageGroupId=message.group_id,  # fair queues (asyncinfer.jobs.messages)
        )
    return leases.take_back(store, record, now_epoch, settings)


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


logger, tracer, metrics = powertools("asyncinfer-sweeper")


@instrument(logger, tracer, metrics)
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    """The scheduled sweeper Lambda: ``{"expired": <count>, "taken_back": <count>}``; metrics
    ``JobsExpired``, ``LeasesLapsed`` and ``EventsRepublished`` (pending events published
    again)."""
    settings = get_settings().sweeper
    count = len(expire_due(settings))
    metrics.add_metric(name="JobsExpired", unit=MetricUnit.Count, value=count)
    taken = len(take_back_lapsed(settings))
    metrics.add_metric(name="LeasesLapsed", unit=MetricUnit.Count, value=taken)
    republished = republish_pending(settings)
    metrics.add_metric(name="EventsRepublished", unit=MetricUnit.Count, value=republished)
    return {"expired": count, "taken_back": taken}
