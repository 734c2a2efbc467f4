"""One fault, one step: a queue's SQS error in a heartbeat does not skip the other queues nor
the lease renewals, and a failed sweep step does not skip the others (issue 14)."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

import asyncinfer.functions.sweeper as sweeper
from asyncinfer.core.errors import SweepFailed
from asyncinfer.core.settings import Settings
from asyncinfer.functions.api.schemas import JobRequest
from asyncinfer.jobs.service import JobService
from asyncinfer.jobs.store import JobStore
from asyncinfer.worker.held import HeldMessages
from asyncinfer.worker.inflight import Held
from asyncinfer.worker.watcher import Watcher


class FlakySqs:
    """ChangeMessageVisibilityBatch that fails for one queue and records the others."""

    def __init__(self, broken: str) -> None:
        self.broken = broken
        self.changed: list[tuple[str, int]] = []

    def change_message_visibility_batch(self, QueueUrl: str, Entries: list[Any]) -> Any:
        if QueueUrl == self.broken:
            raise RuntimeError("SQS is down for this queue")
        self.changed.append((QueueUrl, len(Entries)))
        return {"Successful": [{"Id": e["Id"]} for e in Entries]}


class Renewals:
    """A store stub that records lease renewals."""

    def __init__(self) -> None:
        self.renewed: list[tuple[str, int]] = []

    def renew_leases(self, leases: list[tuple[str, int]]) -> set[str]:
        self.renewed += leases
        return set()


class NoJournal:
    lock = threading.RLock()


def test_a_heartbeat_survives_one_queues_visibility_fault() -> None:
    sqs = FlakySqs(broken="q-high")
    held = HeldMessages(sqs)
    for n, url in enumerate(["q-high", "q-normal"]):
        held.hold(Held(f"m{n}", f"r{n}", "{}", queue_url=url, job_id=f"job_{n}", attempts=1))
    store = Renewals()
    watcher = Watcher(
        store,  # type: ignore[arg-type]
        held,
        NoJournal(),  # type: ignore[arg-type]
        heartbeat_interval=10,
        visibility_timeout_seconds=30,
    )
    watcher.heartbeat()  # raised before, and skipped what came after the failed queue
    assert sqs.changed == [("q-normal", 1)]
    assert sorted(store.renewed) == [("job_0", 1), ("job_1", 1)]


def test_a_failed_sweep_step_does_not_skip_the_others(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    from asyncinfer.local.lambda_runtime import LocalContext

    monkeypatch.setenv("ASYNCINFER_LEASE_SECONDS", "5")
    monkeypatch.setenv("POWERTOOLS_METRICS_NAMESPACE", "asyncinfer")
    monkeypatch.setenv("POWERTOOLS_TRACE_DISABLED", "true")
    monkeypatch.setattr(sweeper, "get_settings", Settings.from_env)
    store = JobStore(Settings.from_env())
    job, _ = JobService(settings).submit("t", JobRequest(model="echo", input={}))
    job_id = str(job["id"])
    store.transition(job_id, from_status="queued", to_status="running", increment_attempts=True)
    real = time.time
    monkeypatch.setattr(time, "time", lambda: real() + 7)
    ran: list[str] = []

    def broken(_: Settings, **__: Any) -> list[str]:
        raise RuntimeError("DynamoDB is down for the expiry index")

    def republish(s: Settings, **kw: Any) -> int:
        ran.append("republish")
        return 0

    monkeypatch.setattr(sweeper, "expire_due", broken)
    monkeypatch.setattr(sweeper, "republish_pending", republish)
    with pytest.raises(SweepFailed):
        sweeper.handler({}, LocalContext("sweeper"))
    # The takeover and the outbox sweep ran after the failed expiry sweep.
    assert store.get(job_id)["status"] == "queued"  # type: ignore[index]
    assert ran == ["republish"]
