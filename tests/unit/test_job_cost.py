"""Per-job cost (issue 13, item 6; shared/spec/models.md "What a job shows"): the worker splits
each batch's compute time across the jobs in it and records ``metrics.compute_seconds`` and,
with the entry's ``price_per_hour``, ``metrics.cost_usd`` on every terminal job, plus the
``ComputeSeconds`` / ``CostUSD`` EMF metrics per model. A stub handler advances a fake clock,
so the worker's busy time is known exactly (moto in-process)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from asyncinfer.core import job_metrics as jm
from asyncinfer.core.errors import InvalidInput
from asyncinfer.core.settings import Settings
from asyncinfer.functions.api.schemas import JobRequest
from asyncinfer.jobs.service import JobService
from asyncinfer.jobs.view import render_job
from asyncinfer.models import base
from asyncinfer.models.base import ModelHandler, Result, WorkItem
from asyncinfer.models.registry import MODELS
from asyncinfer.worker.metrics import emit_job_metrics
from asyncinfer.worker.outcomes import cost_fields, decide
from asyncinfer.worker.runner import Worker

#: Fake seconds a batch takes: a fixed part and a part per job.
BATCH_SECONDS, ITEM_SECONDS = 0.5, 0.125


class FakeClock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


class StubHandler(ModelHandler):
    """Echo with a fake duration per batch (``BATCH_SECONDS + ITEM_SECONDS * len(items)``);
    the last job of the second batch fails permanently."""

    def __init__(self, clock: FakeClock) -> None:
        super().__init__(spec=MODELS["echo"])
        self.clock = clock
        self.busy = 0.0
        self.batches: list[int] = []

    def predict(self, items: list[WorkItem]) -> list[Result]:
        seconds = BATCH_SECONDS + ITEM_SECONDS * len(items)
        self.clock.t += seconds
        self.busy += seconds
        self.batches.append(len(items))
        out: list[Result] = [{"echo": i.job_id} for i in items]
        if len(self.batches) == 2:
            out[-1] = InvalidInput("no")
        return out


def submit(settings: Settings, n: int) -> list[str]:
    service = JobService(settings)
    ids = []
    for _ in range(n):
        job, _ = service.submit("t1", JobRequest(model="echo", input={"sleep_seconds": 0}))
        ids.append(str(job["id"]))
    return ids


def test_compute_seconds_sum_to_the_busy_time_and_cost_follows_the_price(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = FakeClock()
    monkeypatch.setattr(base, "compute_clock", clock)
    ids = submit(settings, 7)
    handler = StubHandler(clock)
    worker = Worker(settings, "echo", handler=handler, max_batch_size=4, max_wait_seconds=0)
    worker.intake.receive_wait_seconds = 1
    worker.run(max_jobs=7)

    records = [worker.store.get(i) for i in ids]
    assert all(r is not None and r["status"] in ("succeeded", "failed") for r in records)
    assert sum(handler.batches) == 7 and len(handler.batches) >= 2
    views = [render_job(r) for r in records if r is not None]
    compute = [v["metrics"]["compute_seconds"] for v in views]
    assert all(c is not None and c > 0 for c in compute)
    assert sum(compute) == pytest.approx(handler.busy, abs=1e-5)
    price = MODELS["echo"].entry.compute.price_per_hour  # type: ignore[union-attr]
    assert price
    for v in views:
        assert v["metrics"]["cost_usd"] == pytest.approx(
            v["metrics"]["compute_seconds"] * price / 3600, rel=1e-5
        )
    # A failed job carries its compute time too.
    assert any(v["status"] == "failed" and v["metrics"]["compute_seconds"] for v in views)
    # Each job of a batch has an equal share of that batch.
    expected = sorted(
        (BATCH_SECONDS + ITEM_SECONDS * n) / n for n in handler.batches for _ in range(n)
    )
    assert sorted(compute) == pytest.approx(expected, abs=1e-5)


def test_run_batch_splits_only_what_the_handler_did_not_attribute(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A handler that attributes time itself (the generation engine) is not counted twice; what
    it left (overhead) is split equally."""
    clock = FakeClock()
    monkeypatch.setattr(base, "compute_clock", clock)

    class Attributing(ModelHandler):
        def predict(self, items: list[WorkItem]) -> list[Result]:
            clock.t += 3.0
            items[0].compute_seconds += 2.0  # one job's own work
            return [{} for _ in items]

    items = [WorkItem(job_id=f"j{i}", input=MODELS["echo"].input_model()) for i in range(2)]
    base.run_batch(Attributing(spec=MODELS["echo"]), items)
    assert [i.compute_seconds for i in items] == [2.5, 0.5]


def test_a_raising_batch_still_charges_its_time(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = FakeClock()
    monkeypatch.setattr(base, "compute_clock", clock)

    class Raising(ModelHandler):
        def predict(self, items: list[WorkItem]) -> list[Result]:
            # The batch takes 1 s; each job alone (the out-of-memory split's retry) 0.1 s per
            # its index + 0.1.
            clock.t += 1.0 if len(items) > 1 else 0.1 * (int(items[0].job_id[1:]) + 1)
            raise MemoryError

    items = [WorkItem(job_id=f"j{i}", input=MODELS["echo"].input_model()) for i in range(4)]
    results = base.run_batch(Raising(spec=MODELS["echo"]), items)
    assert all(type(r).__name__ == "OutOfMemory" for r in results)
    # The batch's second split four ways; each retry charged to its own job only.
    assert [i.compute_seconds for i in items] == pytest.approx([0.35, 0.45, 0.55, 0.65])


def test_cost_fields() -> None:
    assert cost_fields(36.0, 0.805) == {"compute_seconds": 36.0, "cost_usd": 0.00805}
    assert cost_fields(1.5, None) == {"compute_seconds": 1.5}
    assert cost_fields(-1.0, 1.0) == {"compute_seconds": 0.0, "cost_usd": 0.0}


def test_every_terminal_outcome_records_compute_a_requeue_does_not() -> None:
    from asyncinfer.core.errors import JobCancelled, TransientError
    from asyncinfer.worker.outcomes import Finish, Requeue

    record = {"job_id": "job_1", "attempts": 1}
    for result in ({"x": 1}, InvalidInput("bad"), JobCancelled("c")):
        out = decide(
            result,
            record,
            completed_at="2026-12-01T00:00:00.000Z",
            retry_delay_seconds=1,
            compute_seconds=7.2,
            price_per_hour=2.0,
        )
        assert isinstance(out, Finish)
        assert out.transition.set_fields["compute_seconds"] == 7.2
        assert out.transition.set_fields["cost_usd"] == pytest.approx(0.004)
    back = decide(
        TransientError("x"), record, completed_at="t", retry_delay_seconds=1, compute_seconds=1
    )
    assert isinstance(back, Requeue)


def test_job_view_and_emf_metrics_carry_compute_and_cost(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("POWERTOOLS_METRICS_DISABLED", raising=False)
    record: dict[str, Any] = {
        "job_id": "job_1",
        "model": "echo",
        "status": "succeeded",
        "created_at": "2026-12-01T00:00:00.000Z",
        "started_at": "2026-12-01T00:00:01.000Z",
        "completed_at": "2026-12-01T00:00:03.000Z",
        "compute_seconds": 1.25,
        "cost_usd": 0.0000310,
    }
    metrics = render_job(record)["metrics"]
    assert metrics["compute_seconds"] == 1.25 and metrics["cost_usd"] == 0.0000310
    assert (
        render_job({**record, "compute_seconds": None, "cost_usd": None})["metrics"]["cost_usd"]
        is None
    )
    lines: list[str] = []
    emit_job_metrics(record, write=lines.append)
    docs = [json.loads(line) for line in lines]
    by_name = {d["_aws"]["CloudWatchMetrics"][0]["Metrics"][0]["Name"]: d for d in docs}
    assert set(by_name) == {
        jm.JOBS_SUCCEEDED,
        jm.QUEUE_SECONDS,
        jm.RUN_SECONDS,
        jm.COMPUTE_SECONDS,
        jm.COST_USD,
    }
    compute = by_name[jm.COMPUTE_SECONDS]
    assert compute[jm.COMPUTE_SECONDS] == 1.25 and compute["Model"] == "echo"
    assert compute["_aws"]["CloudWatchMetrics"][0]["Dimensions"] == [["Model"]]
    assert compute["_aws"]["CloudWatchMetrics"][0]["Metrics"][0]["Unit"] == "Seconds"
    assert by_name[jm.COST_USD][jm.COST_USD] == 0.0000310
