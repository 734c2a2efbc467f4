"""Exact batch line counts without transactions (:mod:`asyncinfer.openai_api.batch_counts`):
one conditional write per chunk, duplicates in one invocation and across invocations count once,
a forged or foreign event counts nothing; moto in-process."""

from __future__ import annotations

import json
import time
from typing import Any

from asyncinfer.aws import clients
from asyncinfer.core.settings import Settings
from asyncinfer.jobs.events import event_for
from asyncinfer.openai_api import finalize
from asyncinfer.openai_api.batch_counts import LineCounts
from asyncinfer.openai_api.batch_store import BatchStore
from asyncinfer.openai_api.line_jobs import LineJobs
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


def _batch(api: ApiCaller, settings: Settings, n: int) -> str:
    fid = upload(settings, TENANT, [chat_line(f"c{i}") for i in range(n)])
    _, out, _ = api(
        "POST", "/openai/v1/batches", {"input_file_id": fid, "endpoint": "/v1/chat/completions"}
    )
    run_batch_queue(settings)
    return str(out["id"])


def _calls(settings: Settings) -> list[str]:
    names: list[str] = []
    ddb = clients.client("dynamodb", settings)
    ddb.meta.events.register("after-call", lambda model, **_: names.append(model.name))
    return names


def test_line_counts_add_once_and_fall_back_per_line(settings: Settings) -> None:
    counts = LineCounts(clients.client("dynamodb", settings), settings.table_name)
    record: dict[str, Any] = {"job_id": "batch_X", "chunk_lines": 3, "total": 7, "ttl": 1}
    assert counts.add(record, [(0, True), (1, False), (1, False), (5, True)]) == 3
    assert counts.totals(record) == (2, 1)
    # 1 and 5 were counted: the chunk writes fail as a whole, then each line alone.
    assert counts.add(record, [(1, True), (2, True), (5, False), (6, False)]) == 2
    assert counts.totals(record) == (3, 2)
    assert counts.counted(record) == {0, 1, 2, 5, 6}


def test_one_invocation_counts_its_events_together_without_transactions(
    api: ApiCaller, settings: Settings
) -> None:
    batch_id = _batch(api, settings, 4)
    ended = [finish(settings, rec, echo_ok) for rec in line_jobs(settings, TENANT)]
    # The events of the four jobs, one of them three times (SNS at least once), and one of a
    # job that claims the batch in its metadata without being its line's job.
    events = [event_for(r) for r in ended if r is not None]
    forged = event_for({**ended[0], "job_id": "job_01ARZ3NDEKTSV4RRFFQ69G5FAV"})  # type: ignore[dict-item]
    batch = [events[0], events[0], *events, forged, events[0]]
    calls = _calls(settings)
    records = [
        {"messageId": str(n), "body": json.dumps(e), "messageAttributes": {}}
        for n, e in enumerate(batch)
    ]
    assert finalize.handler({"Records": records}, None) == {"batchItemFailures": []}
    assert "TransactWriteItems" not in calls
    record = BatchStore(settings).get(batch_id)
    assert record is not None and record["status"] == "completed"
    assert (record["completed"], record["failed"]) == (4, 0)
    # The same events again (a retried invocation) count nothing and change nothing.
    assert finalize.count_events(settings, [(e, TENANT) for e in events]) == 0


def test_another_tenants_event_counts_nothing(api: ApiCaller, settings: Settings) -> None:
    batch_id = _batch(api, settings, 2)
    rec = line_jobs(settings, TENANT)[0]
    ended = finish(settings, rec, echo_ok)
    assert ended is not None
    assert finalize.count_events(settings, [(event_for(ended), "tenant-b")]) == 0
    assert finalize.count_events(settings, [(event_for(ended), TENANT)]) == 1
    record = BatchStore(settings).get(batch_id)
    assert record is not None and (record["completed"], record["failed"]) == (1, 0)


def test_a_chunk_slower_than_the_reserve_leaves_its_late_lines_to_the_next_invocation(
    api: ApiCaller, resources: Any, monkeypatch: Any
) -> None:
    from asyncinfer.openai_api import expansion
    from tests.conftest import reset_caches

    monkeypatch.setenv("ASYNCINFER_BATCH_CHUNK", "7")
    reset_caches()
    settings = Settings.from_env()
    fid = upload(settings, TENANT, [chat_line(f"c{i}") for i in range(10)])
    _, out, _ = api(
        "POST", "/openai/v1/batches", {"input_file_id": fid, "endpoint": "/v1/chat/completions"}
    )
    store = BatchStore(settings)
    expander = expansion.Expander(settings)
    record = expander.validate(store.get(out["id"]) or {})
    assert record is not None
    # Each submit takes 4 s of a fake clock, one line at a time (groups of one line, one
    # thread): the deadline is 1 s away, so the third line begins 8 s past it and the fourth
    # 12 s past it (LATE_SECONDS is 10).
    clock, real = [1000.0], time.monotonic
    monkeypatch.setattr(expansion.time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(expansion, "GROUP_THREADS", 1)
    monkeypatch.setattr(expansion, "GROUP_LINES", 1)
    submit = LineJobs.submit_group

    def slow(self: Any, *a: Any) -> Any:
        clock[0] += 4
        return submit(self, *a)

    monkeypatch.setattr(LineJobs, "submit_group", slow)
    expander.expand(record, clock[0] + 1)
    assert len(line_jobs(settings, TENANT)) == 3
    assert (store.get(out["id"]) or {})["next_line"] == 3  # the next invocation goes on there
    monkeypatch.setattr(LineJobs, "submit_group", submit)
    monkeypatch.setattr(expansion.time, "monotonic", real)
    assert run_batch_queue(settings) >= 1  # the handed-on "expand" runs it again, and the rest
    jobs = line_jobs(settings, TENANT)
    assert sorted(json.loads(j["metadata"])["custom_id"] for j in jobs) == sorted(
        f"c{i}" for i in range(10)
    )
    record = store.get(out["id"]) or {}
    assert record["next_line"] == 10 and record["expanded"]


def test_finalization_reads_the_jobs_that_just_ended_consistently(
    api: ApiCaller, settings: Settings, monkeypatch: Any
) -> None:
    batch_id = _batch(api, settings, 2)
    ddb = clients.client("dynamodb", settings)
    batch_get = ddb.batch_get_item
    ended: set[str] = set()

    def lagging(RequestItems: dict[str, Any], **kw: Any) -> Any:
        # An eventually consistent read does not see the records written just before yet.
        resp = batch_get(RequestItems=RequestItems, **kw)
        for table, req in RequestItems.items():
            if not req.get("ConsistentRead"):
                resp["Responses"][table] = [
                    i for i in resp["Responses"].get(table, []) if i["job_id"]["S"] not in ended
                ]
        return resp

    monkeypatch.setattr(ddb, "batch_get_item", lagging)
    for rec in line_jobs(settings, TENANT):
        ended.add(rec["job_id"])
        finish(settings, rec, echo_ok)
    run_events(settings)  # the last line's event finalizes the batch
    batch = BatchStore(settings).get(batch_id)
    assert batch is not None and batch["status"] == "completed", batch
    assert (batch["completed"], batch["failed"]) == (2, 0)  # no line lost to a stale read
