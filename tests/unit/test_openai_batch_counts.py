"""Exact batch line counts without transactions (:mod:`asyncinfer.openai_api.batch_counts`):
one conditional write per chunk, duplicates in one invocation and across invocations count once,
a forged or foreign event counts nothing; moto in-process."""

from __future__ import annotations

import json
from typing import Any

from asyncinfer.aws import clients
from asyncinfer.core.settings import Settings
from asyncinfer.jobs.events import event_for
from asyncinfer.openai_api import finalize
from asyncinfer.openai_api.batch_counts import LineCounts
from asyncinfer.openai_api.batch_store import BatchStore
from tests.conftest import ApiCaller
from tests.unit.batch_helpers import chat_line, echo_ok, finish, line_jobs, run_batch_queue, upload

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
