# mypy: disable-error-code="arg-type,var-annotated"
"""The Python paths of compute=sagemaker and the ECS backlog metric, with in-memory fakes (no
AWS): the bridge, the completion handler, the /invocations server (called directly and over
HTTP), and the backlog-per-task computation."""

from __future__ import annotations

import json
import threading
import urllib.request
from datetime import timedelta
from typing import Any

import pytest

from asyncinfer import lifecycle
from asyncinfer.backlog import BacklogConfig, backlog_point, publish_backlog_metrics
from asyncinfer.errors import TransitionRefused
from asyncinfer.models.echo import EchoHandler
from asyncinfer.models.registry import MODELS
from asyncinfer.sagemaker.bridge import Bridge
from asyncinfer.sagemaker.completion import Completion, classify_failure
from asyncinfer.sagemaker.server import InvocationsApp, make_server
from asyncinfer.settings import Settings
from asyncinfer.timeutil import iso, now


class FakeStore:
    """The subset of JobStore the SageMaker paths use, with its conditional semantics."""

    def __init__(self, records: dict[str, dict[str, Any]]) -> None:
        self.records = records

    def get(self, job_id: str, *, consistent: bool = True) -> dict[str, Any] | None:
        rec = self.records.get(job_id)
        return dict(rec) if rec else None

    def transition(
        self,
        job_id: str,
        *,
        from_status: Any,
        to_status: str,
        attempts: int | None = None,
        set_fields: dict[str, Any] | None = None,
        remove_fields: Any = (),
        increment_attempts: bool = False,
    ) -> dict[str, Any]:
        froms = (from_status,) if isinstance(from_status, str) else tuple(from_status)
        rec = self.records.get(job_id)
        if (
            rec is None
            or rec["status"] not in froms
            or (attempts is not None and rec.get("attempts") != attempts)
        ):
            raise TransitionRefused("refused", dict(rec) if rec else None)
        assert lifecycle.is_allowed(rec["status"], to_status)
        rec["status"] = to_status
        rec.update(set_fields or {})
        for f in remove_fields:
            rec.pop(f, None)
        if increment_attempts:
            rec["attempts"] = rec.get("attempts", 0) + 1
        return dict(rec)


class FakePayloads:
    def __init__(self, objects: dict[str, Any] | None = None) -> None:
        self.objects = objects or {}

    def put_input(self, tenant: str, job_id: str, body: bytes) -> str:
        uri = f"s3://bucket/inputs/{tenant}/{job_id}.json"
        self.objects[uri] = json.loads(body)
        return uri

    def read_json(self, uri: str) -> Any:
        return self.objects[uri]


class FakeRuntime:
    def __init__(self, fail: bool = False) -> None:
        self.calls: list[dict[str, Any]] = []
        self.fail = fail

    def invoke_endpoint_async(self, **kwargs: Any) -> dict[str, Any]:
        if self.fail:
            raise RuntimeError("throttled")
        self.calls.append(kwargs)
        return {"InferenceId": kwargs["InferenceId"], "OutputLocation": "s3://bucket/outputs/x.out"}


def _record(job_id: str, status: str = "queued", attempts: int = 0) -> dict[str, Any]:
    return {
        "job_id": job_id,
        "tenant": "t1",
        "model": "echo",
        "status": status,
        "attempts": attempts,
    }


def _message(job_id: str, *, ttl: float = 3600, timeout: int = 900, **extra: Any) -> dict[str, Any]:
    body = {
        "v": 1,
        "job_id": job_id,
        "tenant": "t1",
        "model": "echo",
        "expires_at": iso(now() + timedelta(seconds=ttl)),
        "timeout_seconds": timeout,
        "input": {"hello": "world"},
        "input_ref": None,
        **extra,
    }
    return {"messageId": f"m-{job_id}", "body": json.dumps(body)}


def _bridge(store: FakeStore, runtime: FakeRuntime, events: list[dict[str, Any]]) -> Bridge:
    return Bridge(
        settings=Settings(bucket="bucket"),
        endpoints={"echo": "ep-echo"},
        store=store,
        payloads=FakePayloads(),
        runtime=runtime,
        publish=events.append,
    )


def test_bridge_invokes_with_s3_input_job_id_ttl_and_timeout() -> None:
    store, runtime, events = FakeStore({"job_1": _record("job_1")}), FakeRuntime(), []
    out = _bridge(store, runtime, events).handle_sqs_event(
        {"Records": [_message("job_1", ttl=600, timeout=90)]}
    )
    assert out == {"batchItemFailures": []}
    call = runtime.calls[0]
    assert call["EndpointName"] == "ep-echo"
    assert call["InputLocation"] == "s3://bucket/inputs/t1/job_1.json"
    assert call["InferenceId"] == "job_1"
    assert 590 <= call["RequestTTLSeconds"] <= 600
    assert call["InvocationTimeoutSeconds"] == 90
    assert store.records["job_1"]["status"] == "running" and store.records["job_1"]["attempts"] == 1
    assert [e["status"] for e in events] == ["running"]


def test_bridge_uses_input_ref_and_clamps_to_sagemaker_limits() -> None:
    store, runtime = FakeStore({"job_2": _record("job_2")}), FakeRuntime()
    msg = _message(
        "job_2", ttl=259200, timeout=3600, input=None, input_ref="s3://bucket/inputs/t1/big.json"
    )
    _bridge(store, runtime, []).handle_sqs_event({"Records": [msg]})
    call = runtime.calls[0]
    assert call["InputLocation"] == "s3://bucket/inputs/t1/big.json"
    assert call["RequestTTLSeconds"] == 21600


def test_bridge_skips_cancelled_and_expires_late_jobs() -> None:
    store = FakeStore({"job_c": _record("job_c", "cancelled"), "job_e": _record("job_e")})
    runtime, events = FakeRuntime(), []
    out = _bridge(store, runtime, events).handle_sqs_event(
        {"Records": [_message("job_c"), _message("job_e", ttl=-5)]}
    )
    assert out == {"batchItemFailures": []}
    assert runtime.calls == []
    assert store.records["job_e"]["status"] == "expired"
    assert store.records["job_e"]["error"]["code"] == "expired"


def test_bridge_reports_failure_and_requeues_when_sagemaker_refuses() -> None:
    store = FakeStore({"job_f": _record("job_f")})
    out = _bridge(store, FakeRuntime(fail=True), []).handle_sqs_event(
        {"Records": [_message("job_f")]}
    )
    assert out == {"batchItemFailures": [{"itemIdentifier": "m-job_f"}]}
    assert store.records["job_f"]["status"] == "queued"


def _note(job_id: str, ok: bool, **extra: Any) -> dict[str, Any]:
    note: dict[str, Any] = {
        "inferenceId": job_id,
        "invocationStatus": "Completed" if ok else "Failed",
        "eventSource": "aws:sagemaker",
        "eventName": "InferenceResult",
    }
    note.update(extra)
    return {"Records": [{"Sns": {"Message": json.dumps(note)}}]}


def test_completion_succeeds_with_inline_output_and_publishes() -> None:
    store = FakeStore({"job_s": {**_record("job_s", "running", 1), "started_at": iso(now())}})
    payloads = FakePayloads({"s3://bucket/outputs/sagemaker/echo/a.out": {"hello": "world"}})
    events, metrics = [], []
    c = Completion(
        settings=Settings(),
        store=store,
        payloads=payloads,
        publish=events.append,
        emit=lambda *a: metrics.append(a),
    )
    out = c.handle_sns_event(
        _note(
            "job_s",
            True,
            responseParameters={"outputLocation": "s3://bucket/outputs/sagemaker/echo/a.out"},
        )
    )
    assert out == {"jobs": {"job_s": "succeeded"}}
    assert json.loads(store.records["job_s"]["output"]) == {"hello": "world"}
    assert events[0]["status"] == "succeeded"
    assert {m[0] for m in metrics} == {"JobsSucceeded", "RunSeconds"}


def test_completion_keeps_large_outputs_in_s3() -> None:
    store = FakeStore({"job_l": _record("job_l", "running", 1)})
    loc = "s3://bucket/outputs/sagemaker/echo/big.out"
    payloads = FakePayloads({loc: {"text": "x" * 70_000}})
    c = Completion(settings=Settings(), store=store, payloads=payloads, publish=lambda r: None)
    c.handle_sns_event(_note("job_l", True, responseParameters={"outputLocation": loc}))
    assert store.records["job_l"]["output_ref"] == loc
    assert "output" not in store.records["job_l"]


@pytest.mark.parametrize("where", ["top", "responseParameters"])
def test_completion_reads_failure_details_at_either_level(where: str) -> None:
    store = FakeStore({"job_x": _record("job_x", "running", 2)})
    loc = "s3://bucket/outputs/sagemaker-failures/echo/x.out"
    payloads = FakePayloads({loc: {"error": {"code": "invalid_input", "message": "bad field"}}})
    details = {"failureReason": "ClientError: Received client error (400)", "failureLocation": loc}
    note = _note("job_x", False, **(details if where == "top" else {"responseParameters": details}))
    c = Completion(settings=Settings(), store=store, payloads=payloads, publish=lambda r: None)
    assert c.handle_sns_event(note) == {"jobs": {"job_x": "failed"}}
    assert store.records["job_x"]["error"] == {"code": "invalid_input", "message": "bad field"}


def test_completion_ignores_late_and_duplicate_notifications() -> None:
    store = FakeStore({"job_d": _record("job_d", "cancelled", 1)})
    c = Completion(
        settings=Settings(), store=store, payloads=FakePayloads(), publish=lambda r: None
    )
    assert c.handle_sns_event(_note("job_d", False, failureReason="x")) == {
        "jobs": {"job_d": "ignored"}
    }
    assert store.records["job_d"]["status"] == "cancelled"


def test_failure_classification() -> None:
    assert classify_failure("Inference request timed out")["code"] == "timeout"
    assert classify_failure("CUDA out of memory")["code"] == "out_of_memory"
    assert classify_failure("something broke")["code"] == "model_error"


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


def test_backlog_counts_in_flight_and_flags_zero_capacity() -> None:
    assert backlog_point(visible=0, in_flight=1, running=1, desired=1)["BacklogPerTask"] == 1
    p = backlog_point(visible=5, in_flight=0, running=0, desired=0)
    assert p["BacklogWithoutCapacity"] == 1 and p["BacklogPerTask"] == 5
    p = backlog_point(visible=5, in_flight=0, running=0, desired=1)  # a task is starting
    assert p["BacklogWithoutCapacity"] == 0 and p["BacklogPerTask"] == 5
    assert backlog_point(visible=0, in_flight=0, running=2, desired=2)["BacklogPerTask"] == 0


def test_backlog_metrics_are_written_as_emf() -> None:
    class Sqs:
        def get_queue_attributes(self, **kw: Any) -> dict[str, Any]:
            return {
                "Attributes": {
                    "ApproximateNumberOfMessages": "7",
                    "ApproximateNumberOfMessagesNotVisible": "3",
                }
            }

    class Ecs:
        def describe_services(self, **kw: Any) -> dict[str, Any]:
            return {
                "services": [
                    {
                        "serviceName": "svc-echo",
                        "serviceArn": "arn:svc-echo",
                        "runningCount": 2,
                        "desiredCount": 2,
                    }
                ]
            }

    lines: list[str] = []
    cfg = BacklogConfig.from_env(
        {
            "ASYNCINFER_QUEUE_URLS": '{"echo": "https://q/echo"}',
            "ASYNCINFER_ECS_CLUSTER": "c",
            "ASYNCINFER_ECS_SERVICES": '{"echo": "svc-echo"}',
        }
    )
    points = publish_backlog_metrics(
        cfg, sqs=Sqs(), ecs=Ecs(), write=lines.append, clock=lambda: 1.0
    )
    assert points["echo"]["BacklogPerTask"] == 5
    doc = json.loads(lines[0])
    assert doc["_aws"]["CloudWatchMetrics"][0]["Namespace"] == "asyncinfer"
    assert doc["_aws"]["CloudWatchMetrics"][0]["Dimensions"] == [["Model"]]
    assert doc["Model"] == "echo" and doc["Backlog"] == 10 and doc["_aws"]["Timestamp"] == 1000
