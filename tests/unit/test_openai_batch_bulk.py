"""The bulk expansion of batch lines (issue 15: a few requests per chunk, not 9 per line):
requests per line, derived job ids, a chunk run again after a crash at each step, a partial
SendMessageBatch failure, a transaction refused because a record exists, the confirm that a
worker's start refuses, lines begun by earlier versions, a line left unsent outlasting the wait
for its re-run, a transaction whose answer was lost read back with lagging reads; moto
in-process."""

from __future__ import annotations

import json
import time
from collections import Counter
from typing import Any

import pytest
from botocore.exceptions import ClientError

from asyncinfer.aws import clients
from asyncinfer.core.errors import InternalError
from asyncinfer.core.ids import derived_job_id, is_job_id
from asyncinfer.core.settings import Settings
from asyncinfer.core.timeutil import parse
from asyncinfer.core.topology import QUEUES
from asyncinfer.jobs.bulk import BulkSubmitter
from asyncinfer.jobs.record import OUTBOX_FIELD, OUTBOX_MARK, OUTBOX_MARK_FIELD
from asyncinfer.jobs.store import JobStore
from asyncinfer.local.emulator import patch_dynamodb
from asyncinfer.openai_api.batch_store import BatchStore, line_key
from asyncinfer.openai_api.chunks import read_chunk
from asyncinfer.openai_api.expansion import Expander, line_job_id
from tests.conftest import ApiCaller
from tests.unit.batch_helpers import chat_line, echo_ok, finish, line_jobs, run_events, upload

TENANT = "tenant-a"


@pytest.fixture(autouse=True)
def _emulator_lock() -> None:
    """The emulator's DynamoDB lock (moto, in process too, has none): a chunk's groups run
    side by side, and moto's transactions copy the table while other threads write."""
    assert patch_dynamodb()


def _create(api: ApiCaller, settings: Settings, n: int) -> str:
    fid = upload(settings, TENANT, [chat_line(f"c{i}") for i in range(n)])
    status, out, _ = api(
        "POST", "/openai/v1/batches", {"input_file_id": fid, "endpoint": "/v1/chat/completions"}
    )
    assert status == 200, out
    return str(out["id"])


def _expand(settings: Settings, batch_id: str) -> None:
    """One expand operation of the batch, as the batch queue's message runs it."""
    Expander(settings).handle({"op": "expand", "batch_id": batch_id}, time.monotonic() + 60)


def _messages(settings: Settings) -> list[dict[str, Any]]:
    """Every message body in the echo model's ``low`` queue (taken off it)."""
    sqs = clients.client("sqs", settings)
    url = settings.queue_url("echo", "low")
    out: list[dict[str, Any]] = []
    while True:
        resp = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=0)
        msgs = resp.get("Messages", [])
        if not msgs:
            return out
        for m in msgs:
            out.append(json.loads(m["Body"]))
            sqs.delete_message(QueueUrl=url, ReceiptHandle=m["ReceiptHandle"])


def _finish_all_and_count(settings: Settings, batch_id: str, n: int) -> None:
    for rec in line_jobs(settings, TENANT):
        finish(settings, rec, echo_ok)
    run_events(settings)
    batch = BatchStore(settings).get(batch_id)
    assert batch is not None and batch["status"] == "completed", batch
    assert (batch["completed"], batch["failed"]) == (n, 0)


def test_derived_job_ids_are_job_ids_and_stable() -> None:
    a = derived_job_id("batch_X\nc1", 1_700_000_000_000)
    assert is_job_id(a) and a == derived_job_id("batch_X\nc1", 1_700_000_000_000)
    assert a != derived_job_id("batch_X\nc2", 1_700_000_000_000)
    assert a[4:14] == derived_job_id("other", 1_700_000_000_000)[4:14]  # the ULID time part
    with pytest.raises(ValueError):
        derived_job_id("x", -1)


def test_a_500_line_chunk_costs_well_under_one_request_per_line(
    api: ApiCaller, settings: Settings
) -> None:
    from bench.aws_counter import AwsRequestCounter

    batch_id = _create(api, settings, 500)
    counter = AwsRequestCounter()
    counter.install()
    try:
        _expand(settings, batch_id)
        counts = counter.snapshot()
    finally:
        counter.uninstall()
        clients.reset()
    total = sum(counts.values())
    assert total / 500 < 0.5, counts  # 9 a line before
    for one_per_line in ("SendMessage", "PutItem", "Publish"):
        assert counts[one_per_line] < 10, counts
    assert counts["TransactWriteItems"] <= 10, counts  # moto copies the table per transaction
    jobs = line_jobs(settings, TENANT)
    assert len(jobs) == 500
    assert all(is_job_id(j["job_id"]) and "submitting_until" not in j for j in jobs)
    assert not any(j.get(OUTBOX_FIELD) or j.get(OUTBOX_MARK_FIELD) for j in jobs)
    record = BatchStore(settings).get(batch_id)
    assert record is not None
    assert {j["job_id"] for j in jobs} == {line_job_id(record, f"c{i}") for i in range(500)}
    # The job shows what a line's job showed: its batch and custom id in metadata.
    assert {json.loads(j["metadata"])["batch_id"] for j in jobs} == {batch_id}
    msgs = _messages(settings)
    assert sorted(m["job_id"] for m in msgs) == sorted(j["job_id"] for j in jobs)
    assert all(m["input"] and m["created_at"] for m in msgs)


CRASHES = {
    # where the first run dies: (what is patched, its attribute)
    "after line items": (JobStore, "create_many"),
    "after records": (BulkSubmitter, "_publish"),
    "after events": (BulkSubmitter, "_send"),
    "after messages": (JobStore, "confirm_many"),
}


@pytest.mark.parametrize("where", list(CRASHES))
def test_a_chunk_run_again_after_a_crash_makes_no_duplicate_and_loses_no_line(
    api: ApiCaller, settings: Settings, monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    n = 12
    batch_id = _create(api, settings, n)
    target, name = CRASHES[where]
    original = getattr(target, name)

    def crash(self: Any, *a: Any, **kw: Any) -> Any:
        raise RuntimeError(f"crash {where}")

    monkeypatch.setattr(target, name, crash)
    with pytest.raises(RuntimeError):  # the handler reports it failed; the message comes back
        _expand(settings, batch_id)
    store = BatchStore(settings)
    assert int((store.get(batch_id) or {}).get("next_line", 0)) == 0
    first = _messages(settings)
    lines = list(store.lines(batch_id))
    assert len(lines) == n and all(ln.get("line_job") for ln in lines)
    monkeypatch.setattr(target, name, original)
    if where == "after messages":
        # A worker ends one job before the chunk runs again: it counts once, and stays done.
        done = JobStore(settings).get(first[0]["job_id"])
        assert done is not None
        finish(settings, done, echo_ok)
        run_events(settings)
    _expand(settings, batch_id)
    jobs = line_jobs(settings, TENANT)
    assert len(jobs) == n
    cids = Counter(json.loads(j["metadata"])["custom_id"] for j in jobs)
    assert set(cids) == {f"c{i}" for i in range(n)} and set(cids.values()) == {1}
    again = _messages(settings)
    sent = Counter(m["job_id"] for m in first + again)
    assert set(sent) == {j["job_id"] for j in jobs}  # every job has its message
    if where != "after messages":
        assert set(sent.values()) == {1}  # nothing was out: no message twice
    # Every queued job is confirmed (its TTL end, not the submit lease) and its event out.
    for j in jobs:
        if j["status"] != "queued":
            continue
        assert "submitting_until" not in j
        assert j["expires_epoch"] == int(parse(j["expires_at"]).timestamp())
        assert not j.get(OUTBOX_FIELD), j
    # A second message of a job never runs it twice: the start is conditional on the status.
    runs: Counter[str] = Counter()
    for m in first + again:
        rec = JobStore(settings).get(m["job_id"])
        if rec is not None and finish(settings, rec, echo_ok) is not None:
            runs[m["job_id"]] += 1
    assert set(runs.values()) <= {1}
    run_events(settings)
    batch = store.get(batch_id)
    assert batch is not None and batch["status"] == "completed", batch
    assert (batch["completed"], batch["failed"]) == (n, 0)


def test_a_partial_sendmessagebatch_failure_is_sent_again(
    api: ApiCaller, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    n = 25
    batch_id = _create(api, settings, n)
    expander = Expander(settings)
    sqs = expander.lines.bulk.sqs
    real = sqs.send_message_batch
    refuse: dict[str, int] = {"c3": 1, "c17": 99}  # custom id -> times SQS fails its entry

    def flaky(QueueUrl: str, Entries: list[dict[str, Any]]) -> dict[str, Any]:
        keep, failed = [], []
        for e in Entries:
            cid = json.loads(json.loads(e["MessageBody"])["metadata"])["custom_id"]
            if refuse.get(cid, 0) > 0:
                refuse[cid] -= 1
                failed.append({"Id": e["Id"], "SenderFault": False, "Code": "InternalError"})
            else:
                keep.append(e)
        resp = real(QueueUrl=QueueUrl, Entries=keep) if keep else {"Successful": []}
        return {**resp, "Failed": failed}

    monkeypatch.setattr(sqs, "send_message_batch", flaky)
    with pytest.raises(InternalError):  # c17: the chunk is run again
        expander.handle({"op": "expand", "batch_id": batch_id}, time.monotonic() + 60)
    store = BatchStore(settings)
    assert int((store.get(batch_id) or {}).get("next_line", 0)) == 0  # c17 never went out
    first = _messages(settings)
    assert len(first) == n - 1 and len({m["job_id"] for m in first}) == n - 1  # c3 the 2nd time
    unconfirmed = [j for j in line_jobs(settings, TENANT) if "submitting_until" in j]
    assert [json.loads(j["metadata"])["custom_id"] for j in unconfirmed] == ["c17"]
    refuse.clear()
    expander.handle({"op": "expand", "batch_id": batch_id}, time.monotonic() + 60)
    again = _messages(settings)
    assert [json.loads(m["metadata"])["custom_id"] for m in again] == ["c17"]
    assert int((store.get(batch_id) or {}).get("next_line", 0)) == n
    _finish_all_and_count(settings, batch_id, n)


def test_a_line_left_unsent_outlasts_the_wait_for_its_chunk_to_run_again(
    api: ApiCaller, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    n = 3
    batch_id = _create(api, settings, n)
    expander = Expander(settings)
    sqs = expander.lines.bulk.sqs
    real = sqs.send_message_batch

    def down(QueueUrl: str, Entries: list[dict[str, Any]]) -> dict[str, Any]:
        raise ClientError({"Error": {"Code": "ServiceUnavailable", "Message": "down"}}, "Send")

    monkeypatch.setattr(sqs, "send_message_batch", down)
    with pytest.raises(InternalError):  # the handler reports it failed; the message comes back
        expander.handle({"op": "expand", "batch_id": batch_id}, time.monotonic() + 60)
    jobs = line_jobs(settings, TENANT)
    assert len(jobs) == n and not _messages(settings)
    # The chunk runs again when its batch queue message comes back (the queue's visibility
    # timeout); the expiry sweeper must not have ended its jobs by then.
    back = int(time.time()) + int(QUEUES["batches"].visibility_timeout_seconds or 0)
    due = set(JobStore(settings).queued_past_expiry(back))
    assert not due & {j["job_id"] for j in jobs}
    monkeypatch.setattr(sqs, "send_message_batch", real)
    expander.handle({"op": "expand", "batch_id": batch_id}, time.monotonic() + 60)
    assert sorted(m["job_id"] for m in _messages(settings)) == sorted(j["job_id"] for j in jobs)
    _finish_all_and_count(settings, batch_id, n)


def test_records_whose_transaction_answer_was_lost_get_their_messages(
    api: ApiCaller, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    n = 4
    batch_id = _create(api, settings, n)
    expander = Expander(settings)
    ddb = expander.jobs.store.ddb
    transact, batch_get = ddb.transact_write_items, ddb.batch_get_item
    written: set[str] = set()

    def committed_then_lost(**kw: Any) -> Any:  # the first call commits, its answer is lost
        monkeypatch.setattr(ddb, "transact_write_items", transact)
        transact(**kw)
        written.update(a["Put"]["Item"]["job_id"]["S"] for a in kw["TransactItems"] if "Put" in a)
        raise ClientError({"Error": {"Code": "InternalServerError", "Message": "lost"}}, "Tx")

    def lagging(RequestItems: dict[str, Any], **kw: Any) -> Any:
        # An eventually consistent read does not see the records written just before yet.
        resp = batch_get(RequestItems=RequestItems, **kw)
        for table, req in RequestItems.items():
            if not req.get("ConsistentRead"):
                resp["Responses"][table] = [
                    i for i in resp["Responses"].get(table, []) if i["job_id"]["S"] not in written
                ]
        return resp

    monkeypatch.setattr(ddb, "transact_write_items", committed_then_lost)
    monkeypatch.setattr(ddb, "batch_get_item", lagging)
    expander.handle({"op": "expand", "batch_id": batch_id}, time.monotonic() + 60)
    monkeypatch.setattr(ddb, "batch_get_item", batch_get)
    jobs = line_jobs(settings, TENANT)
    assert len(jobs) == n and written == {j["job_id"] for j in jobs}
    assert sorted(m["job_id"] for m in _messages(settings)) == sorted(j["job_id"] for j in jobs)
    assert not any("submitting_until" in j for j in line_jobs(settings, TENANT))
    _finish_all_and_count(settings, batch_id, n)


def test_a_transaction_refused_because_one_record_exists_puts_the_others(
    settings: Settings,
) -> None:
    store = JobStore(settings)
    names: list[str] = []
    store.ddb.meta.events.register("after-call", lambda model, **_: names.append(model.name))
    recs = [
        {"job_id": derived_job_id(f"s{i}", 1000), "tenant": TENANT, "status": "queued"}
        for i in range(3)
    ]
    store.create({**recs[1], "status": "running"})
    names.clear()
    assert store.create_many(recs) == {recs[1]["job_id"]}
    # The cancelled transaction names the existing record; the others go again together.
    assert names == ["TransactWriteItems", "TransactWriteItems"]
    got = store.get_many([r["job_id"] for r in recs])
    assert [got[r["job_id"]]["status"] for r in recs] == ["queued", "running", "queued"]


def test_a_record_made_between_the_read_and_the_write_is_not_made_twice(
    api: ApiCaller, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    n = 5
    batch_id = _create(api, settings, n)
    # Another run (a duplicate message) makes every record after this run's read.
    send = BulkSubmitter._send

    def died(self: Any, jobs: Any) -> Any:
        raise OSError("died")

    monkeypatch.setattr(BulkSubmitter, "_send", died)
    with pytest.raises(OSError):
        _expand(settings, batch_id)
    monkeypatch.setattr(BulkSubmitter, "_send", send)
    real = JobStore.get_many
    reads: list[int] = []

    def blind_first(self: Any, ids: Any, attributes: Any = (), **kw: Any) -> Any:
        reads.append(1)
        return {} if len(reads) == 1 else real(self, ids, attributes, **kw)

    monkeypatch.setattr(JobStore, "get_many", blind_first)
    _expand(settings, batch_id)
    monkeypatch.setattr(JobStore, "get_many", real)
    jobs = line_jobs(settings, TENANT)
    assert len(jobs) == n and not any("submitting_until" in j for j in jobs)
    assert len(_messages(settings)) == n  # the raced records' messages, once each
    _finish_all_and_count(settings, batch_id, n)


def test_a_confirm_refused_by_a_worker_start_keeps_its_started_event(settings: Settings) -> None:
    store = JobStore(settings)
    ids = [derived_job_id(f"k{i}", 1000) for i in range(2)]
    for j in ids:
        store.create(
            {
                "job_id": j,
                "tenant": TENANT,
                "status": "queued",
                "submitting_until": 1,
                OUTBOX_FIELD: {"job.queued#0"},
                OUTBOX_MARK_FIELD: OUTBOX_MARK,
                "outbox_since": 1,
            }
        )
    store.ddb.update_item(  # a worker started ids[1] and wrote its job.started key
        TableName=store.table,
        Key={"job_id": {"S": ids[1]}},
        UpdateExpression="ADD #ob :k",
        ExpressionAttributeNames={"#ob": OUTBOX_FIELD},
        ExpressionAttributeValues={":k": {"SS": ["job.started#1"]}},
    )
    store.confirm_many([(j, 5000, "job.queued#0") for j in ids])
    a, b = (store.get(j) or {} for j in ids)
    assert a["expires_epoch"] == 5000 and "submitting_until" not in a
    assert not a.get(OUTBOX_FIELD) and not a.get(OUTBOX_MARK_FIELD)
    assert b["expires_epoch"] == 5000 and "submitting_until" not in b
    assert set(b[OUTBOX_FIELD]) == {"job.started#1"}


def test_lines_begun_by_an_earlier_version_keep_their_jobs(
    api: ApiCaller, settings: Settings
) -> None:
    batch_id = _create(api, settings, 4)
    expander = Expander(settings)
    store = BatchStore(settings)
    record = expander.validate(store.get(batch_id) or {})
    assert record is not None
    # Earlier versions: c0 submitted with its idempotency key and noted; c1's item written,
    # then the expander died before its submit (or its note).
    ttl = max(10, int(record["expires_at"]) - int(record["created_at"]))
    store.put_lines(batch_id, [("c0", 0, 1), ("c1", 1, 2)], ttl=int(record["ttl"]))
    entry = read_chunk(settings, record, 0)[0]
    assert entry[1] == "c0"
    old_job = expander.lines.submit_line(record, "low", ttl, entry)
    assert isinstance(old_job, str) and old_job != line_job_id(record, "c0")
    expander.expand(record, time.monotonic() + 60)
    jobs = line_jobs(settings, TENANT)
    assert len(jobs) == 4
    by_cid = {json.loads(j["metadata"])["custom_id"]: j["job_id"] for j in jobs}
    assert by_cid["c0"] == old_job
    assert by_cid["c2"] == line_job_id(record, "c2")
    items = {ln["job_id"]: ln for ln in store.lines(batch_id)}
    assert {c: items[line_key(batch_id, c)]["line_job"] for c in by_cid} == by_cid
    _finish_all_and_count(settings, batch_id, 4)


def test_a_line_refused_after_a_crash_left_its_item_is_counted_failed(
    api: ApiCaller, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    from asyncinfer.core.errors import InvalidRequest
    from asyncinfer.jobs.service import JobService

    batch_id = _create(api, settings, 3)
    create_many = JobStore.create_many

    def died(self: Any, records: Any) -> Any:
        raise RuntimeError("died after the line items")

    monkeypatch.setattr(JobStore, "create_many", died)
    with pytest.raises(RuntimeError):
        _expand(settings, batch_id)
    monkeypatch.setattr(JobStore, "create_many", create_many)
    prepare = JobService.prepare

    def undeployed(self: Any, tenant: str, req: Any, job_id: Any = None) -> Any:
        if req.metadata["custom_id"] == "c1":  # the model went away meanwhile
            raise InvalidRequest("model 'echo' is not deployed here", [{"field": "model"}])
        return prepare(self, tenant, req, job_id)

    monkeypatch.setattr(JobService, "prepare", undeployed)
    _expand(settings, batch_id)
    monkeypatch.setattr(JobService, "prepare", prepare)
    jobs = line_jobs(settings, TENANT)
    assert sorted(json.loads(j["metadata"])["custom_id"] for j in jobs) == ["c0", "c2"]
    for rec in jobs:
        finish(settings, rec, echo_ok)
    run_events(settings)
    batch = BatchStore(settings).get(batch_id)
    assert batch is not None and batch["status"] == "completed", batch
    assert (batch["completed"], batch["failed"]) == (2, 1)
