"""OpenAI Batches over jobs (spec openai.md, "Batches"): routes, validation, expansion, exact
request counts, finalization layout, cancel and expiry; moto in-process, the expander and the
counter run through their Lambda handlers, line jobs ended as a worker would."""

from __future__ import annotations

import json
import time
from typing import Any

import openai.types as oai
import pytest
from openai.types.chat import ChatCompletion

from asyncinfer.aws import clients
from asyncinfer.core.settings import Settings
from asyncinfer.jobs.store import JobStore
from asyncinfer.local.resources import Resources
from asyncinfer.openai_api.batch_store import BatchStore
from asyncinfer.openai_api.expansion import Expander
from asyncinfer.openai_api.files import FileStore
from asyncinfer.openai_api.validation import MAX_PARAM_CHARS
from tests.conftest import ApiCaller
from tests.unit.batch_helpers import (
    chat_line,
    echo_ok,
    finish,
    line_jobs,
    run_batch_queue,
    run_events,
    upload,
)

TENANT = "tenant-a"


def create(api: ApiCaller, file_id: str, **extra: Any) -> tuple[int, Any]:
    body = {"input_file_id": file_id, "endpoint": "/v1/chat/completions", **extra}
    status, out, _ = api("POST", "/openai/v1/batches", body)
    return status, out


def get(api: ApiCaller, batch_id: str) -> oai.Batch:
    status, out, _ = api("GET", f"/openai/v1/batches/{batch_id}")
    assert status == 200, out
    return oai.Batch.model_validate(out)


def read_file(settings: Settings, file_id: str) -> list[dict[str, Any]]:
    data = FileStore(clients.client("s3", settings), settings.bucket).read(TENANT, file_id)
    return [json.loads(x) for x in data.splitlines()]


def finish_all(settings: Settings, outcome: Any = echo_ok) -> None:
    for rec in line_jobs(settings, TENANT):
        finish(settings, rec, outcome)


# ---------------------------------------------------------------------------- routes
def test_create_get_list_parse_with_the_sdk_types(api: ApiCaller, settings: Settings) -> None:
    fid = upload(settings, TENANT, [chat_line("a"), chat_line("b")])
    status, out = create(api, fid, metadata={"k": "v"}, completion_window="24h")
    assert status == 200, out
    batch = oai.Batch.model_validate(out)
    assert batch.status == "validating" and batch.object == "batch"
    assert batch.metadata == {"k": "v"}
    assert batch.expires_at is not None and batch.expires_at - batch.created_at == 24 * 3600
    _, out2 = create(api, fid)
    status, page, _ = api("GET", "/openai/v1/batches?limit=1")
    assert status == 200
    assert [b["id"] for b in page["data"]] == [out2["id"]] and page["has_more"] is True
    status, page, _ = api("GET", f"/openai/v1/batches?after={out2['id']}")
    assert [b["id"] for b in page["data"]] == [batch.id] and page["has_more"] is False
    for b in page["data"]:
        oai.Batch.model_validate(b)


def test_another_tenant_gets_404_in_openai_error_shape(api: ApiCaller, settings: Settings) -> None:
    fid = upload(settings, TENANT, [chat_line("a")])
    _, out = create(api, fid)
    status, err, _ = api("GET", f"/openai/v1/batches/{out['id']}", key_id="tenant-b")
    assert status == 404
    assert set(err["error"]) == {"message", "type", "param", "code"}
    status, err, _ = api("POST", f"/openai/v1/batches/{out['id']}/cancel", key_id="tenant-b")
    assert status == 404
    # Another tenant's file cannot start a batch either.
    status, err = create(ApiCaller("tenant-b"), fid)
    assert status == 422 and err["error"]["param"] == "input_file_id"


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"completion_window": "0m"}, "completion_window"),
        ({"completion_window": "73h"}, "completion_window"),
        ({"endpoint": "/v1/responses"}, "endpoint"),
        ({"priority": "urgent"}, "priority"),
        ({"webhook": {"url": "http://10.0.0.1/hook"}}, "webhook.url"),
        ({"bogus": 1}, "bogus"),
    ],
)
def test_bad_create_names_the_field(
    api: ApiCaller, settings: Settings, extra: dict[str, Any], param: str
) -> None:
    fid = upload(settings, TENANT, [chat_line("a")])
    status, err = create(api, fid, **extra)
    assert status == 422, err
    assert err["error"]["param"] == param


def test_extension_windows_are_accepted(api: ApiCaller, settings: Settings) -> None:
    fid = upload(settings, TENANT, [chat_line("a")])
    for window, seconds in (("1m", 60), ("90m", 5400), ("72h", 259200)):
        status, out = create(api, fid, completion_window=window)
        assert status == 200
        assert out["expires_at"] - out["created_at"] == seconds


# ---------------------------------------------------------------------------- validation
def test_bad_lines_fail_the_batch_with_line_numbers(api: ApiCaller, settings: Settings) -> None:
    lines: list[Any] = [
        chat_line("ok"),
        "{not json",
        chat_line("ok"),  # duplicate custom_id
        {**chat_line("m"), "method": "GET"},
        {**chat_line("u"), "url": "/v1/embeddings"},
        chat_line("x", model="no-such-model"),
        chat_line("e", model="all-minilm-l6-v2"),  # an embeddings model cannot chat
        chat_line("t", model="smollm2-135m-instruct", max_tokens=5000),
        chat_line("n", model="smollm2-135m-instruct", n=2),
    ]
    fid = upload(settings, TENANT, lines)
    _, out = create(api, fid)
    run_batch_queue(settings)
    batch = get(api, out["id"])
    assert batch.status == "failed" and batch.failed_at is not None
    assert batch.errors is not None and batch.errors.data is not None
    by_line = {e.line: e for e in batch.errors.data}
    assert sorted(by_line) == [2, 3, 4, 5, 6, 7, 8, 9]
    assert by_line[3].code == "duplicate"
    assert by_line[4].param == "method"
    assert by_line[5].param == "url"
    assert by_line[6].param == "body.model"
    assert by_line[7].param == "body.model"
    assert by_line[8].param == "body.max_tokens"
    assert by_line[9].param == "body.n"
    assert line_jobs(settings, TENANT) == []  # nothing ran


# ---------------------------------------------------------------------------- expansion
def test_expansion_in_chunks_makes_one_job_per_line(
    api: ApiCaller, settings: Settings, resources: Resources, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ASYNCINFER_BATCH_CHUNK", "7")
    from tests.conftest import reset_caches

    reset_caches()
    settings = Settings.from_env()
    fid = upload(settings, TENANT, [chat_line(f"c{i}") for i in range(30)])
    _, out = create(api, fid, priority="low", metadata={"run": "1"})
    run_batch_queue(settings)
    jobs = line_jobs(settings, TENANT)
    assert len(jobs) == 30
    meta = [json.loads(j["metadata"]) for j in jobs]
    assert {m["custom_id"] for m in meta} == {f"c{i}" for i in range(30)}
    assert {m["batch_id"] for m in meta} == {out["id"]}
    assert {j["priority"] for j in jobs} == {"low"}
    record = BatchStore(settings).get(out["id"])
    assert record is not None
    assert record["next_line"] == 30 and record["expanded"] and record["total"] == 30
    lines = list(BatchStore(settings).lines(out["id"]))
    assert len(lines) == 30 and {ln["ttl"] for ln in lines} == {record["ttl"]}  # DynamoDB TTL
    # A re-run of every chunk (a duplicate message, a crash) makes no new job.
    BatchStore(settings).update(out["id"], {"next_line": 0, "expanded": None})
    time.sleep(1.1)  # a later second: the jobs' bodies must not depend on when they are made
    expander = Expander(settings)
    expander.expand(BatchStore(settings).get(out["id"]) or {}, time.monotonic() + 60)
    assert len(line_jobs(settings, TENANT)) == 30
    assert get(api, out["id"]).request_counts.total == 30  # type: ignore[union-attr]


# ---------------------------------------------------------------------------- counts and output
def test_counts_exact_and_a_retried_event_never_double_counts(
    api: ApiCaller, settings: Settings
) -> None:
    fid = upload(settings, TENANT, [chat_line(f"c{i}") for i in range(4)])
    _, out = create(api, fid)
    run_batch_queue(settings)
    jobs = line_jobs(settings, TENANT)
    finish(settings, jobs[0], echo_ok)
    # The same terminal event delivered three times (SNS at-least-once, a retried Lambda).
    sqs = clients.client("sqs", settings)
    run_events(settings)
    ended = JobStore(settings).get(jobs[0]["job_id"])
    assert ended is not None
    from asyncinfer.jobs.events import EventPublisher

    for _ in range(2):
        EventPublisher(settings).publish(ended)
    run_events(settings)
    counts = get(api, out["id"]).request_counts
    assert counts is not None and (counts.completed, counts.failed) == (1, 0)
    # A job of the same tenant that claims the batch in its metadata counts nothing.
    forged = {**ended, "job_id": "job_01ARZ3NDEKTSV4RRFFQ69G5FAV"}
    EventPublisher(settings).publish(forged)
    run_events(settings)
    counts = get(api, out["id"]).request_counts
    assert counts is not None and (counts.completed, counts.failed) == (1, 0)
    assert sqs is not None


def test_finalization_layout_chat_with_a_failed_line(api: ApiCaller, settings: Settings) -> None:
    fid = upload(settings, TENANT, [chat_line(f"c{i}") for i in range(3)])
    _, out = create(api, fid)
    run_batch_queue(settings)

    def outcome(rec: dict[str, Any]) -> tuple[str, Any]:
        if json.loads(rec["metadata"])["custom_id"] == "c1":
            return "failed", {"code": "model_error", "message": "boom"}
        return echo_ok(rec)

    finish_all(settings, outcome)
    run_events(settings)
    batch = get(api, out["id"])
    assert batch.status == "completed", batch
    assert batch.request_counts is not None
    assert (batch.request_counts.total, batch.request_counts.completed) == (3, 2)
    assert batch.request_counts.failed == 1
    assert batch.output_file_id and batch.error_file_id and batch.completed_at
    outputs = read_file(settings, batch.output_file_id)
    assert sorted(o["custom_id"] for o in outputs) == ["c0", "c2"]
    for o in outputs:
        assert o["error"] is None and o["response"]["status_code"] == 200
        completion = ChatCompletion.model_validate(o["response"]["body"])
        assert completion.object == "chat.completion"
        assert completion.choices[0].message.content == "ok"
        assert completion.usage is not None and completion.usage.total_tokens == 5
    errors = read_file(settings, batch.error_file_id)
    assert errors == [
        {
            "id": errors[0]["id"],
            "custom_id": "c1",
            "response": None,
            "error": {"code": "model_error", "message": "boom"},
        }
    ]
    meta = FileStore(clients.client("s3", settings), settings.bucket).get(
        TENANT, batch.output_file_id
    )
    assert meta["purpose"] == "batch_output"


def test_embeddings_and_completions_layouts(api: ApiCaller, settings: Settings) -> None:
    from openai.types import Completion, CreateEmbeddingResponse

    from asyncinfer.openai_api.layout import response_body

    emb = response_body(
        "/v1/embeddings", "job_X", "all-minilm-l6-v2", 1, {"embeddings": [[0.1, 0.2]], "dim": 2}
    )
    parsed = CreateEmbeddingResponse.model_validate(emb)
    assert parsed.object == "list" and parsed.data[0].embedding == [0.1, 0.2]
    comp = response_body(
        "/v1/completions",
        "job_X",
        "smollm2-135m-instruct",
        1,
        {"text": "hi", "finish_reason": "length"},
    )
    parsed_c = Completion.model_validate(comp)
    assert parsed_c.object == "text_completion" and parsed_c.choices[0].text == "hi"
    assert parsed_c.choices[0].finish_reason == "length"


# ---------------------------------------------------------------------------- cancel and expiry
def test_cancel_mid_batch_keeps_finished_lines(api: ApiCaller, settings: Settings) -> None:
    fid = upload(settings, TENANT, [chat_line(f"c{i}") for i in range(4)])
    _, out = create(api, fid)
    run_batch_queue(settings)
    jobs = line_jobs(settings, TENANT)
    finish(settings, jobs[0], echo_ok)
    run_events(settings)
    status, body, _ = api("POST", f"/openai/v1/batches/{out['id']}/cancel")
    assert status == 200 and body["status"] == "cancelling"
    status, again, _ = api("POST", f"/openai/v1/batches/{out['id']}/cancel")
    assert status == 200 and again["status"] in ("cancelling", "cancelled")  # idempotent
    run_batch_queue(settings)
    run_events(settings)
    batch = get(api, out["id"])
    assert batch.status == "cancelled" and batch.cancelled_at and batch.cancelling_at
    assert batch.request_counts is not None
    assert (batch.request_counts.completed, batch.request_counts.failed) == (1, 3)
    assert {j["status"] for j in line_jobs(settings, TENANT)} == {"succeeded", "cancelled"}
    assert batch.output_file_id and batch.error_file_id
    assert len(read_file(settings, batch.output_file_id)) == 1
    errs = read_file(settings, batch.error_file_id)
    assert {e["error"]["code"] for e in errs} == {"batch_cancelled"}
    status, again, _ = api("POST", f"/openai/v1/batches/{out['id']}/cancel")
    assert status == 200 and again["status"] == "cancelled"


def test_cancel_of_a_completed_batch_is_409(api: ApiCaller, settings: Settings) -> None:
    fid = upload(settings, TENANT, [chat_line("a")])
    _, out = create(api, fid)
    run_batch_queue(settings)
    finish_all(settings)
    run_events(settings)
    assert get(api, out["id"]).status == "completed"
    status, err, _ = api("POST", f"/openai/v1/batches/{out['id']}/cancel")
    assert status == 409 and err["error"]["type"] == "invalid_request_error"


def test_past_the_window_the_batch_expires_with_what_finished(
    api: ApiCaller, settings: Settings
) -> None:
    fid = upload(settings, TENANT, [chat_line(f"c{i}") for i in range(3)])
    _, out = create(api, fid, completion_window="1m")
    run_batch_queue(settings)
    jobs = line_jobs(settings, TENANT)
    finish(settings, jobs[0], echo_ok)
    run_events(settings)
    store = BatchStore(settings)
    store.update(out["id"], {"expires_at": int(time.time()) - 1})  # the window is over
    Expander(settings).check(store.get(out["id"]) or {})
    run_events(settings)
    batch = get(api, out["id"])
    assert batch.status == "expired" and batch.expired_at
    assert batch.request_counts is not None
    assert (batch.request_counts.completed, batch.request_counts.failed) == (1, 2)
    assert batch.output_file_id and len(read_file(settings, batch.output_file_id)) == 1
    assert batch.error_file_id
    assert {e["error"]["code"] for e in read_file(settings, batch.error_file_id)} == {
        "batch_expired"
    }


def test_a_batch_ended_before_expansion_lists_unrun_lines(
    api: ApiCaller, settings: Settings
) -> None:
    fid = upload(settings, TENANT, [chat_line(f"c{i}") for i in range(3)])
    _, out = create(api, fid)
    expander = Expander(settings)
    store = BatchStore(settings)
    validated = expander.validate(store.get(out["id"]) or {})
    assert validated is not None and validated["status"] == "in_progress"
    api("POST", f"/openai/v1/batches/{out['id']}/cancel")
    run_batch_queue(settings)
    batch = get(api, out["id"])
    assert batch.status == "cancelled"
    assert line_jobs(settings, TENANT) == []
    assert batch.error_file_id
    errs = read_file(settings, batch.error_file_id)
    assert sorted(e["custom_id"] for e in errs) == ["c0", "c1", "c2"]
    assert batch.request_counts is not None and batch.request_counts.failed == 3


def test_an_end_out_of_time_hands_the_rest_to_another_invocation(
    api: ApiCaller, settings: Settings
) -> None:
    fid = upload(settings, TENANT, [chat_line(f"c{i}") for i in range(3)])
    _, out = create(api, fid)
    run_batch_queue(settings)
    api("POST", f"/openai/v1/batches/{out['id']}/cancel")
    sqs = clients.client("sqs", settings)
    sqs.purge_queue(QueueUrl=settings.batch_queue_url)  # the cancel's own "end" (and checks)
    Expander(settings).handle({"op": "end", "batch_id": out["id"]}, time.monotonic() - 1)
    assert {j["status"] for j in line_jobs(settings, TENANT)} == {"queued"}  # nothing yet
    assert run_batch_queue(settings) >= 1  # the handed-on "end" cancels them
    run_events(settings)
    assert {j["status"] for j in line_jobs(settings, TENANT)} == {"cancelled"}
    assert get(api, out["id"]).status == "cancelled"


@pytest.mark.parametrize(
    "raw", [b"{", b'{"input_file_id": ' + b"[" * 50_000 + b"]" * 50_000 + b"}"]
)
def test_a_body_that_is_not_json_is_400_in_openai_shape(api: ApiCaller, raw: bytes) -> None:
    status, err, _ = api("POST", "/openai/v1/batches", raw=raw)
    assert status == 400, err
    assert err["error"]["code"] == "invalid_json"


def test_errors_of_long_bad_lines_fit_the_batch_record(api: ApiCaller, settings: Settings) -> None:
    # Error messages quote the line's values (custom_id, field names, model): 1,001 duplicates of
    # a 512-character custom_id, or one field name of 500 KB, made errors larger than a DynamoDB
    # item (400 KB): the write to `failed` was refused and the batch never ended with its reasons.
    cid = "x" * 512
    huge_key = {**chat_line("k"), "k" * 500_000: 1}
    for lines in ([chat_line(cid)] * 1001, [chat_line("a"), huge_key]):
        fid = upload(settings, TENANT, lines)
        _, out = create(api, fid)
        run_batch_queue(settings)
        batch = get(api, out["id"])
        assert batch.status == "failed", batch.status
        assert batch.errors is not None and batch.errors.data
        assert batch.errors.data[0].line == 2
        assert batch.errors.data[0].param in ("custom_id", "k" * (MAX_PARAM_CHARS - 3) + "...")


def test_ids_past_dynamodb_key_sizes_are_404_and_422_never_500(
    api: ApiCaller, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """DynamoDB refuses a partition key over 2048 bytes and a sort key condition over 1024
    (ValidationException; moto does not check): an id of any length from the URL must not reach
    it. A batch id that is no batch id is 404; an ``after`` that is none is 422 naming it."""
    from botocore.exceptions import ClientError

    def too_big(op: str) -> ClientError:
        err = {"Code": "ValidationException", "Message": "key size exceeded"}
        return ClientError({"Error": err}, op)

    real_get, real_list = BatchStore.get, BatchStore.list

    def get(self: BatchStore, batch_id: str) -> Any:
        if len(batch_id.encode()) > 2048:
            raise too_big("GetItem")
        return real_get(self, batch_id)

    def listing(self: BatchStore, tenant: str, *, limit: int, after: str | None) -> Any:
        if after is not None and len(after.encode()) > 1024:
            raise too_big("Query")
        return real_list(self, tenant, limit=limit, after=after)

    monkeypatch.setattr(BatchStore, "get", get)
    monkeypatch.setattr(BatchStore, "list", listing)
    long_id = "batch_" + "Z" * 3000
    status, err, _ = api("GET", f"/openai/v1/batches/{long_id}")
    assert status == 404, err
    status, err, _ = api("POST", f"/openai/v1/batches/{long_id}/cancel")
    assert status == 404, err
    for after in ("batch_" + "Z" * 2000, "nope"):
        status, err, _ = api("GET", f"/openai/v1/batches?after={after}")
        assert status == 422, err
        assert err["error"]["param"] == "after"
    fid = upload(settings, TENANT, [chat_line("a")])
    _, out = create(api, fid)
    status, page, _ = api("GET", f"/openai/v1/batches?after={out['id']}")
    assert status == 200 and page["data"] == []
