"""The API handler, fed API Gateway proxy events, against moto in-process."""

from __future__ import annotations

import json
import threading
from datetime import timedelta
from typing import Any

import pytest

from asyncinfer.aws import clients
from asyncinfer.local.resources import Resources
from tests.conftest import ApiCaller, drain_events

PARIS = {
    "model": "smollm2-135m-instruct",
    "input": {"messages": [{"role": "user", "content": "What is the capital of France?"}]},
}


def queue_depth(res: Resources, model: str) -> int:
    attrs = clients.client("sqs").get_queue_attributes(
        QueueUrl=res.queues[model], AttributeNames=["ApproximateNumberOfMessages"]
    )["Attributes"]
    return int(attrs["ApproximateNumberOfMessages"])


def stored_items(res: Resources) -> int:
    return int(clients.client("dynamodb").scan(TableName=res.table, Select="COUNT")["Count"])


def events(res: Resources) -> list[dict[str, Any]]:
    """The events published so far (drained from the subscribed event-log queue)."""
    return drain_events(clients.client("sqs"), res.event_log_queue)


def test_health_needs_no_key(api: ApiCaller) -> None:
    status, body, _ = api("GET", "/v1/health", key_id=None)
    assert (status, body) == (200, {"status": "ok"})


def test_submit_returns_202_with_location_and_enqueues(
    api: ApiCaller, resources: Resources
) -> None:
    status, job, headers = api("POST", "/v1/jobs", {**PARIS, "metadata": {"request_ref": "abc"}})
    assert status == 202
    assert job["status"] == "queued"
    assert job["id"].startswith("job_") and len(job["id"]) == 30
    assert headers["location"] == f"/v1/jobs/{job['id']}"
    assert job["metadata"] == {"request_ref": "abc"}
    assert job["urls"]["cancel"] == f"/v1/jobs/{job['id']}/cancel"
    assert queue_depth(resources, "smollm2-135m-instruct") == 1
    evs = events(resources)
    assert [e["type"] for e in evs] == ["job.queued"]
    assert evs[0]["data"]["id"] == job["id"]


def test_event_has_filterable_message_attributes(api: ApiCaller, resources: Resources) -> None:
    # Subscribe a second queue without raw delivery to see the SNS envelope's attributes.
    sqs, sns = clients.client("sqs"), clients.client("sns")
    url = sqs.create_queue(QueueName="envelope")["QueueUrl"]
    arn = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"][
        "QueueArn"
    ]
    sns.subscribe(TopicArn=resources.topic_arn, Protocol="sqs", Endpoint=arn)
    api("POST", "/v1/jobs", {"model": "echo", "input": {"x": 1}})
    msg = json.loads(sqs.receive_message(QueueUrl=url)["Messages"][0]["Body"])
    attrs = {k: v["Value"] for k, v in msg["MessageAttributes"].items()}
    assert attrs == {
        "event_type": "job.queued",
        "model": "echo",
        "tenant": "tenant-a",
        "status": "queued",
        "has_webhook": "false",  # our extension: the webhook queue's filter (core.topology)
    }


def test_message_carries_the_queued_record(api: ApiCaller, resources: Resources) -> None:
    """The message holds every attribute of the queued record that the job object shows, so a
    worker that starts the job on its first delivery knows the record it wrote."""
    from asyncinfer.jobs.store import JobStore

    hook = {"url": "https://example.com/hook", "events": ["job.succeeded"]}
    status, job, _ = api(
        "POST",
        "/v1/jobs",
        {"model": "echo", "input": {"x": 1}, "metadata": {"ref": "a"}, "webhook": hook},
    )
    assert status == 202
    msg = json.loads(
        clients.client("sqs").receive_message(QueueUrl=resources.queues["echo"])["Messages"][0][
            "Body"
        ]
    )
    record = JobStore().get(job["id"])
    assert record is not None
    for key in ("created_at", "metadata", "webhook", "expires_at", "timeout_seconds", "priority"):
        assert msg[key] == record[key]


def test_malformed_json_is_400_and_stores_nothing(api: ApiCaller, resources: Resources) -> None:
    status, body, _ = api("POST", "/v1/jobs", raw=b'{"model": "echo", "input": {')
    assert status == 400
    assert body["error"]["code"] == "invalid_json"
    assert stored_items(resources) == 0
    assert queue_depth(resources, "echo") == 0


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"model": "gpt-9", "input": {}}, "model"),
        ({**PARIS, "input": {**PARIS["input"], "max_new_tokens": 5000}}, "input.max_new_tokens"),
        ({**PARIS, "input": {**PARIS["input"], "temperature": 3}}, "input.temperature"),
        ({**PARIS, "input": {"messages": [{"role": "robot", "content": "x"}]}}, "input.messages"),
        ({**PARIS, "input": {"prompt": "x", "messages": PARIS["input"]["messages"]}}, "input"),
        ({"model": "all-minilm-l6-v2", "input": {"texts": []}}, "input.texts"),
        ({"model": "echo", "input": {"sleep_seconds": 61}}, "input.sleep_seconds"),
        ({**PARIS, "ttl_seconds": 5}, "ttl_seconds"),
        ({**PARIS, "timeout_seconds": 3601}, "timeout_seconds"),
        ({**PARIS, "priority": "urgent"}, "priority"),
        ({**PARIS, "metadata": {f"k{i}": "v" for i in range(17)}}, "metadata"),
        ({**PARIS, "metadata": {"k": 1}}, "metadata.k"),
        ({**PARIS, "colour": "blue"}, "colour"),
        ({"model": "echo"}, "body"),
        ({**PARIS, "input_url": "s3://b/k"}, "body"),
        ({"model": "echo", "input_url": "https://example.com/x"}, "input_url"),
        ({**PARIS, "webhook": {"url": "https://10.0.0.1/hook"}}, "webhook.url"),
        ({**PARIS, "webhook": {"url": "https://x.example", "events": ["job.done"]}}, "webhook"),
        ({**PARIS, "webhook": {"url": "https://10.0.0.1./hook"}}, "webhook.url"),
        ({**PARIS, "webhook": {"url": "https://10.0.0.1 /hook"}}, "webhook.url"),
        ({**PARIS, "metadata": {"": "v"}}, "metadata"),
        ({**PARIS, "timeout_seconds": True}, "timeout_seconds"),
        ({**PARIS, "ttl_seconds": "100"}, "ttl_seconds"),
        ({**PARIS, "input": {**PARIS["input"], "max_new_tokens": True}}, "input.max_new_tokens"),
        ({**PARIS, "input": {**PARIS["input"], "temperature": True}}, "input.temperature"),
        ({"model": "echo", "input": {"sleep_seconds": "5"}}, "input.sleep_seconds"),
        (
            {"model": "echo", "input_url": "s3://asyncinfer-payloads:80/uploads/tenant-a/x"},
            "input_url",
        ),
        ({"model": "echo", "input_url": "s3://Bad_Bucket/uploads/tenant-a/x"}, "input_url"),
    ],
)
def test_invalid_requests_are_422_naming_the_field(
    api: ApiCaller, resources: Resources, body: dict[str, Any], field: str
) -> None:
    status, resp, _ = api("POST", "/v1/jobs", body)
    assert status == 422, resp
    assert resp["error"]["code"] == "invalid_request"
    fields = [d["field"] for d in resp["error"]["details"]]
    assert any(f == field or f.startswith(field + ".") for f in fields), fields
    assert stored_items(resources) == 0
    assert all(queue_depth(resources, m) == 0 for m in resources.queues)


def test_non_object_body_is_422(api: ApiCaller) -> None:
    status, resp, _ = api("POST", "/v1/jobs", [1, 2])
    assert status == 422
    assert resp["error"]["code"] == "invalid_request"


def test_body_over_the_lambda_limit_is_413(api: ApiCaller, resources: Resources) -> None:
    big = {"model": "echo", "input": {"blob": "x" * (6 * 1024 * 1024 + 10)}}
    status, resp, _ = api("POST", "/v1/jobs", big)
    assert status == 413
    assert resp["error"]["code"] == "payload_too_large"
    assert stored_items(resources) == 0


def test_large_input_goes_to_s3_with_a_pointer(api: ApiCaller, resources: Resources) -> None:
    status, job, _ = api("POST", "/v1/jobs", {"model": "echo", "input": {"blob": "y" * 70_000}})
    assert status == 202
    sqs = clients.client("sqs")
    msg = json.loads(sqs.receive_message(QueueUrl=resources.queues["echo"])["Messages"][0]["Body"])
    assert msg["input"] is None
    assert msg["input_ref"] == f"s3://{resources.bucket}/inputs/tenant-a/{job['id']}.json"
    body = (
        clients.client("s3")
        .get_object(Bucket=resources.bucket, Key=f"inputs/tenant-a/{job['id']}.json")["Body"]
        .read()
    )
    assert json.loads(body) == {"blob": "y" * 70_000}


def test_input_url_must_be_the_tenants_own_upload(api: ApiCaller, resources: Resources) -> None:
    other = f"s3://{resources.bucket}/outputs/tenant-b/job_x.json"
    status, resp, _ = api("POST", "/v1/jobs", {"model": "echo", "input_url": other})
    assert status == 422
    assert resp["error"]["details"][0]["field"] == "input_url"
    status, up, _ = api("POST", "/v1/uploads")
    assert status == 201
    assert up["input_url"].startswith(f"s3://{resources.bucket}/uploads/tenant-a/")
    assert up["upload_url"].startswith("http")
    status, _, _ = api("POST", "/v1/jobs", {"model": "echo", "input_url": up["input_url"]})
    assert status == 202


def test_other_tenant_gets_404_never_403(api: ApiCaller) -> None:
    _, job, _ = api("POST", "/v1/jobs", {"model": "echo", "input": {}})
    for method, path in (
        ("GET", f"/v1/jobs/{job['id']}"),
        ("POST", f"/v1/jobs/{job['id']}/cancel"),
    ):
        status, resp, _ = api(method, path, key_id="tenant-b")
        assert status == 404
        assert resp["error"]["code"] == "not_found"
    status, page, _ = api("GET", "/v1/jobs", key_id="tenant-b")
    assert page["jobs"] == []
    status, same, _ = api("GET", f"/v1/jobs/{job['id']}")
    assert status == 200 and same["id"] == job["id"]


@pytest.mark.parametrize("job_id", ["job_01ARZ3NDEKTSV4RRFFQ69G5FAV", "nope", "job_%2e%2e"])
def test_unknown_job_is_404(api: ApiCaller, job_id: str) -> None:
    status, resp, _ = api("GET", f"/v1/jobs/{job_id}")
    assert status == 404
    assert resp["error"]["code"] == "not_found"


def test_list_is_newest_first_with_cursor_and_filters(api: ApiCaller) -> None:
    ids = [api("POST", "/v1/jobs", {"model": "echo", "input": {"n": i}})[1]["id"] for i in range(5)]
    api("POST", f"/v1/jobs/{ids[1]}/cancel")
    status, page1, _ = api("GET", "/v1/jobs?limit=2")
    assert status == 200
    assert [j["id"] for j in page1["jobs"]] == [ids[4], ids[3]]
    _, page2, _ = api("GET", f"/v1/jobs?limit=2&cursor={page1['next_cursor']}")
    assert [j["id"] for j in page2["jobs"]] == [ids[2], ids[1]]
    _, page3, _ = api("GET", f"/v1/jobs?limit=2&cursor={page2['next_cursor']}")
    assert [j["id"] for j in page3["jobs"]] == [ids[0]]
    assert page3["next_cursor"] is None
    _, cancelled, _ = api("GET", "/v1/jobs?status=cancelled")
    assert [j["id"] for j in cancelled["jobs"]] == [ids[1]]
    _, none, _ = api("GET", "/v1/jobs?model=all-minilm-l6-v2")
    assert none["jobs"] == []
    status, resp, _ = api("GET", f"/v1/jobs?cursor={page1['next_cursor']}", key_id="tenant-b")
    assert status == 422 and resp["error"]["details"][0]["field"] == "cursor"


@pytest.mark.parametrize(
    ("query", "field"),
    [
        ("limit=0", "limit"),
        ("limit=101", "limit"),
        ("status=done", "status"),
        ("cursor=zz", "cursor"),
    ],
)
def test_list_rejects_bad_queries(api: ApiCaller, query: str, field: str) -> None:
    status, resp, _ = api("GET", f"/v1/jobs?{query}")
    assert status == 422
    assert resp["error"]["details"][0]["field"] == field


def test_wait_out_of_range_is_422(api: ApiCaller) -> None:
    _, job, _ = api("POST", "/v1/jobs", {"model": "echo", "input": {}})
    status, resp, _ = api("GET", f"/v1/jobs/{job['id']}?wait=25")
    assert status == 422
    assert resp["error"]["details"][0]["field"] == "wait"


def test_cancel_queued_then_conflict(api: ApiCaller, resources: Resources) -> None:
    _, job, _ = api("POST", "/v1/jobs", {"model": "echo", "input": {}})
    status, cancelled, _ = api("POST", f"/v1/jobs/{job['id']}/cancel")
    assert status == 200
    assert cancelled["status"] == "cancelled"
    assert cancelled["error"]["code"] == "cancelled"
    status, resp, _ = api("POST", f"/v1/jobs/{job['id']}/cancel")
    assert status == 409
    assert resp["error"]["code"] == "conflict"
    assert [e["type"] for e in events(resources)] == ["job.queued", "job.cancelled"]


def test_queued_job_past_ttl_expires_when_read(
    api: ApiCaller, resources: Resources, monkeypatch: pytest.MonkeyPatch
) -> None:
    import asyncinfer.jobs.service as jobs_mod

    _, job, _ = api("POST", "/v1/jobs", {"model": "echo", "input": {}, "ttl_seconds": 10})
    real_now = jobs_mod.now
    monkeypatch.setattr(jobs_mod, "now", lambda: real_now() + timedelta(seconds=11))
    _, got, _ = api("GET", f"/v1/jobs/{job['id']}")
    assert got["status"] == "expired"
    assert got["error"]["code"] == "expired"
    assert [e["type"] for e in events(resources)] == ["job.queued", "job.expired"]


def test_idempotency_key_returns_the_original_job(api: ApiCaller, resources: Resources) -> None:
    body = {"model": "echo", "input": {"a": 1, "b": [1, 2]}}
    hdr = {"Idempotency-Key": "order-42"}
    s1, j1, _ = api("POST", "/v1/jobs", body, headers=hdr)
    # Same body with keys in another order: compared as parsed JSON.
    raw = b'{"input": {"b": [1, 2], "a": 1}, "model": "echo"}'
    s2, j2, _ = api("POST", "/v1/jobs", raw=raw, headers=hdr)
    assert (s1, s2) == (202, 200)
    assert j1["id"] == j2["id"]
    s3, j3, _ = api("POST", "/v1/jobs", {"model": "echo", "input": {"a": 2}}, headers=hdr)
    assert s3 == 409 and j3["error"]["code"] == "conflict"
    # Another tenant's identical key is its own.
    s4, j4, _ = api("POST", "/v1/jobs", body, headers=hdr, key_id="tenant-b")
    assert s4 == 202 and j4["id"] != j1["id"]
    assert queue_depth(resources, "echo") == 2


def test_concurrent_duplicate_submits_create_one_job(api: ApiCaller, resources: Resources) -> None:
    results: list[tuple[int, str]] = []

    def submit() -> None:
        s, j, _ = api(
            "POST", "/v1/jobs", {"model": "echo", "input": {}}, headers={"Idempotency-Key": "k1"}
        )
        results.append((s, j["id"]))

    threads = [threading.Thread(target=submit) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len({jid for _, jid in results}) == 1
    assert sorted(s for s, _ in results).count(202) == 1
    assert queue_depth(resources, "echo") == 1


def test_models_and_openapi(api: ApiCaller) -> None:
    status, body, _ = api("GET", "/v1/models")
    assert status == 200
    by_id = {m["id"]: m for m in body["models"]}
    assert set(by_id) == {"smollm2-135m-instruct", "all-minilm-l6-v2", "echo"}
    gen = by_id["smollm2-135m-instruct"]
    assert gen["task"] == "text-generation"
    assert gen["input_schema"]["properties"]["max_new_tokens"]["maximum"] == 1024
    status, doc, _ = api("GET", "/v1/openapi.json")
    assert status == 200
    assert doc["openapi"].startswith("3.")
    assert {"/v1/jobs", "/v1/jobs/{job_id}", "/v1/jobs/{job_id}/cancel"} <= set(doc["paths"])
    schemas = doc["components"]["schemas"]
    assert "JobRequest" in schemas and "JobView" in schemas


def test_unknown_route_is_404_in_spec_shape(api: ApiCaller) -> None:
    status, body, _ = api("GET", "/v2/nothing")
    assert status == 404
    assert body["error"]["code"] == "not_found"


@pytest.mark.parametrize(
    "raw",
    [
        b'{"model": "echo", "input": {"x": NaN}}',
        b'{"model": "echo", "input": {"x": Infinity}}',
        b'{"model": "echo", "input": {"x": -Infinity}}',
        b'{"model": "echo", "input": {"s": "\\ud800"}}',
        b'{"model": "echo", "input": {"a": ' + b"[" * 5000 + b"]" * 5000 + b"}}",
        b"",
    ],
)
def test_strict_json_or_400(api: ApiCaller, resources: Resources, raw: bytes) -> None:
    status, resp, _ = api("POST", "/v1/jobs", raw=raw)
    assert status == 400, resp
    assert resp["error"]["code"] == "invalid_json"
    assert stored_items(resources) == 0


def test_body_that_is_not_utf8_is_400(resources: Resources) -> None:
    from asyncinfer.functions.api.app import handler
    from asyncinfer.local.gateway import build_event
    from asyncinfer.local.lambda_runtime import LocalContext

    event = build_event(
        "POST",
        "/v1/jobs",
        [("content-type", "application/json")],
        b'{"model": "echo", "input": {"x": "\xff\xfe"}}',
        api_key="k",
        api_key_id="tenant-a",
        source_ip="127.0.0.1",
    )
    assert event["isBase64Encoded"] is True
    resp = handler(event, LocalContext())
    assert resp["statusCode"] == 400
    assert json.loads(resp["body"])["error"]["code"] == "invalid_json"


def test_forged_cursor_is_422(api: ApiCaller) -> None:
    import base64

    forged = base64.urlsafe_b64encode(b'{"job_id":"","tenant":"tenant-a"}').decode().rstrip("=")
    status, resp, _ = api("GET", f"/v1/jobs?cursor={forged}")
    assert status == 422
    assert resp["error"]["details"][0]["field"] == "cursor"


def test_metadata_with_any_key_round_trips(api: ApiCaller) -> None:
    meta = {"a.b": "1", "emoji 🚀": "✓", "k" * 100: "v"}
    status, job, _ = api("POST", "/v1/jobs", {"model": "echo", "input": {}, "metadata": meta})
    assert status == 202
    _, got, _ = api("GET", f"/v1/jobs/{job['id']}")
    assert got["metadata"] == meta
    _, page, _ = api("GET", "/v1/jobs")
    assert page["jobs"][0]["metadata"] == meta
