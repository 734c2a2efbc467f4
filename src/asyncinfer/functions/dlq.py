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

from asyncinfer.core import lifecycle
from asyncinfer.core.errors import TransitionRefused
from asyncinfer.core.observability import instrument, powertools
from asyncinfer.core.settings import get_settings
from asyncinfer.core.settings_parts import DlqSettings
from asyncinfer.jobs import transitions
from asyncinfer.jobs.events import EventPublisher
from asyncinfer.jobs.messages import JobMessage
from asyncinfer.jobs.record import JobRecord, refused_record
from asyncinfer.jobs.store import JobStore

log = logging.getLogger("asyncinfer.functions.dlq")


class DeadLetterHandler:
    """Fails the jobs of dead-lettered messages (``settings``: the DLQ handler's part,
    ``Settings.dlq``)."""

    def __init__(self, settings: DlqSettings) -> None:
        self.settings = settings
        self.store = JobStore(settings)
        self.events = EventPublisher(settings)

    def handle(
        self, body: str, receive_count: int | None = None, message_id: str | None = None
    ) -> JobRecord | None:
        """Fail the job of one dead-lettered message body (``message_id``: its SQS MessageId,
        which SQS keeps when it moves a message to the dead-letter queue).

        A ``queued`` job fails. A ``running`` job fails only when its attempt started from this
        very message (the record's ``message_id``; a record without one, written before
        attempts named their message, is failed as before): a duplicate or older message of a
        job that runs another attempt, started from another message, is not that attempt's
        verdict, and the running attempt is left to finish (or to its lease).

        Returns the failed record, or ``None`` when there was nothing to fail (the job had
        already finished or runs an attempt of another message, or the body is not a job
        message: logged and dropped, since no job can be named). Raises on AWS errors so the
        record is retried; an event that could not be published stays in the record's outbox.
        """
        try:
            msg = JobMessage.model_validate_json(body)
        except ValidationError:
            log.error("dead-lettered message is not a job message; dropped: %.200s", body)
            return None
        record = self._fail(msg.job_id, receive_count, message_id)
        if record is None:
            return None
        log.info("job %s failed: max_attempts", msg.job_id)
        try:
            self.events.publish(record)
        except Exception:  # the write is done: the sweeper publishes it from the outbox
            log.exception("job.failed of %s not published; left in its outbox", msg.job_id)
        return record

    def _fail(
        self, job_id: str, receive_count: int | None, message_id: str | None
    ) -> JobRecord | None:
        try:
            return self.store.apply(transitions.dead_letter(job_id, receive_count=receive_count))
        except TransitionRefused as exc:
            current = refused_record(exc)
        if current is None or current.get("status") != lifecycle.RUNNING:
            status = current and current["status"]
            log.info("dead-lettered job %s needs no change: it is %s", job_id, status)
            return None
        started_from = current.get("message_id")
        if started_from and message_id and started_from != message_id:
            log.info(
                "job %s runs attempt %s of message %s: dead-lettered message %s left alone",
                job_id,
                current.get("attempts"),
                started_from,
                message_id,
            )
            return None
        try:
            return self.store.apply(
                transitions.dead_letter(
                    job_id,
                    receive_count=receive_count,
                    running_attempt=int(current.get("attempts") or 0),
                    message_id=started_from if message_id else None,
                )
            )
        except TransitionRefused as exc:
            log.info("dead-lettered job needs no change: %s", exc)
            return None


@lru_cache(maxsize=1)
def _handler() -> DeadLetterHandler:
    return DeadLetterHandler(get_settings().dlq)


processor = BatchProcessor(event_type=EventType.SQS)


def record_handler(record: SQSRecord) -> None:
    """Powertools batch record handler: one dead-lettered message."""
    count = record.attributes.approximate_receive_count
    _handler().handle(record.body, int(count) if count else None, record.message_id)


logger, tracer, metrics = powertools("asyncinfer-dlq")


@instrument(logger, tracer, metrics)
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    """The DLQ Lambda: fail every dead-lettered job of the SQS batch; the response lists the
    records that raised (``batchItemFailures``) so that only those are retried."""
    return dict(
        process_partial_response(
            event=event, record_handler=record_handler, processor=processor, context=context
        )
    )
