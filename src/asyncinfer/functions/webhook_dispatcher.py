"""The webhook dispatcher: delivers job events to the jobs' webhooks.

It is fed by the webhook queue, an SQS queue subscribed to the events topic with raw message
delivery (in AWS: this module's :func:`handler` behind an SQS event source with
``ReportBatchItemFailures``; on the local stack the same handler, fed by
:mod:`asyncinfer.local.event_source`). For each event:

* events of jobs without a webhook, or of a type not in the job's ``webhook.events``, are dropped;
* the body sent is the event exactly as published (the SQS message body), so every retry carries
  the same body; ``webhook-id`` is derived from the job, the event type and the attempt
  (:func:`~asyncinfer.webhooks.signing.event_id`), so every retry carries the same id too; the
  timestamp and signature are made at each attempt with the tenant's valid secrets;
* 2xx: delivered (the id is remembered on the job, so a duplicate of the event is not sent
  again). 410 Gone: failed, and the job's later events are not sent. A refused URL or address:
  failed, nothing sent. Anything else, a timeout or a connection error: the record is reported
  failed (partial batch response) after its message's visibility timeout was set to the next
  backoff delay (exponential, with jitter), so SQS delivers it again then. Once the event has
  been retried for ``webhook_retry_window_seconds`` (24 h) it goes to the webhook dead-letter
  queue and the job's webhook is ``failed``.
* a tenant's host whose attempt ran into the 10 s deadline gets no other attempt of the tenant
  from this process for a minute (:mod:`.slow_hosts`): those events are put back on the queue
  untried, so a slow receiver cannot fill the dispatcher's reserved concurrency and hold other
  tenants' events.

The job record keeps ``webhook_status`` (``pending`` / ``delivered`` / ``failed``),
``webhook_attempts``, ``webhook_last_http_status``, ``webhook_last_response`` (at most 1 KB),
``webhook_last_error``, ``webhook_last_attempt_at``, ``webhook_delivered`` (ids, a string set) and
``webhook_gone``; :mod:`asyncinfer.jobs.view` shows the first three.
"""

from __future__ import annotations

import json
import logging
import math
import random
import time
from collections.abc import Callable
from functools import lru_cache
from typing import Any

from aws_lambda_powertools.utilities.data_classes.sqs_event import SQSRecord
from aws_lambda_powertools.utilities.typing import LambdaContext
from botocore.exceptions import ClientError

from asyncinfer.aws import clients
from asyncinfer.core.observability import instrument, powertools
from asyncinfer.core.settings import get_settings
from asyncinfer.core.settings_parts import WebhookSettings
from asyncinfer.core.timeutil import iso, now, parse
from asyncinfer.functions.api.schemas import TERMINAL_EVENTS
from asyncinfer.jobs.store import JobStore
from asyncinfer.openai_api.batch_events import BATCH_EVENTS
from asyncinfer.webhooks.batch import deliver_batch
from asyncinfer.webhooks.secrets import SecretStore
from asyncinfer.webhooks.sender import DeliveryResult, WebhookSender
from asyncinfer.webhooks.signing import event_id, sign_headers
from asyncinfer.webhooks.slow_hosts import SlowHosts
from asyncinfer.webhooks.urls import ForbiddenAddress, parse_url

log = logging.getLogger("asyncinfer.webhooks")

#: SQS caps a message's visibility timeout at 12 h.
MAX_VISIBILITY_SECONDS = 43200

PENDING, DELIVERED, FAILED = "pending", "delivered", "failed"


class WebhookRetry(Exception):
    """The attempt failed and the event will be sent again (the record is reported failed)."""


def backoff_delay(attempt: int, base: float, cap: float, rng: random.Random | None = None) -> int:
    """Seconds before attempt ``attempt + 1``: ``min(cap, base * 2 ** (attempt - 1))`` with
    "equal jitter" (a uniform draw from the upper half), whole seconds, at least 1, at most 12 h."""
    d = min(cap, base * 2 ** max(0, attempt - 1), MAX_VISIBILITY_SECONDS)
    r = rng or random
    return max(1, min(MAX_VISIBILITY_SECONDS, math.ceil(r.uniform(d / 2, d))))


def parse_event(body: str) -> dict[str, Any] | None:
    """The job event in an SQS message body (raw delivery; an SNS envelope is unwrapped too), or
    ``None`` when the body is not one."""
    try:
        event = json.loads(body)
        if isinstance(event, dict) and event.get("Type") == "Notification" and "Message" in event:
            event = json.loads(event["Message"])
    except (ValueError, TypeError):
        return None
    if not isinstance(event, dict) or not isinstance(event.get("data"), dict):
        return None
    if not isinstance(event.get("type"), str) or not isinstance(event["data"].get("id"), str):
        return None
    return event


def _first_try(event: dict[str, Any], first_received_ms: int | None) -> float:
    """Epoch seconds of the event's first delivery attempt: when it entered the queue, else its
    publication time."""
    if first_received_ms:
        return first_received_ms / 1000
    try:
        return parse(str(event.get("timestamp"))).timestamp()
    except ValueError:
        return time.time()


class WebhookDispatcher:
    """Delivers one event (an SQS message) per :meth:`handle` call (``settings``: the
    dispatcher's part, ``Settings.webhooks``)."""

    def __init__(
        self,
        settings: WebhookSettings,
        *,
        sender: WebhookSender | None = None,
        rng: random.Random | None = None,
        slow_hosts: SlowHosts | None = None,
    ) -> None:
        self.settings = settings
        self.store = JobStore(settings)
        self.secrets = SecretStore(settings)
        self.sqs = clients.client("sqs", settings)
        self.sender = sender or WebhookSender(local_mode=settings.local_mode)
        self.rng = rng or random.Random()
        self.slow_hosts = slow_hosts or SlowHosts()

    # ------------------------------------------------------------------ one event
    def handle(
        self,
        body: str,
        *,
        receive_count: int = 1,
        first_received_ms: int | None = None,
        receipt_handle: str | None = None,
        queue_url: str | None = None,
        deadline: float | None = None,
    ) -> str:
        """Deliver the event in ``body``; returns what happened (``skipped``, ``delivered``,
        ``gone``, ``refused``, ``dead_lettered``).

        Args:
            receive_count: the message's ApproximateReceiveCount (this event's attempt number).
            first_received_ms: when the event entered the queue (SentTimestamp, epoch ms).
            receipt_handle, queue_url: of the message, to set its visibility for the next try.
            deadline: ``time.monotonic()`` seconds by which the attempt must be over, when sooner
                than the sender's timeout (:mod:`.batch`: the Lambda's time left).

        Raises:
            WebhookRetry: the attempt failed; the message becomes visible again after the next
                backoff delay.
        """
        event = parse_event(body)
        if event is None:
            log.error("webhook queue message is not a job event; dropped: %.200s", body)
            return "skipped"
        etype, data = event["type"], event["data"]
        job_id = data["id"]
        record = self.store.get(job_id)
        if record is None or not record.get("webhook"):
            return "skipped"
        hook = json.loads(record["webhook"])
        # An OpenAI batch (openai_api.batch_events) has its end events; its tenant is its owner.
        is_batch = job_id.startswith("batch_")
        if etype not in (hook.get("events") or (BATCH_EVENTS if is_batch else TERMINAL_EVENTS)):
            return "skipped"
        tenant = str(record.get("owner") if is_batch else record["tenant"])
        msg_id = event_id(job_id, etype, int(data.get("attempts") or 0))
        if msg_id in (record.get("webhook_delivered") or []):
            log.info("webhook %s %s already delivered (%s)", etype, job_id, msg_id)
            return "skipped"
        if record.get("webhook_gone"):
            log.info("webhook of %s answered 410 Gone earlier; %s not sent", job_id, etype)
            return "skipped"

        host = _host_key(tenant, hook["url"], self.settings.local_mode)
        window_over = time.time() - _first_try(event, first_received_ms) >= (
            self.settings.webhook_retry_window_seconds
        )
        rest = self.slow_hosts.rest_left(host) if host else 0.0
        if rest > 0 and not window_over:
            delay = min(MAX_VISIBILITY_SECONDS, math.ceil(rest + self.rng.uniform(0, rest / 2)))
            self._set_visibility(job_id, receipt_handle, queue_url, delay)
            raise WebhookRetry(
                f"webhook {etype} {job_id}: {host} timed out recently; deferred {delay} s"
            )

        headers = sign_headers(body, msg_id, self.secrets.signing_secrets(tenant))
        started = time.monotonic()
        result = self.sender.send(hook["url"], body.encode("utf-8"), headers, deadline=deadline)
        full_time = deadline is None or deadline - started >= self.sender.timeout - 0.5
        if host and result.timed_out and full_time:  # not when our own budget cut it short
            self.slow_hosts.timed_out(host)
        elif host and result.http_status is not None:
            self.slow_hosts.answered(host)
        log.info(
            "webhook %s %s attempt %s -> %s %s%s",
            etype,
            job_id,
            receive_count,
            result.outcome,
            result.http_status or "",
            f" ({result.error})" if result.error else "",
        )
        if result.outcome == "delivered":
            self._note(job_id, DELIVERED, result, delivered_id=msg_id)
            return "delivered"
        if result.outcome == "gone":
            self._note(job_id, FAILED, result, gone=True)
            return "gone"
        if result.outcome == "refused":
            self._note(job_id, FAILED, result)
            return "refused"

        if time.time() - _first_try(event, first_received_ms) >= (
            self.settings.webhook_retry_window_seconds
        ):
            self._dead_letter(body, job_id, etype, msg_id, result)
            self._note(job_id, FAILED, result)
            return "dead_lettered"
        self._note(job_id, PENDING, result)
        delay = backoff_delay(
            receive_count,
            self.settings.webhook_retry_base_seconds,
            self.settings.webhook_retry_max_delay_seconds,
            self.rng,
        )
        self._set_visibility(job_id, receipt_handle, queue_url, delay)
        raise WebhookRetry(
            f"webhook {etype} {job_id}: attempt {receive_count} failed "
            f"({result.http_status or result.error}); next in {delay} s"
        )

    # ------------------------------------------------------------------ bookkeeping
    def _set_visibility(
        self, job_id: str, receipt_handle: str | None, queue_url: str | None, delay: int
    ) -> None:
        """Have SQS deliver the message again in ``delay`` seconds."""
        url = queue_url or self.settings.webhook_queue_url
        if receipt_handle and url:
            try:
                self.sqs.change_message_visibility(
                    QueueUrl=url, ReceiptHandle=receipt_handle, VisibilityTimeout=delay
                )
            except ClientError as exc:  # the queue's own visibility timeout applies then
                log.warning("could not set the retry delay of %s: %s", job_id, exc)

    def _note(
        self,
        job_id: str,
        status: str,
        result: DeliveryResult,
        *,
        delivered_id: str | None = None,
        gone: bool = False,
    ) -> None:
        """Record an attempt on the job: status, attempts + 1, last HTTP status and answer."""
        names = {
            "#st": "webhook_status",
            "#at": "webhook_attempts",
            "#t": "webhook_last_attempt_at",
            "#h": "webhook_last_http_status",
            "#r": "webhook_last_response",
            "#e": "webhook_last_error",
        }
        values: dict[str, Any] = {
            ":st": {"S": status},
            ":zero": {"N": "0"},
            ":one": {"N": "1"},
            ":t": {"S": iso(now())},
            ":r": {"S": result.response},
        }
        sets = ["#st = :st", "#at = if_not_exists(#at, :zero) + :one", "#t = :t", "#r = :r"]
        removes = []
        if result.http_status is not None:
            sets.append("#h = :h")
            values[":h"] = {"N": str(result.http_status)}
        else:
            removes.append("#h")
        if result.error:
            sets.append("#e = :e")
            values[":e"] = {"S": result.error[:1024]}
        else:
            removes.append("#e")
        if gone:
            names["#g"] = "webhook_gone"
            sets.append("#g = :g")
            values[":g"] = {"BOOL": True}
        expr = "SET " + ", ".join(sets)
        if removes:
            expr += " REMOVE " + ", ".join(removes)
        if delivered_id:
            names["#d"] = "webhook_delivered"
            values[":d"] = {"SS": [delivered_id]}
            expr += " ADD #d :d"
        if not self.store.record_delivery(job_id, expr, names, values):
            log.info("job %s is gone; webhook state not recorded", job_id)

    def _dead_letter(
        self, body: str, job_id: str, etype: str, msg_id: str, result: DeliveryResult
    ) -> None:
        reason = f"{result.http_status or result.error}"
        url = self.settings.webhook_dlq_url
        log.warning("webhook %s %s given up after the retry window (%s)", etype, job_id, reason)
        if not url:
            log.error("no webhook dead-letter queue configured; event dropped: %.200s", body)
            return
        attrs = {"job_id": job_id, "event_type": etype, "webhook_id": msg_id, "reason": reason}
        self.sqs.send_message(
            QueueUrl=url,
            MessageBody=body,
            MessageAttributes={
                k: {"DataType": "String", "StringValue": v[:256] or "-"} for k, v in attrs.items()
            },
        )

    # ------------------------------------------------------------------ SQS records
    def handle_record(self, record: SQSRecord, deadline: float | None = None) -> str:
        """:meth:`handle` for one SQS event record (Powertools' data class)."""
        count = record.attributes.approximate_receive_count
        sent = record.attributes.sent_timestamp
        return self.handle(
            record.body,
            receive_count=int(count) if count else 1,
            first_received_ms=int(sent) if sent else None,
            receipt_handle=record.receipt_handle,
            queue_url=self.settings.webhook_queue_url or record.queue_url,
            deadline=deadline,
        )


LambdaHandler = Callable[[dict[str, Any], Any], dict[str, Any]]


def make_handler(dispatcher: Callable[[], WebhookDispatcher]) -> LambdaHandler:
    """An SQS-event Lambda handler delivering each record with ``dispatcher()``, the records of
    a batch side by side within the Lambda's remaining time (:mod:`.batch`); the response lists
    the records to retry (``batchItemFailures``), and only those. An all-failed batch is an
    ordinary answer (every record listed), not an invocation error."""

    def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
        d = dispatcher()
        remaining = getattr(context, "get_remaining_time_in_millis", None)
        return dict(
            deliver_batch(
                event.get("Records") or [],
                d.handle_record,
                attempt_seconds=d.sender.timeout,
                remaining_seconds=remaining() / 1000 if callable(remaining) else None,
                expected=(WebhookRetry,),
            )
        )

    return handler


@lru_cache(maxsize=1)
def _dispatcher() -> WebhookDispatcher:
    return WebhookDispatcher(get_settings().webhooks)


_handle = make_handler(_dispatcher)
logger, tracer, metrics = powertools("asyncinfer-webhooks")


@instrument(logger, tracer, metrics)
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    """The webhook dispatcher Lambda (SQS event source on the webhook queue, with
    ``ReportBatchItemFailures``)."""
    return _handle(event, context)


def _host_key(tenant: str, url: str, local_mode: bool) -> str | None:
    """``<tenant> <host>:<port>`` of a webhook URL, what :mod:`.slow_hosts` rests (per tenant, so
    one tenant's slow endpoint on a shared host never rests another tenant's), or ``None`` if it
    is not one the sender would send to."""
    try:
        u = parse_url(url, local_mode=local_mode)
    except ForbiddenAddress:
        return None
    return f"{tenant} {u.host}:{u.port}"
