"""The expiry sweeper: queued jobs whose ``ttl_seconds`` passed become ``expired`` (error code
``expired``) and ``job.expired`` is published, even while no worker runs and nobody reads them.

In AWS a Lambda runs it every minute (EventBridge schedule); the local stack runs it every few
seconds. The job's SQS message stays in the queue; a worker that dequeues it later finds the job
terminal and deletes the message without running it. Workers and ``GET`` also expire due jobs
they meet, so the sweeper's period bounds the delay, not correctness.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.utilities.typing import LambdaContext

from asyncinfer.events import EventPublisher
from asyncinfer.observability import instrument, powertools
from asyncinfer.settings import Settings, get_settings
from asyncinfer.store import JobStore

log = logging.getLogger("asyncinfer.sweeper")


def expire_due(settings: Settings, *, limit: int = 500) -> list[str]:
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
            events.publish(record)
            expired.append(job_id)
        if not progressed:
            break
    if expired:
        log.info("expired %d queued jobs past their ttl", len(expired))
    return expired


logger, tracer, metrics = powertools("asyncinfer-sweeper")


@instrument(logger, tracer, metrics)
def lambda_handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    """The scheduled sweeper Lambda: ``{"expired": <count>}``; metric ``JobsExpired``."""
    count = len(expire_due(get_settings()))
    metrics.add_metric(name="JobsExpired", unit=MetricUnit.Count, value=count)
    return {"expired": count}
