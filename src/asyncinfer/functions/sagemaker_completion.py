"""SageMaker async notifications (SNS success and error topics) -> job records and events.

A notification is a JSON document (SageMaker developer guide, "Check prediction results"):
``inferenceId`` (our job id), ``invocationStatus`` (``Completed`` or ``Failed``),
``responseParameters.outputLocation`` on success, and on failure ``failureReason`` and
``failureLocation``. Failure details appear at the top level in some notifications and under
``responseParameters`` in others; both are read.

A notification belongs to one attempt: its ``inferenceId`` names the job and the attempt
(:func:`~asyncinfer.functions.sagemaker_bridge.inference_id`). It finishes the job only while the
job is
``running`` at that attempt, so a late result of attempt 1 (taken back by the sweeper after its
lease lapsed, and submitted again) never finishes attempt 2. A bare job id (a request made before
inference ids named the attempt) can only belong to attempt 1, and is applied only then.

On success the output JSON is read from ``outputLocation``: at most 64 KB is stored inline
(``output``), larger outputs stay where SageMaker wrote them (``output_ref``). The job goes
``running -> succeeded`` (or ``failed``) at the attempt that the record holds; a late or
duplicate notification is refused by :meth:`JobStore.transition` and ignored.

For a model whose endpoint runs its ``openai-server`` engine image (``Settings.sagemaker_engines``)
the output is the engine's answer, mapped to the job output of api.md
(:func:`asyncinfer.models.openai_server.invocations.output_of`: ``text``, ``finish_reason``,
``usage``; or ``embeddings``, ``dim``) and kept inline or, when larger, at
``outputs/<tenant>/<job_id>.json``. An answer of another shape fails the job (``model_error``). A
failure whose reason names the engine's HTTP status is mapped as on ECS
(:func:`~asyncinfer.models.openai_server.invocations.failure_of`): 4xx ``invalid_input``; 5xx,
408 and 429 are retried while ``attempts`` is below ``maxReceiveCount`` (then the job fails with
that error): the job's lease is ended now, so that the sweeper takes it back at its next round
(:mod:`asyncinfer.jobs.leases`: queued again, and its message sent again).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

from aws_lambda_powertools.utilities.typing import LambdaContext

from asyncinfer.aws.payloads import PayloadStore, dumps
from asyncinfer.core import job_metrics, lifecycle
from asyncinfer.core.errors import JobCancelled, TransitionRefused, job_error
from asyncinfer.core.observability import instrument, powertools
from asyncinfer.core.settings import INLINE_OUTPUT_LIMIT_BYTES, Settings
from asyncinfer.core.settings_parts import CompletionSettings
from asyncinfer.core.timeutil import iso, now, parse
from asyncinfer.functions.sagemaker_bridge import parse_inference_id
from asyncinfer.jobs.record import JobRecord
from asyncinfer.jobs.store import LEASE_FIELD, JobStore
from asyncinfer.models.openai_server.invocations import failure_of, output_of
from asyncinfer.models.openai_server.protocol import EngineAnswerError

Publish = Callable[[JobRecord], Any]
#: Called as ``emit(metric_name, value, unit, model)``.
Emit = Callable[[str, float, str, str], None]


def _field(note: Mapping[str, Any], name: str) -> Any:
    """``name`` at the top level of ``note`` or under ``responseParameters``."""
    if note.get(name) is not None:
        return note[name]
    return (note.get("responseParameters") or {}).get(name)


def classify_failure(reason: str, detail: Any = None) -> dict[str, str]:
    """The job error ``{"code", "message"}`` for a SageMaker failure.

    ``detail`` is the parsed failure body the container returned, if any; a body of the
    contract's shape ``{"error": {"code", "message"}}`` wins.
    """
    if isinstance(detail, dict) and isinstance(detail.get("error"), dict):
        err = detail["error"]
        if err.get("code"):
            return job_error(str(err["code"]), str(err.get("message", reason))[:1000]).as_dict()
    low = reason.lower()
    if "timed out" in low or "timeout" in low or "ttl" in low or "expired" in low:
        code = "timeout"
    elif "memory" in low:
        code = "out_of_memory"
    elif "clienterror" in low and ("400" in low or "422" in low):
        code = "invalid_input"
    else:
        code = "model_error"
    return job_error(code, reason[:1000] or "SageMaker inference failed").as_dict()


class Completion:
    """Finishes jobs from SageMaker notifications.

    Args:
        settings: the completion Lambda's part (``Settings.completion``): table, bucket, topic.
        store / payloads: collaborators (built from ``settings`` when omitted).
        publish: publishes the job event of a record.
        emit: records job metrics (``JobsSucceeded``, ``JobsFailed``, ``RunSeconds``).
        logger: a logging.Logger-like object.
    """

    def __init__(
        self,
        *,
        settings: CompletionSettings,
        store: JobStore | None = None,
        payloads: PayloadStore | None = None,
        publish: Publish | None = None,
        emit: Emit | None = None,
        logger: Any = None,
    ) -> None:
        self.settings = settings
        self.store = store or JobStore(settings)
        self.payloads = payloads or PayloadStore(settings)
        if publish is None:
            from asyncinfer.jobs.events import EventPublisher

            publish = EventPublisher(settings, self.payloads).publish
        self.publish = publish
        self.emit = emit
        import logging

        self.log = logger or logging.getLogger(__name__)

    @classmethod
    def from_env(cls, **kwargs: Any) -> Completion:
        """Build from the environment (its part of :meth:`Settings.from_env`)."""
        return cls(settings=Settings.from_env().completion, **kwargs)

    def handle_sns_event(self, event: Mapping[str, Any]) -> dict[str, Any]:
        """Handle every SNS record of a Lambda event; returns ``{"jobs": {job_id: status}}``."""
        out: dict[str, str] = {}
        for rec in event.get("Records", []):
            note = json.loads(rec["Sns"]["Message"])
            job_id, status = self.handle_notification(note)
            if job_id:
                out[job_id] = status
        return {"jobs": out}

    def handle_notification(self, note: Mapping[str, Any]) -> tuple[str, str]:
        """Apply one notification; returns ``(job_id, resulting status or 'ignored')``."""
        job_id, attempt = parse_inference_id(str(note.get("inferenceId") or ""))
        if not job_id:
            self.log.warning("notification without inferenceId: %s", note)
            return "", "ignored"
        record = self.store.get(job_id)
        if record is None or record.get("status") != lifecycle.RUNNING:
            self.log.info("job %s is %s: notification ignored", job_id, record and record["status"])
            return job_id, "ignored"
        if (attempt or 1) != record.get("attempts"):
            self.log.info(
                "job %s runs attempt %s: notification of attempt %s ignored",
                job_id,
                record.get("attempts"),
                attempt,
            )
            return job_id, "ignored"
        fields: dict[str, Any] = {"completed_at": iso(now())}
        ok = str(note.get("invocationStatus", "")).lower() == "completed" and _field(
            note, "outputLocation"
        )
        engine_api = self.settings.sagemaker_engines.get(str(record.get("model", "")))
        if ok:
            to = lifecycle.SUCCEEDED
            location = str(_field(note, "outputLocation"))
            output = self.payloads.read_json(location)
            if engine_api:
                output, error = _engine_output(engine_api, output)
                if error is not None:
                    to, fields["error"] = lifecycle.FAILED, error
            body = dumps(output)
            if to == lifecycle.SUCCEEDED and len(body) > INLINE_OUTPUT_LIMIT_BYTES:
                # The engine's raw answer is not the job's output: the mapped one is stored.
                fields["output_ref"] = (
                    self.payloads.put_output(str(record.get("tenant")), job_id, body)
                    if engine_api
                    else location
                )
            elif to == lifecycle.SUCCEEDED:
                fields["output"] = body.decode()
        else:
            to = lifecycle.FAILED
            reason = str(_field(note, "failureReason") or "")
            detail = None
            failure_location = _field(note, "failureLocation")
            if failure_location:
                try:
                    detail = self.payloads.read_json(str(failure_location))
                except Exception:  # the failure body is optional and may not be JSON
                    detail = None
            fields["error"] = classify_failure(reason, detail)
            engine_error = failure_of(reason, detail) if engine_api else None
            if engine_error is not None:
                fields["error"] = engine_error.as_dict()
                again = (attempt or 1) < self.settings.max_receive_count  # else it fails here
                if engine_error.retryable and again and not record.get("cancel_requested"):
                    return job_id, self._retry(job_id, attempt or 1, engine_error.message)
        if record.get("cancel_requested"):
            # A SageMaker invocation cannot be stopped once it runs: a job cancelled meanwhile
            # ends cancelled when its result arrives, keeping what the endpoint produced.
            to = lifecycle.CANCELLED
            fields["error"] = JobCancelled(
                "cancelled by the client while the endpoint ran it"
            ).as_dict()
        try:
            new = self.store.transition(
                job_id,
                from_status=lifecycle.RUNNING,
                to_status=to,
                attempts=attempt or 1,
                set_fields=fields,
            )
        except TransitionRefused as exc:
            self.log.info("%s", exc)
            return job_id, "ignored"
        self.publish(new)
        if self.emit is not None:
            model = str(new.get("model", ""))
            if to != lifecycle.CANCELLED:
                name = (
                    job_metrics.JOBS_SUCCEEDED
                    if to == lifecycle.SUCCEEDED
                    else job_metrics.JOBS_FAILED
                )
                self.emit(name, 1, job_metrics.UNITS[name], model)
            if new.get("started_at"):
                run = (parse(fields["completed_at"]) - parse(new["started_at"])).total_seconds()
                rs = job_metrics.RUN_SECONDS
                self.emit(rs, run, job_metrics.UNITS[rs], model)
        return job_id, to

    def _retry(self, job_id: str, attempt: int, why: str) -> str:
        """End the lease of ``job_id``'s attempt now, so that the sweeper takes the job back at
        its next round (another attempt, or ``max_attempts``); returns ``retrying`` (or
        ``ignored`` when the job moved on meanwhile)."""
        ended = self.store.update_fields(
            job_id,
            status=lifecycle.RUNNING,
            attempts=attempt,
            set_fields={LEASE_FIELD: int(now().timestamp()) - 1},
        )
        self.log.warning("job %s attempt %s: retryable engine failure: %s", job_id, attempt, why)
        return "retrying" if ended else "ignored"


def _engine_output(api: str, answer: Any) -> tuple[Any, dict[str, str] | None]:
    """``(job output, None)`` of an engine's answer, or ``(answer, model_error)`` when it is of
    no documented shape."""
    try:
        return output_of(api, answer), None
    except EngineAnswerError as exc:
        return answer, job_error("model_error", f"the engine's answer: {exc}"[:1000]).as_dict()


logger, tracer, metrics = powertools("sagemaker-completion")
_completion: Completion | None = None


def emit(name: str, value: float, unit: str, model: str) -> None:
    """One job metric with the ``Model`` dimension only (:mod:`asyncinfer.core.job_metrics`): the
    metric the failure-rate alarm and the dashboard read. Powertools' ``single_metric`` would add
    its ``service`` dimension here, making a metric those never see."""
    job_metrics.emit(name, value, unit, model)


@instrument(logger, tracer, metrics)
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    """SNS (SageMaker async success and error topics) -> job record transition and job event.
    An exception makes Lambda retry the whole (one-record) event."""
    global _completion
    if _completion is None:
        _completion = Completion.from_env(logger=logger, emit=emit)
    return _completion.handle_sns_event(event)
