"""SQS job messages -> SageMaker asynchronous inference (``InvokeEndpointAsync``).

Per message (:class:`~asyncinfer.jobs.messages.JobMessage`):

1. a job past ``expires_at`` before its first attempt becomes ``expired`` (event published),
   message acknowledged; a job that started before is not expired but submitted again;
2. the input must be in S3 for SageMaker: ``input_ref`` as is, or the inline ``input`` written
   with :class:`~asyncinfer.aws.payloads.PayloadStore` (``inputs/<tenant>/<job_id>.json``);
3. ``queued -> running`` (attempts + 1, ``started_at``, ``input_ref``, and a lease of
   ``Settings.lease_interval``) through :meth:`JobStore.transition`. A refused transition
   (cancelled, finished, already submitted) acknowledges the message, except for a job found
   ``running`` whose lease lapsed (a bridge died between marking it running and invoking the
   endpoint): it is taken back (:mod:`asyncinfer.jobs.leases`) and submitted
   again; one whose lease is live and that was not invoked yet is retried later (another
   bridge may be invoking it);
4. ``InvokeEndpointAsync`` with ``InputLocation`` = the input URI, ``InferenceId`` =
   :func:`inference_id` (the job id and the attempt, so that a late notification of an earlier
   attempt is told apart),
   ``RequestTTLSeconds`` = time left before ``expires_at`` and ``InvocationTimeoutSeconds`` =
   ``timeout_seconds``, both clamped to SageMaker's ranges (API reference,
   InvokeEndpointAsync: RequestTTLSeconds 60..21600, InvocationTimeoutSeconds 1..3600);
5. the record gets the ``inference_id`` and a lease past the longest SageMaker may hold the
   request (``RequestTTLSeconds`` + ``InvocationTimeoutSeconds`` + one lease interval): if no
   notification comes by then, the sweeper takes the job back and sends its message again;
6. the ``job.started`` event. If the call fails, the job goes back ``running -> queued`` and the
   message is reported as a batch item failure, so SQS redelivers it (and, after
   maxReceiveCount, moves it to the DLQ, whose handler fails the job).

For a model whose endpoint runs its ``openai-server`` engine image
(``Settings.sagemaker_engines``, set by the CDK app), ``InputLocation`` is instead the engine's
request for the job (:func:`asyncinfer.models.openai_server.invocations.invocation_of`, written to
``inputs/<tenant>/<job_id>.engine.json``); the record's ``input_ref`` stays the job's own input,
so a retry builds the request again. An input the entry's schema refuses fails the job
(``invalid_input``) without invoking the endpoint.

From then on SageMaker holds the request; :mod:`asyncinfer.functions.sagemaker_completion` finishes
the job.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

from aws_lambda_powertools.utilities.typing import LambdaContext
from pydantic import ValidationError

from asyncinfer.aws import clients
from asyncinfer.aws.payloads import PayloadStore, dumps
from asyncinfer.core import lifecycle
from asyncinfer.core.errors import InvalidInput, JobError, TransitionRefused
from asyncinfer.core.observability import instrument, powertools
from asyncinfer.core.settings import Settings
from asyncinfer.core.settings_parts import BridgeSettings
from asyncinfer.core.timeutil import iso, now, parse
from asyncinfer.jobs import outbox, transitions
from asyncinfer.jobs.leases import take_back
from asyncinfer.jobs.messages import JobMessage
from asyncinfer.jobs.record import JobRecord, refused_record
from asyncinfer.jobs.store import LEASE_FIELD, JobStore

#: SageMaker InvokeEndpointAsync limits, seconds.
REQUEST_TTL_MIN, REQUEST_TTL_MAX = 60, 21_600
INVOCATION_TIMEOUT_MIN, INVOCATION_TIMEOUT_MAX = 1, 3_600

Publish = Callable[[JobRecord], Any]
#: Separates the job id and the attempt in an ``InferenceId`` (job ids never contain it).
_ATTEMPT_SEP = ".a"


def inference_id(job_id: str, attempt: int) -> str:
    """The ``InferenceId`` of ``job_id``'s attempt ``attempt`` (``job_...a2``, at most 64
    printable characters as InvokeEndpointAsync requires)."""
    return f"{job_id}{_ATTEMPT_SEP}{attempt}"


def parse_inference_id(value: str) -> tuple[str, int | None]:
    """``(job_id, attempt)`` of an ``InferenceId``; ``attempt`` is ``None`` for a bare job id
    (a request made before inference ids named the attempt)."""
    job_id, sep, attempt = value.rpartition(_ATTEMPT_SEP)
    if sep and attempt.isdigit():
        return job_id, int(attempt)
    return value, None


def clamp(value: float, low: int, high: int) -> int:
    """``value`` rounded down and limited to ``low..high``."""
    return max(low, min(high, int(value)))


class Bridge:
    """Submits queued jobs to their model's async endpoint.

    Args:
        settings: the bridge's part (``Settings.bridge``): table, bucket, topic, lease, attempts.
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
        settings: BridgeSettings,
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
            from asyncinfer.jobs.events import EventPublisher

            publish = EventPublisher(settings, self.payloads).publish
        self.publish = publish
        import logging

        self.log = logger or logging.getLogger(__name__)
        self.metrics = metrics

    @classmethod
    def from_env(cls, **kwargs: Any) -> Bridge:
        """Build from the environment (:meth:`Settings.from_env`; the endpoint names are
        ``Settings.sagemaker_endpoints``: ``ASYNCINFER_SAGEMAKER_ENDPOINTS`` where given, else the
        naming rule of :mod:`asyncinfer.core.naming`, as the CDK app names them)."""
        settings = Settings.from_env().bridge
        return cls(settings=settings, endpoints=dict(settings.sagemaker_endpoints), **kwargs)

    def handle_sqs_event(self, event: Mapping[str, Any]) -> dict[str, Any]:
        """Handle an SQS batch; returns the partial batch response (``batchItemFailures``)."""
        failures = []
        for record in event.get("Records", []):
            try:
                ok = self.submit(record["body"], message_id=record.get("messageId"))
            except Exception:
                self.log.exception("bridge failed on message %s", record.get("messageId"))
                ok = False
            if not ok:
                failures.append({"itemIdentifier": record["messageId"]})
        return {"batchItemFailures": failures}

    def submit(self, body: str, *, message_id: str | None = None) -> bool:
        """Handle one message body (``message_id``: its SQS MessageId, recorded on the attempt it
        starts). Returns False when the message should be retried."""
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
        if ttl_left <= 0 and self._expire(msg.job_id):
            return True
        if msg.input_ref:
            input_uri = msg.input_ref
        else:
            input_uri = self.payloads.put_input(msg.tenant, msg.job_id, dumps(msg.input or {}))
        started = self._start(msg.job_id, input_uri, iso(current), message_id)
        if not isinstance(started, dict):
            return started  # True: nothing to submit (acknowledge); False: retry it later
        record = started
        request_ttl = clamp(ttl_left, REQUEST_TTL_MIN, REQUEST_TTL_MAX)
        invocation_timeout = clamp(
            msg.timeout_seconds, INVOCATION_TIMEOUT_MIN, INVOCATION_TIMEOUT_MAX
        )
        iid = inference_id(msg.job_id, record["attempts"])
        try:
            location = input_uri
            engine_api = self.settings.sagemaker_engines.get(msg.model)
            if engine_api:
                location = self._engine_request(msg, input_uri, engine_api)
            self.runtime.invoke_endpoint_async(
                EndpointName=endpoint,
                InputLocation=location,
                ContentType="application/json",
                Accept="application/json",
                InferenceId=iid,
                CustomAttributes=f"job_id={msg.job_id};model={msg.model};attempt={record['attempts']}",
                RequestTTLSeconds=request_ttl,
                InvocationTimeoutSeconds=invocation_timeout,
            )
        except JobError as exc:
            if exc.retryable:
                return self._requeue(msg.job_id, record, f"{exc.code}: {exc.message}")
            return self._fail(msg.job_id, record, exc)
        except Exception:
            self.log.exception("InvokeEndpointAsync failed for job %s", msg.job_id)
            return self._requeue(msg.job_id, record, "InvokeEndpointAsync failed")
        # The endpoint holds the request now: the lease lasts as long as SageMaker may take.
        extended = self.store.update_fields(
            msg.job_id,
            status=lifecycle.RUNNING,
            attempts=record["attempts"],
            set_fields={
                "inference_id": iid,
                LEASE_FIELD: self.store.lease_until(
                    request_ttl + invocation_timeout + self.settings.lease_interval
                ),
            },
        )
        if not extended:
            # The job moved on while the call ran (its lease lapsed and the sweeper took it back,
            # or the result came already): keep the message; its redelivery decides.
            self.log.warning("job %s left attempt %s meanwhile", msg.job_id, record["attempts"])
            return False
        self.log.info("job %s submitted to %s", msg.job_id, endpoint)
        if self.metrics is not None:
            self.metrics.add_metric(name="JobsSubmitted", unit="Count", value=1)
        self.publish(record)
        return True

    def _engine_request(self, msg: JobMessage, input_uri: str, api: str) -> str:
        """Write the engine's ``/invocations`` body of the job; returns its ``s3://`` URI.

        Raises:
            InvalidInput: the input is not valid for the entry (or not readable).
            TransientError: S3 failed.
        """
        from asyncinfer.models.openai_server.invocations import invocation_of
        from asyncinfer.models.registry import MODELS

        spec = MODELS[msg.model]
        raw = self.payloads.read_json(input_uri) if msg.input_ref else (msg.input or {})
        try:
            inp = spec.input_model.model_validate(raw)
        except ValidationError as exc:
            raise InvalidInput(f"input: {exc.errors(include_url=False)[0]['msg']}") from None
        engine = spec.entry.engine if spec.entry is not None else None
        body = invocation_of(api, inp, engine.model if engine is not None else msg.model)
        return self.payloads.put_input(msg.tenant, f"{msg.job_id}.engine", dumps(body))

    def _fail(self, job_id: str, record: JobRecord, exc: JobError) -> bool:
        """``running -> failed`` with ``exc`` (a permanent error found before the invoke);
        acknowledges the message."""
        try:
            failed = self.store.transition(
                job_id,
                from_status=lifecycle.RUNNING,
                to_status=lifecycle.FAILED,
                attempts=record["attempts"],
                set_fields={"completed_at": iso(now()), "error": exc.as_dict()},
            )
        except TransitionRefused as refused:
            self.log.info("%s", refused)
            return True
        self.log.info("job %s failed before the invoke: %s", job_id, exc.message)
        self.publish(record)  # job.started, then job.failed: the attempt did start
        self.publish(failed)
        return True

    def _requeue(self, job_id: str, record: JobRecord, why: str) -> bool:
        """SageMaker never took the request: ``running -> queued`` without any event (its
        job.started, never published, leaves the outbox with this write; the requeue publishes
        none), and the message is retried (``False``)."""
        self.log.warning("job %s not submitted: %s", job_id, why)
        shown = tuple(outbox.pending_keys(record, "job.started"))
        back = transitions.requeue(job_id, record["attempts"])
        with contextlib.suppress(TransitionRefused):
            self.store.apply(replace(back, outboxed=False, clears=shown))
        return False

    def _start(
        self, job_id: str, input_uri: str, started_at: str, message_id: str | None = None
    ) -> JobRecord | bool:
        """``queued -> running`` (step 3). Returns the running record; ``True`` when the message
        needs no submit (acknowledge it); ``False`` when the job runs under a live lease but was
        not invoked yet (another bridge may be invoking it: retry the message later)."""
        for _ in range(2):
            try:
                return self.store.apply(
                    transitions.start(
                        job_id,
                        attempts=None,
                        started_at=started_at,
                        message_id=message_id,
                        set_fields={"input_ref": input_uri},
                    )
                )
            except TransitionRefused as exc:
                cur = refused_record(exc)
            if cur is None or cur["status"] != lifecycle.RUNNING:
                self.log.info("job %s is %s: not submitted", job_id, cur and cur["status"])
                return True
            back = take_back(self.store, cur, int(time.time()), self.settings)
            if back is None:
                if cur.get("inference_id"):  # submitted; this message is a duplicate
                    self.log.info("job %s is running: not submitted again", job_id)
                    return True
                return False
            self.log.warning("job %s: lost attempt %s taken back", job_id, cur.get("attempts"))
            self.publish(back)
            if back["status"] != lifecycle.QUEUED:
                return True
        # Taken back to the queue but not started (another bridge won each time): the job needs
        # this message; acknowledging it would leave the job queued without one.
        return False

    def _expire(self, job_id: str) -> bool:
        """Expire a never started job; False when it was not (it started before, or moved on)."""
        record = self.store.expire(job_id)
        if record is not None:
            self.publish(record)
        return record is not None


logger, tracer, metrics = powertools("sagemaker-bridge")
_bridge: Bridge | None = None


@instrument(logger, tracer, metrics)
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    """SQS (a model's job queue) -> InvokeEndpointAsync, with partial batch failures. Returns
    ``{"batchItemFailures": [{"itemIdentifier": message_id}, ...]}``."""
    global _bridge
    if _bridge is None:
        _bridge = Bridge.from_env(logger=logger, metrics=metrics)
    return _bridge.handle_sqs_event(event)
