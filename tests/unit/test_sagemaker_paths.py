"""The Python paths of compute=sagemaker and the ECS backlog metric, against moto in-process: the
bridge (real SQS messages from the submit path, moto's ``sagemaker-runtime``), the completion
handler (outputs and failure bodies where moto's async endpoint wrote them), job records in
DynamoDB, events as they reach the SNS topic; the /invocations server (called directly and over
HTTP) and the backlog-per-task computation."""

from __future__ import annotations

import json
import threading
import urllib.request
from datetime import timedelta
from typing import Any

import boto3
import pytest
import requests
from botocore.exceptions import ClientError
from moto import mock_aws

from asyncinfer.aws import clients
from asyncinfer.aws.payloads import PayloadStore
from asyncinfer.core import lifecycle
from asyncinfer.core.settings import Settings
from asyncinfer.core.timeutil import iso, now
from asyncinfer.functions.api.schemas import JobRequest
from asyncinfer.functions.sagemaker_bridge import Bridge, inference_id
from asyncinfer.functions.sagemaker_completion import Completion, classify_failure
from asyncinfer.jobs.service import JobService
from asyncinfer.jobs.store import JobStore
from asyncinfer.local.resources import Resources
from asyncinfer.models.echo import EchoHandler
from asyncinfer.models.registry import MODELS
from asyncinfer.scaling.backlog import BacklogConfig, backlog_point, publish_backlog_metrics
from asyncinfer.worker.sagemaker_server import InvocationsApp, make_server
from tests.conftest import drain_events

TENANT = "t1"
ENDPOINTS = {"echo": "ep-echo"}


# ---------------------------------------------------------------------------- helpers


def events(res: Resources) -> list[dict[str, Any]]:
    """The events published so far (drained from the subscribed event-log queue)."""
    return drain_events(clients.client("sqs"), res.event_log_queue)


def submit(settings: Settings, **req: Any) -> str:
    """Submit an echo job for ``TENANT`` through the real submit path; returns its id."""
    job, created = JobService(settings).submit(
        TENANT, JobRequest(model="echo", **{"input": {"hello": "world"}, **req})
    )
    assert created
    return str(job["id"])


def take_messages(settings: Settings) -> dict[str, dict[str, Any]]:
    """Receive the echo queue's messages as Lambda SQS event records, by job id."""
    sqs = clients.client("sqs", settings)
    url = settings.queue_url("echo", "normal")
    out: dict[str, dict[str, Any]] = {}
    while msgs := sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=0).get(
        "Messages", []
    ):
        for m in msgs:
            out[json.loads(m["Body"])["job_id"]] = {"messageId": m["MessageId"], "body": m["Body"]}
    return out


def take_message(settings: Settings, job_id: str) -> dict[str, Any]:
    """Receive ``job_id``'s message (the only one queued) as a Lambda SQS event record."""
    msgs = take_messages(settings)
    assert list(msgs) == [job_id]
    return msgs[job_id]


class RuntimeCalls:
    """Records what the bridge sends to moto's ``sagemaker-runtime`` (InvokeEndpointAsync
    parameters) and what moto answers (OutputLocation, FailureLocation), through botocore's
    event hooks on the real client; the calls themselves go to moto."""

    def __init__(self, settings: Settings) -> None:
        self.client = clients.client("sagemaker-runtime", settings)  # what Bridge uses
        self.calls: list[dict[str, Any]] = []
        self.responses: list[dict[str, Any]] = []
        ev = self.client.meta.events
        ev.register("before-parameter-build.sagemaker-runtime.InvokeEndpointAsync", self._params)
        ev.register("after-call.sagemaker-runtime.InvokeEndpointAsync", self._parsed)

    def _params(self, params: dict[str, Any], **_: Any) -> None:
        self.calls.append(dict(params))

    def _parsed(self, parsed: dict[str, Any], **_: Any) -> None:
        self.responses.append(parsed)


def queue_async_results(*results: dict[str, Any]) -> None:
    """Set what moto's async endpoint writes for the next invocations (moto's documented API:
    ``is_failure`` puts ``data`` at the failure location, otherwise at the output location)."""
    resp = requests.post(
        "http://motoapi.amazonaws.com/moto-api/static/sagemaker/async-endpoint-results",
        json={"results": list(results)},
        timeout=5,
    )
    assert resp.status_code < 300


def bridge(settings: Settings, runtime: Any = None) -> Bridge:
    """A bridge on the real store, payloads, event publisher and (default) moto's runtime."""
    return Bridge(settings=settings, endpoints=ENDPOINTS, runtime=runtime)


def run_on_sagemaker(settings: Settings, res: Resources, result: dict[str, Any]) -> tuple[str, Any]:
    """Submit a job and hand it to moto's async endpoint through the bridge, which writes
    ``result``; returns the job id and moto's InvokeEndpointAsync answer. Events drained."""
    queue_async_results(result)
    calls = RuntimeCalls(settings)
    job_id = submit(settings)
    out = bridge(settings).handle_sqs_event({"Records": [take_message(settings, job_id)]})
    assert out == {"batchItemFailures": []}
    record = JobStore(settings).get(job_id)
    assert record is not None and record["status"] == "running" and record["attempts"] == 1
    events(res)
    return job_id, calls.responses[-1]


def note(job_id: str, ok: bool, **extra: Any) -> dict[str, Any]:
    """A SageMaker async notification, as the Lambda receives it from SNS."""
    body: dict[str, Any] = {
        "inferenceId": job_id,
        "invocationStatus": "Completed" if ok else "Failed",
        "eventSource": "aws:sagemaker",
        "eventName": "InferenceResult",
    }
    body.update(extra)
    return {"Records": [{"Sns": {"Message": json.dumps(body)}}]}


# ---------------------------------------------------------------------------- bridge


def test_bridge_invokes_with_s3_input_job_id_ttl_and_timeout(
    settings: Settings, resources: Resources
) -> None:
    job_id = submit(settings, ttl_seconds=600, timeout_seconds=90)
    assert [e["data"]["status"] for e in events(resources)] == ["queued"]
    calls = RuntimeCalls(settings)
    out = bridge(settings).handle_sqs_event({"Records": [take_message(settings, job_id)]})
    assert out == {"batchItemFailures": []}
    call = calls.calls[0]
    assert call["EndpointName"] == "ep-echo"
    assert call["InputLocation"] == f"s3://{resources.bucket}/inputs/t1/{job_id}.json"
    # The job id and the attempt (issue 14: a late notification of attempt 1 is told apart).
    assert call["InferenceId"] == inference_id(job_id, 1) == f"{job_id}.a1"
    assert 590 <= call["RequestTTLSeconds"] <= 600
    assert call["InvocationTimeoutSeconds"] == 90
    assert calls.responses[0]["InferenceId"] == inference_id(job_id, 1)  # moto answered the call
    # The inline input was written where SageMaker reads it.
    assert PayloadStore(settings).read_json(call["InputLocation"]) == {"hello": "world"}
    record = JobStore(settings).get(job_id)
    assert record is not None
    assert record["status"] == "running" and record["attempts"] == 1
    published = events(resources)
    assert [e["data"]["status"] for e in published] == ["running"]
    assert published[0]["type"] == "job.started"


def test_bridge_uses_input_ref_and_clamps_to_sagemaker_limits(
    settings: Settings, resources: Resources
) -> None:
    # An input over the inline limit travels as input_ref (the submit path puts it in S3).
    big = {"text": "x" * (settings.inline_input_limit_bytes + 10)}
    job_id = submit(settings, input=big, ttl_seconds=259200, timeout_seconds=3600)
    msg = take_message(settings, job_id)
    input_ref = json.loads(msg["body"])["input_ref"]
    assert input_ref == f"s3://{resources.bucket}/inputs/t1/{job_id}.json"
    calls = RuntimeCalls(settings)
    bridge(settings).handle_sqs_event({"Records": [msg]})
    call = calls.calls[0]
    assert call["InputLocation"] == input_ref
    assert call["RequestTTLSeconds"] == 21600
    assert call["InvocationTimeoutSeconds"] == 3600


def test_bridge_skips_cancelled_and_expires_late_jobs(
    settings: Settings, resources: Resources
) -> None:
    job_c = submit(settings)
    JobService(settings).cancel(TENANT, job_c)
    job_e = submit(settings)
    msgs = take_messages(settings)
    msg_c, msg_e = msgs[job_c], msgs[job_e]
    # job_e's message is read after its deadline: expires_at has passed while it was queued.
    late = json.loads(msg_e["body"])
    late["expires_at"] = iso(now() - timedelta(seconds=5))
    msg_e["body"] = json.dumps(late)
    events(resources)
    calls = RuntimeCalls(settings)
    out = bridge(settings).handle_sqs_event({"Records": [msg_c, msg_e]})
    assert out == {"batchItemFailures": []}
    assert calls.calls == []
    store = JobStore(settings)
    cancelled, expired = store.get(job_c), store.get(job_e)
    assert cancelled is not None and cancelled["status"] == "cancelled"
    assert expired is not None and expired["status"] == "expired"
    assert expired["error"]["code"] == "expired"
    assert [(e["data"]["id"], e["type"]) for e in events(resources)] == [(job_e, "job.expired")]


class RefusingRuntime:
    """Stands in for an AWS-side refusal moto cannot produce: InvokeEndpointAsync throttled
    (moto's sagemaker-runtime accepts every call). Everything else in the test is moto."""

    def invoke_endpoint_async(self, **kwargs: Any) -> dict[str, Any]:
        raise ClientError(
            {"Error": {"Code": "ThrottlingException", "Message": "Rate exceeded"}},
            "InvokeEndpointAsync",
        )


def test_bridge_reports_failure_and_requeues_when_sagemaker_refuses(
    settings: Settings, resources: Resources
) -> None:
    job_id = submit(settings)
    msg = take_message(settings, job_id)
    events(resources)
    out = bridge(settings, runtime=RefusingRuntime()).handle_sqs_event({"Records": [msg]})
    assert out == {"batchItemFailures": [{"itemIdentifier": msg["messageId"]}]}
    record = JobStore(settings).get(job_id)
    assert record is not None and record["status"] == "queued"
    assert record["attempts"] == 1  # the attempt that was refused still counts
    assert events(resources) == []  # no job.started for a request SageMaker never took


# ---------------------------------------------------------------------------- completion


def test_completion_succeeds_with_inline_output_and_publishes(
    settings: Settings, resources: Resources
) -> None:
    job_id, answer = run_on_sagemaker(settings, resources, {"data": json.dumps({"hello": "world"})})
    metrics: list[tuple[Any, ...]] = []
    c = Completion(settings=settings, emit=lambda *a: metrics.append(a))
    out = c.handle_sns_event(
        note(job_id, True, responseParameters={"outputLocation": answer["OutputLocation"]})
    )
    assert out == {"jobs": {job_id: "succeeded"}}
    record = JobStore(settings).get(job_id)
    assert record is not None
    assert json.loads(record["output"]) == {"hello": "world"}
    published = events(resources)
    assert published[0]["data"]["status"] == "succeeded"
    assert published[0]["type"] == "job.succeeded"
    assert published[0]["data"]["output"] == {"hello": "world"}
    assert {m[0] for m in metrics} == {"JobsSucceeded", "RunSeconds"}


def test_completion_keeps_large_outputs_in_s3(settings: Settings, resources: Resources) -> None:
    job_id, answer = run_on_sagemaker(
        settings, resources, {"data": json.dumps({"text": "x" * 70_000})}
    )
    loc = answer["OutputLocation"]
    Completion(settings=settings).handle_sns_event(
        note(job_id, True, responseParameters={"outputLocation": loc})
    )
    record = JobStore(settings).get(job_id)
    assert record is not None
    assert record["output_ref"] == loc
    assert "output" not in record


@pytest.mark.parametrize("where", ["top", "responseParameters"])
def test_completion_reads_failure_details_at_either_level(
    where: str, settings: Settings, resources: Resources
) -> None:
    body = {"error": {"code": "invalid_input", "message": "bad field"}}
    job_id, answer = run_on_sagemaker(
        settings, resources, {"is_failure": True, "data": json.dumps(body)}
    )
    loc = answer["FailureLocation"]
    details = {"failureReason": "ClientError: Received client error (400)", "failureLocation": loc}
    n = note(job_id, False, **(details if where == "top" else {"responseParameters": details}))
    assert Completion(settings=settings).handle_sns_event(n) == {"jobs": {job_id: "failed"}}
    record = JobStore(settings).get(job_id)
    assert record is not None
    assert record["error"] == {"code": "invalid_input", "message": "bad field"}
    assert [e["type"] for e in events(resources)] == ["job.failed"]


def test_completion_ignores_late_and_duplicate_notifications(
    settings: Settings, resources: Resources
) -> None:
    job_id, _ = run_on_sagemaker(settings, resources, {"data": "{}"})
    store = JobStore(settings)
    store.transition(job_id, from_status=lifecycle.RUNNING, to_status=lifecycle.CANCELLED)
    c = Completion(settings=settings)
    assert c.handle_sns_event(note(job_id, False, failureReason="x")) == {
        "jobs": {job_id: "ignored"}
    }
    record = store.get(job_id)
    assert record is not None and record["status"] == "cancelled"
    assert events(resources) == []


def test_failure_classification() -> None:
    assert classify_failure("Inference request timed out")["code"] == "timeout"
    assert classify_failure("CUDA out of memory")["code"] == "out_of_memory"
    assert classify_failure("something broke")["code"] == "model_error"


# ---------------------------------------------------------------------------- /invocations


def test_invocations_app_runs_the_model_directly() -> None:
    app = InvocationsApp("echo", handler=EchoHandler(spec=MODELS["echo"]))
    assert app.ping()[0] == 200
    status, body = app.invoke(
        json.dumps({"a": 1}).encode(),
        {"X-Amzn-SageMaker-Custom-Attributes": "job_id=job_9;attempt=1"},
    )
    assert status == 200 and body["a"] == 1
    assert app.invoke(b"{not json")[0] == 400
    status, body = app.invoke(
        b"{}", {"X-Amzn-SageMaker-Custom-Attributes": "model=all-minilm-l6-v2"}
    )
    assert status == 400 and body["error"]["code"] == "invalid_input"


def test_invocations_server_over_http() -> None:
    app = InvocationsApp("echo", handler=EchoHandler(spec=MODELS["echo"]))
    server = make_server(app, host="127.0.0.1", port=0)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    base = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        with urllib.request.urlopen(f"{base}/ping", timeout=5) as r:
            assert r.status == 200
        req = urllib.request.Request(
            f"{base}/invocations",
            data=b'{"x": [1, 2]}',
            method="POST",
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=5) as r:
            assert json.loads(r.read())["x"] == [1, 2]
    finally:
        server.shutdown()
        server.server_close()


def test_invocations_ping_is_503_until_loaded() -> None:
    assert InvocationsApp("echo").ping()[0] == 503


# ---------------------------------------------------------------------------- backlog


def test_backlog_counts_in_flight_and_flags_zero_capacity() -> None:
    assert backlog_point(visible=0, in_flight=1, running=1, desired=1)["BacklogPerTask"] == 1
    p = backlog_point(visible=5, in_flight=0, running=0, desired=0)
    assert p["BacklogWithoutCapacity"] == 1 and p["BacklogPerTask"] == 5
    p = backlog_point(visible=5, in_flight=0, running=0, desired=1)  # a task is starting
    assert p["BacklogWithoutCapacity"] == 0 and p["BacklogPerTask"] == 5
    assert backlog_point(visible=0, in_flight=0, running=2, desired=2)["BacklogPerTask"] == 0


def test_backlog_metrics_are_written_as_emf(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MOTO_ECS_SERVICE_RUNNING", "2")  # moto's runningCount for new services
    with mock_aws():
        sqs = boto3.client("sqs", region_name="us-east-1")
        ecs = boto3.client("ecs", region_name="us-east-1")
        url = sqs.create_queue(QueueName="echo")["QueueUrl"]
        for i in range(10):
            sqs.send_message(QueueUrl=url, MessageBody=str(i))
        for _ in range(3):  # three in flight, seven visible
            got = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=1)["Messages"]
            assert len(got) == 1
        ecs.create_cluster(clusterName="c")
        ecs.register_task_definition(
            family="w", containerDefinitions=[{"name": "w", "image": "x", "memory": 128}]
        )
        ecs.create_service(cluster="c", serviceName="svc-echo", taskDefinition="w", desiredCount=2)
        lines: list[str] = []
        cfg = BacklogConfig.from_env(
            {
                "ASYNCINFER_QUEUE_URLS": json.dumps({"echo": url}),
                "ASYNCINFER_ECS_CLUSTER": "c",
                "ASYNCINFER_ECS_SERVICES": '{"echo": "svc-echo"}',
                "AWS_REGION": "us-east-1",
            }
        )
        points = publish_backlog_metrics(
            cfg, sqs=sqs, ecs=ecs, write=lines.append, clock=lambda: 1.0
        )
    assert points["echo"]["BacklogPerTask"] == 5
    assert points["echo"]["RunningTasks"] == 2
    doc = json.loads(lines[0])
    assert doc["_aws"]["CloudWatchMetrics"][0]["Namespace"] == "asyncinfer"
    assert doc["_aws"]["CloudWatchMetrics"][0]["Dimensions"] == [["Model"]]
    assert doc["Model"] == "echo" and doc["Backlog"] == 10 and doc["_aws"]["Timestamp"] == 1000


def test_cancel_while_the_endpoint_runs_ends_cancelled(
    settings: Settings, resources: Resources
) -> None:
    from asyncinfer.jobs.service import JobService

    job_id, answer = run_on_sagemaker(settings, resources, {"data": json.dumps({"n": 1})})
    view = JobService(settings).cancel("t1", job_id)
    assert view["status"] == "running"  # SageMaker cannot stop an invocation midway
    out = Completion(settings=settings).handle_sns_event(
        note(job_id, True, responseParameters={"outputLocation": answer["OutputLocation"]})
    )
    assert out == {"jobs": {job_id: "cancelled"}}
    record = JobStore(settings).get(job_id)
    assert record is not None
    assert record["status"] == "cancelled"
    assert record["error"]["code"] == "cancelled"
    assert events(resources)[-1]["type"] == "job.cancelled"
