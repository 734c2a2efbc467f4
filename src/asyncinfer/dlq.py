"""The dead-letter queue handler: a job whose message SQS moved to a model's dead-letter queue
(after maxReceiveCount receives) fails with ``max_attempts`` and ``job.failed`` is published.

In AWS this runs as a Lambda with an SQS event source on every DLQ (partial batch responses via
Powertools' batch processing); the local stack feeds it the same SQS events.
"""

from __future__ import annotations

import logging
from functools import lru_cache
from typing import Any

from aws_lambda_powertools.utilities.batch import (
    BatchProcessor,
    EventType,
    process_partial_response,
)
from aws_lambda_powertools.utilities.data_classes.sqs_event import SQSRecord
from aws_lambda_powertools.utilities.typing import LambdaContext
from pydantic import ValidationError

from asyncinfer import lifecycle
from asyncinfer.errors import TransitionRefused
from asyncinfer.jobs.events import EventPublisher
from asyncinfer.jobs.messages import JobMessage
from asyncinfer.jobs.store import JobStore
from asyncinfer.observability import instrument, powertools
from asyncinfer.settings import Settings, get_settings
from asyncinfer.timeutil import iso, now

log = logging.getLogger("asyncinfer.dlq")


class DeadLetterHandler:
    """Fails the jobs of dead-lettered messages."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.store = JobStore(settings)
        self.events = EventPublisher(settings)

    def handle(self, body: str, receive_count: int | None = None) -> dict[str, Any] | None:
        """Fail the job of one dead-lettered message body.

        Returns the failed record, or ``None`` when there was nothing to fail (the job had
        already finished, or the body is not a job message: logged and dropped, since no job
        can be named). Raises on AWS errors so the record is retried.
        """
        try:
            msg = JobMessage.model_validate_json(body)
        except ValidationError:
            log.error("dead-lettered message is not a job message; dropped: %.200s", body)
            return None
        attempts = f" ({receive_count} receives)" if receive_count else ""
        try:
            record = self.store.transition(
                msg.job_id,
                from_status=(lifecycle.QUEUED, lifecycle.RUNNING),
                to_status=lifecycle.FAILED,
                # A lost attempt's partial output and progress are not the job's result.
                remove_fields=("output", "progress_tokens"),
                set_fields={
                    "completed_at": iso(now()),
                    "error": {
                        "code": "max_attempts",
                        "message": f"the job failed on every attempt{attempts}",
                    },
                },
            )
        except TransitionRefused as exc:
            log.info("dead-lettered job needs no change: %s", exc)
            return None
        log.info("job %s failed: max_attempts", msg.job_id)
        self.events.publish(record)
        return record


@lru_cache(maxsize=1)
def _handler() -> DeadLetterHandler:
    return DeadLetterHandler(get_settings())


processor = BatchProcessor(event_type=EventType.SQS)


def record_handler(record: SQSRecord) -> None:
    """Powertools batch record handler: one dead-lettered message."""
    count = record.attributes.approximate_receive_count
    _handler().handle(record.body, int(count) if count else None)


logger, tracer, metrics = powertools("asyncinfer-dlq")


@instrument(logger, tracer, metrics)
def lambda_handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    """The DLQ Lambda: fail every dead-lettered job of the SQS batch; the response lists the
    records that raised (``batchItemFailures``) so that only those are retried."""
    return dict(
        process_partial_response(
            event=event, record_handler=record_handler, processor=processor, context=context
        )
    )
