"""SQS job messages -> SageMaker asynchronous inference (``InvokeEndpointAsync``).

Per message (:class:`~asyncinfer.messages.JobMessage`):

1. a job past ``expires_at`` becomes ``expired`` (event published), message acknowledged;
2. the input must be in S3 for SageMaker: ``input_ref`` as is, or the inline ``input`` written
   with :class:`~asyncinfer.payloads.PayloadStore` (``inputs/<tenant>/<job_id>.json``);
3. ``queued -> running`` (attempts + 1, ``started_at``) through :meth:`JobStore.transition`; a
   refused transition (cancelled, finished, already submitted) acknowledges the message;
4. ``InvokeEndpointAsync`` with ``InputLocation`` = the input URI, ``InferenceId`` = job id,
   ``RequestTTLSeconds`` = time left before ``expires_at`` and ``InvocationTimeoutSeconds`` =
   ``timeout_seconds``, both clamped to SageMaker's ranges (API reference,
   InvokeEndpointAsync: RequestTTLSeconds 60..21600, InvocationTimeoutSeconds 1..3600);
5. the ``job.started`` event. If the call fails, the job goes back ``running -> queued`` and the
   message is reported as a batch item failure, so SQS redelivers it (and, after
   maxReceiveCount, moves it to the DLQ, whose handler fails the job).

From then on SageMaker holds the request; :mod:`asyncinfer.sagemaker.completion` finishes the job.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Callable, Mapping
from typing import Any

from pydantic import ValidationError

from asyncinfer import clients, lifecycle
from asyncinfer.errors import ConfigError, TransitionRefused
from asyncinfer.messages import JobMessage
from asyncinfer.payloads import PayloadStore, dumps
from asyncinfer.settings import Settings
from asyncinfer.store import JobStore
from asyncinfer.timeutil import iso, now, parse

#: SageMaker InvokeEndpointAsync limits, seconds.
REQUEST_TTL_MIN, REQUEST_TTL_MAX = 60, 21_600
INVOCATION_TIMEOUT_MIN, INVOCATION_TIMEOUT_MAX = 1, 3_600

Publish = Callable[[dict[str, Any]], Any]


def clamp(value: float, low: int, high: int) -> int:
    """``value`` rounded down and limited to ``low..high``."""
    return max(low, min(high, int(value)))


def endpoint_names_from_env(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """``ASYNCINFER_SAGEMAKER_ENDPOINTS`` (JSON {model: endpoint name})."""
    env = os.environ if env is None else env
    try:
        names = json.loads(env.get("ASYNCINFER_SAGEMAKER_ENDPOINTS") or "{}")
    except ValueError:
        raise ConfigError("ASYNCINFER_SAGEMAKER_ENDPOINTS is not JSON") from None
    if not isinstance(names, dict):
        raise ConfigError("ASYNCINFER_SAGEMAKER_ENDPOINTS must be a JSON object")
    return {str(k): str(v) for k, v in names.items()}


class Bridge:
    """Submits queued jobs to their model's async endpoint.

    Args:
        settings: table, bucket, topic.
        endpoints: model id -> endpoint name.
        store / payloads / runtime: collaborators (built from ``settings`` when omitted);
            ``runtime`` is a ``sagemaker-runtime`` client.
        publish: publishes a job event for a record (default: :class:`EventPublisher`).
        logger: a logging.Logger-like object (Powertools Logger in Lambda).
        metrics: Powertools Metrics or ``None``.
    """

    def __init__(
        self,
        *,
        settings: Settings,
        endpoints: Mapping[str, str],
        store: JobStore | None = None,
        payloads: PayloadStore | None = None,
        runtime: Any = None,
        publish: Publish | None = None,
        logger: Any = None,
        metrics: Any = None,
    ) -> None:
        self.settings = settings
        self.endpoints = dict(endpoints)
        self.store = store or JobStore(settings)
        self.payloads = payloads or PayloadStore(settings)
        self.runtime = runtime or clients.client("sagemaker-runtime", settings)
        if publish is None:
            from asyncinfer.events import EventPublisher

            publish = EventPublisher(settings, self.payloads).publish
        self.publish = publish
        import logging

        self.log = logger or logging.getLogger(__name__)
        self.metrics = metrics

    @classmethod
    def from_env(cls, **kwargs: Any) -> Bridge:
        """Build from the environment (:meth:`Settings.from_env` and the endpoint names)."""
        return cls(settings=Settings.from_env(), endpoints=endpoint_names_from_env(), **kwargs)

    def handle_sqs_event(self, event: Mapping[str, Any]) -> dict[str, Any]:
        """Handle an SQS batch; returns the partial batch response (``batchItemFailures``)."""
        failures = []
        for record in event.get("Records", []):
            try:
                ok = self.submit(record["body"])
            except Exception:
                self.log.exception("bridge failed on message %s", record.get("messageId"))
                ok = False
            if not ok:
                failures.append({"itemIdentifier": record["messageId"]})
        return {"batchItemFailures": failures}

    def submit(self, body: str) -> bool:
        """Handle one message body. Returns False when the message should be retried."""
        try:
            msg = JobMessage.model_validate_json(body)
        except ValidationError as exc:
            self.log.error("unreadable job message: %s", exc)
            return False  # left to the DLQ handler after maxReceiveCount
        endpoint = self.endpoints.get(msg.model)
        if endpoint is None:
            self.log.error("no SageMaker endpoint for model %s (job %s)", msg.model, msg.job_id)
            return False
        current = now()
        ttl_left = (parse(msg.expires_at) - current).total_seconds()
        if ttl_left <= 0:
            self._expire(msg.job_id)
            return True
        if msg.input_ref:
            input_uri = msg.input_ref
        else:
            input_uri = self.payloads.put_input(msg.tenant, msg.job_id, dumps(msg.input or {}))
        try:
            record = self.store.transition(
                msg.job_id,
                from_status=lifecycle.QUEUED,
                to_status=lifecycle.RUNNING,
                increment_attempts=True,
                set_fields={"started_at": iso(current)},
                remove_fields=("completed_at",),
            )
        except TransitionRefused as exc:
            state = exc.current["status"] if exc.current else "missing"
            self.log.info("job %s is %s: not submitted", msg.job_id, state)
            return True
        try:
            self.runtime.invoke_endpoint_async(
                EndpointName=endpoint,
                InputLocation=input_uri,
                ContentType="application/json",
                Accept="application/json",
                InferenceId=msg.job_id,
                CustomAttributes=f"job_id={msg.job_id};model={msg.model};attempt={record['attempts']}",
                RequestTTLSeconds=clamp(ttl_left, REQUEST_TTL_MIN, REQUEST_TTL_MAX),
                InvocationTimeoutSeconds=clamp(
                    msg.timeout_seconds, INVOCATION_TIMEOUT_MIN, INVOCATION_TIMEOUT_MAX
                ),
            )
        except Exception:
            self.log.exception("InvokeEndpointAsync failed for job %s", msg.job_id)
            with contextlib.suppress(TransitionRefused):
                self.store.transition(
                    msg.job_id,
                    from_status=lifecycle.RUNNING,
                    to_status=lifecycle.QUEUED,
                    attempts=record["attempts"],
                )
            return False
        self.log.info("job %s submitted to %s", msg.job_id, endpoint)
        if self.metrics is not None:
            self.metrics.add_metric(name="JobsSubmitted", unit="Count", value=1)
        self.publish(record)
        return True

    def _expire(self, job_id: str) -> None:
        record = self.store.expire(job_id)
        if record is not None:
            self.publish(record)
