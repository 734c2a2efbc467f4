"""POST /v1/jobs: what the API accepts a worker can read, and a submit that fails leaves nothing
behind (issue 14, behaviours 2 and 3)."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from botocore.exceptions import ClientError, ReadTimeoutError

from asyncinfer.aws import clients
from asyncinfer.aws.payloads import MAX_JSON_DEPTH
from asyncinfer.functions.api.app import service
from asyncinfer.jobs import idempotency, transitions
from asyncinfer.jobs.messages import MAX_MESSAGE_BYTES, JobMessage
from asyncinfer.jobs.service import JobService
from asyncinfer.jobs.store import JobStore
from asyncinfer.local.resources import Resources
from tests.conftest import ApiCaller, apply_env


def items(res: Resources) -> list[dict[str, Any]]:
    return list(clients.client("dynamodb").scan(TableName=res.table)["Items"])


def messages(res: Resources, model: str = "echo") -> list[str]:
    sqs = clients.client("sqs")
    out = sqs.receive_message(QueueUrl=res.queues[model], MaxNumberOfMessages=10)
    return [m["Body"] for m in out.get("Messages", [])]


def s3_keys(res: Resources) -> list[str]:
    resp = clients.client("s3").list_objects_v2(Bucket=res.bucket)
    return [o["Key"] for o in resp.get("Contents", [])]


def nested(depth: int) -> dict[str, Any]:
    """An input object nested ``depth`` levels deep (the object itself is level 1)."""
    value: Any = []
    for _ in range(depth - 2):
        value = [value]
    return {"a": value}


def fail_sends(monkeypatch: pytest.MonkeyPatch, exc: Exception) -> list[int]:
    sent: list[int] = []
    sqs = service().sqs

    def send_message(**kwargs: Any) -> Any:
        sent.append(1)
        raise exc

    monkeypatch.setattr(sqs, "send_message", send_message)
    return sent


SQS_DOWN = ClientError({"Error": {"Code": "ServiceUnavailable", "Message": "down"}}, "SendMessage")


# ---------------------------------------------------------------------------- JSON limits
def test_input_nested_past_the_limit_is_422_and_stores_nothing(
    api: ApiCaller, resources: Resources
) -> None:
    # 300 levels: Python's json (API) takes it, the worker's message parser (200) does not.
    for depth in (MAX_JSON_DEPTH + 1, 300):
        status, resp, _ = api("POST", "/v1/jobs", {"model": "echo", "input": nested(depth)})
        assert status == 422, resp
        assert resp["error"]["details"][0]["field"] == "input"
    assert items(resources) == [] and messages(resources) == []


def test_input_at_the_depth_limit_reaches_the_worker_unchanged(
    api: ApiCaller, resources: Resources
) -> None:
    inp = nested(MAX_JSON_DEPTH)
    status, _, _ = api("POST", "/v1/jobs", {"model": "echo", "input": inp})
    assert status == 202
    (body,) = messages(resources)
    assert JobMessage.model_validate_json(body).input == inp  # the worker's parser


def test_number_json_cannot_carry_is_422(api: ApiCaller, resources: Resources) -> None:
    # 1e400 parses to infinity, which would reach the worker as null.
    raw = b'{"model": "echo", "input": {"x": [1e400]}}'
    status, resp, _ = api("POST", "/v1/jobs", raw=raw)
    assert status == 422, resp
    assert resp["error"]["details"][0]["field"] == "input"
    assert items(resources) == []


def test_inline_input_over_the_configured_cap_is_413(
    api: ApiCaller, resources: Resources, clean_env: pytest.MonkeyPatch
) -> None:
    apply_env(clean_env, {"ASYNCINFER_MAX_INPUT_BYTES": "1000"})
    status, resp, _ = api("POST", "/v1/jobs", {"model": "echo", "input": {"s": "x" * 1000}})
    assert status == 413
    assert resp["error"]["details"][0]["field"] == "input"
    assert items(resources) == [] and s3_keys(resources) == []


def test_message_too_large_for_sqs_moves_the_input_to_s3(
    api: ApiCaller, resources: Resources, clean_env: pytest.MonkeyPatch
) -> None:
    # An inline limit above SQS's message limit: the message would be refused after the put.
    apply_env(clean_env, {"ASYNCINFER_INLINE_INPUT_BYTES": str(1024 * 1024)})
    inp = {"s": "é" * 150_000}  # 300 KB of UTF-8
    status, _, _ = api("POST", "/v1/jobs", {"model": "echo", "input": inp})
    assert status == 202
    (body,) = messages(resources)
    assert JobMessage.size(body) <= MAX_MESSAGE_BYTES
    msg = JobMessage.model_validate_json(body)
    assert msg.input is None and msg.input_ref
    assert service().payloads.read_json(msg.input_ref) == inp


def test_message_holds_only_characters_sqs_takes(api: ApiCaller, resources: Resources) -> None:
    inp = {"s": "a\ufffeb\uffff", "\ufffe": "é\u2028"}
    status, _, _ = api("POST", "/v1/jobs", {"model": "echo", "input": inp})
    assert status == 202
    (body,) = messages(resources)
    assert "\ufffe" not in body and "\uffff" not in body
    assert JobMessage.model_validate_json(body).input == inp


def test_embedding_texts_have_a_per_text_limit(api: ApiCaller) -> None:
    from asyncinfer.models.schemas import MAX_EMBEDDING_TEXT_CHARS

    big = {
        "model": "all-minilm-l6-v2",
        "input": {"texts": ["ok", "x" * (MAX_EMBEDDING_TEXT_CHARS + 1)]},
    }
    status, resp, _ = api("POST", "/v1/jobs", big)
    assert status == 422
    assert resp["error"]["details"][0]["field"] == "input.texts.1"
    ok = {"model": "all-minilm-l6-v2", "input": {"texts": ["x" * MAX_EMBEDDING_TEXT_CHARS]}}
    assert api("POST", "/v1/jobs", ok)[0] == 202


# ---------------------------------------------------------------------------- failed submits
@pytest.mark.parametrize(
    "exc",
    [SQS_DOWN, ReadTimeoutError(endpoint_url="http://127.0.0.1:1")],
    ids=["client-error", "read-timeout"],
)
def test_enqueue_error_leaves_no_record_no_input_and_no_500_for_input(
    api: ApiCaller, resources: Resources, monkeypatch: pytest.MonkeyPatch, exc: Exception
) -> None:
    service()  # built before the patch
    sent = fail_sends(monkeypatch, exc)
    big = {"model": "echo", "input": {"blob": "y" * 70_000}}  # goes through S3
    status, resp, _ = api("POST", "/v1/jobs", big, headers={"Idempotency-Key": "k-1"})
    assert sent and status == 500 and resp["error"]["code"] == "internal"
    assert items(resources) == []  # no record, no idempotency claim
    assert s3_keys(resources) == []  # no stored input
    assert messages(resources) == []
    # The key is free again: the retry makes the job.
    monkeypatch.undo()
    status, job, _ = api("POST", "/v1/jobs", big, headers={"Idempotency-Key": "k-1"})
    assert status == 202
    assert [json.loads(b)["job_id"] for b in messages(resources)] == [job["id"]]


def test_message_sent_before_a_failure_is_dropped_by_the_worker_rule(
    api: ApiCaller, resources: Resources, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The confirm after the send fails: the record goes, so the sent message finds none.
    svc = service()

    def confirm(*_: Any) -> None:
        raise SQS_DOWN

    monkeypatch.setattr(svc.store, "confirm_submitted", confirm)
    status, _, _ = api("POST", "/v1/jobs", {"model": "echo", "input": {}})
    assert status == 500
    (body,) = messages(resources)
    assert JobStore(svc.settings).get(json.loads(body)["job_id"]) is None


def test_a_confirm_that_fails_after_a_worker_started_the_job_is_a_202_with_its_input_kept(
    api: ApiCaller, resources: Resources, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Review finding: the message went out and a worker started the job before the confirm
    failed: the job is accepted (a 500 would have the client submit it twice) and its stored
    input is not deleted under the running worker."""
    svc = service()

    def confirm(job_id: str, *_: Any) -> None:
        svc.store.apply(transitions.start(job_id, attempts=0, started_at="2026-12-01T00:00:00Z"))
        raise SQS_DOWN

    monkeypatch.setattr(svc.store, "confirm_submitted", confirm)
    big = {"model": "echo", "input": {"blob": "y" * 70_000}}  # goes through S3
    status, job, _ = api("POST", "/v1/jobs", big)
    assert status == 202
    record = JobStore(svc.settings).get(job["id"])
    assert record is not None and record["status"] == "running"
    assert len(s3_keys(resources)) == 1  # the input the worker reads


def test_submit_that_died_part_way_leaves_a_record_the_sweeper_ends_soon(
    api: ApiCaller, resources: Resources, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A Lambda timeout after the record was written: nothing of the submit runs any more.
    svc = service()
    fail_sends(monkeypatch, SQS_DOWN)
    monkeypatch.setattr(JobService, "_take_back", lambda *a, **k: None)
    monkeypatch.setattr(svc.keys, "release", lambda *a, **k: None)
    status, _, _ = api("POST", "/v1/jobs", {"model": "echo", "input": {}, "ttl_seconds": 259200})
    assert status == 500
    (item,) = items(resources)
    job_id = item["job_id"]["S"]
    lease = svc.settings.submit_lease_seconds
    assert int(item["submitting_until"]["N"]) <= time.time() + lease
    store = JobStore(svc.settings)
    assert job_id not in store.queued_past_expiry(int(time.time()))
    # Found by the expiry sweeper's query once the lease is over, not after the 3-day TTL.
    assert job_id in store.queued_past_expiry(int(time.time()) + lease + 1)


def test_successful_submit_keeps_its_ttl_for_the_sweeper(
    api: ApiCaller, resources: Resources
) -> None:
    _, job, _ = api("POST", "/v1/jobs", {"model": "echo", "input": {}, "ttl_seconds": 3600})
    record = JobStore(service().settings).get(job["id"])
    assert record is not None and "submitting_until" not in record
    assert record["expires_epoch"] >= time.time() + 3500


# ---------------------------------------------------------------------------- idempotency
def put_claim(res: Resources, tenant: str, key: str, body: dict[str, Any], **attrs: int) -> None:
    item = {
        "job_id": {"S": idempotency.IdempotencyKeys.item_id(tenant, key)},
        "target": {"S": "job_01ARZ3NDEKTSV4RRFFQ69G5FAV"},
        "body_hash": {"S": idempotency.body_hash(body)},
        **{k: {"N": str(v)} for k, v in attrs.items()},
    }
    clients.client("dynamodb").put_item(TableName=res.table, Item=item)


def canonical(body: dict[str, Any]) -> dict[str, Any]:
    from asyncinfer.functions.api.schemas import JobRequest

    return JobRequest.model_validate(body).model_dump(mode="json")


def test_key_of_a_submit_that_died_is_free_once_its_lease_is_over(
    api: ApiCaller, resources: Resources
) -> None:
    body = {"model": "echo", "input": {"n": 1}}
    now = int(time.time())
    # Claimed by a request that timed out 10 minutes ago: a lease, not a 24 h lock.
    put_claim(
        resources,
        "tenant-a",
        "k-2",
        canonical(body),
        valid_until=now + 23 * 3600,
        lease_until=now - 480,
    )
    t0 = time.monotonic()
    status, job, _ = api("POST", "/v1/jobs", body, headers={"Idempotency-Key": "k-2"})
    assert status == 202 and time.monotonic() - t0 < 2
    s2, again, _ = api("POST", "/v1/jobs", body, headers={"Idempotency-Key": "k-2"})
    assert (s2, again["id"]) == (200, job["id"])


def test_key_held_by_a_request_in_progress_is_409_not_a_second_job(
    api: ApiCaller, resources: Resources, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(idempotency, "WAIT_FOR_CLAIM_SECONDS", 0.3)
    body = {"model": "echo", "input": {"n": 1}}
    now = int(time.time())
    put_claim(
        resources,
        "tenant-a",
        "k-3",
        canonical(body),
        valid_until=now + 24 * 3600,
        lease_until=now + 100,
    )
    status, resp, _ = api("POST", "/v1/jobs", body, headers={"Idempotency-Key": "k-3"})
    assert status == 409 and resp["error"]["code"] == "conflict"
    assert resp["error"]["details"][0]["type"] == "in_progress"  # retry later, not another body
    assert messages(resources) == []


def test_done_key_returns_its_job_for_24_hours(
    api: ApiCaller, resources: Resources, monkeypatch: pytest.MonkeyPatch
) -> None:
    body = {"model": "echo", "input": {"n": 2}}
    hdr = {"Idempotency-Key": "k-4"}
    _, job, _ = api("POST", "/v1/jobs", body, headers=hdr)
    real = time.time
    monkeypatch.setattr(idempotency.time, "time", lambda: real() + 23.5 * 3600)
    s, again, _ = api("POST", "/v1/jobs", body, headers=hdr)
    assert (s, again["id"]) == (200, job["id"])
    s, _, _ = api("POST", "/v1/jobs", {**body, "priority": "high"}, headers=hdr)
    assert s == 409
    monkeypatch.setattr(idempotency.time, "time", lambda: real() + 24 * 3600 + 5)
    s, fresh, _ = api("POST", "/v1/jobs", body, headers=hdr)
    assert s == 202 and fresh["id"] != job["id"]


def test_event_failure_after_the_enqueue_is_still_202(
    api: ApiCaller, resources: Resources, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The job is in the queue and will run; a 500 would make the client submit it again.
    svc = service()

    def publish(*_: Any) -> None:
        raise ClientError({"Error": {"Code": "Throttling", "Message": "slow"}}, "Publish")

    monkeypatch.setattr(svc.events, "publish", publish)
    status, job, _ = api("POST", "/v1/jobs", {"model": "echo", "input": {}})
    assert status == 202
    assert [json.loads(b)["job_id"] for b in messages(resources)] == [job["id"]]
    assert JobStore(svc.settings).get(job["id"]) is not None


def test_key_claim_left_undone_still_returns_its_job(
    api: ApiCaller, resources: Resources, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The claim's "done" write failed after the job was accepted: the record shows it finished.
    svc = service()

    def complete(*_: Any) -> bool:
        raise SQS_DOWN

    monkeypatch.setattr(svc.keys, "complete", complete)
    body = {"model": "echo", "input": {"n": 5}}
    s1, j1, _ = api("POST", "/v1/jobs", body, headers={"Idempotency-Key": "k-5"})
    t0 = time.monotonic()
    s2, j2, _ = api("POST", "/v1/jobs", body, headers={"Idempotency-Key": "k-5"})
    assert (s1, s2) == (202, 200) and j1["id"] == j2["id"]
    assert time.monotonic() - t0 < 2  # no wait for a claim that is in fact done
    assert len(messages(resources)) == 1
