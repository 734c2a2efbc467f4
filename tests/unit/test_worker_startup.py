"""A worker's time to ready split into download, load and first token (issue 13 item 4): the
``worker ready`` line's ``download_seconds`` / ``load_seconds``, the ``first job`` line's
``idle_seconds`` / ``first_token_seconds`` / ``first_result_seconds``, and the same as EMF
metrics in AWS. A stub handler whose load downloads an ``s3://`` prefix (moto in-process)."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import boto3
import pytest

from asyncinfer.core import job_metrics as jm
from asyncinfer.core.settings import Settings
from asyncinfer.functions.api.schemas import JobRequest
from asyncinfer.jobs.service import JobService
from asyncinfer.models import weights
from asyncinfer.models.base import ModelHandler, Result, WorkItem
from asyncinfer.models.registry import MODELS
from asyncinfer.worker import startup
from asyncinfer.worker.runner import Worker
from asyncinfer.worker.startup import StartTimes

LOAD_SECONDS = 0.2


def fields(line: str) -> dict[str, str]:
    return dict(re.findall(r"(\w+)=(\S+)", line))


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_the_split_the_ready_line_and_the_first_job_line(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.delenv("POWERTOOLS_METRICS_DISABLED", raising=False)
    clock, spent = Clock(), [7.0]
    monkeypatch.setattr(startup.weights, "download_seconds", lambda: spent[0])
    emf: list[str] = []
    times = StartTimes("m1", emit=True, clock=clock, write=emf.append)
    with times.loading():
        clock.t += 3.0  # 2 s of it downloading, 1 s loading
        spent[0] += 2.0
    assert (times.download_seconds, times.load_seconds) == (2.0, 1.0)
    assert times.ready_fields() == "download_seconds=2.000 load_seconds=1.000"
    times.ready()  # at 103
    with caplog.at_level("INFO", logger="asyncinfer.worker"):
        clock.t += 4.0  # the first job starts at 104.5, its first token at 105, its result at 107
        times.finished("job_1", started=104.5, first_token_at=105.0)
        times.finished("job_2", started=105.0, first_token_at=None)  # only the first is logged
    [line] = [r.getMessage() for r in caplog.records]
    assert line.startswith("first job: ")
    assert fields(line) == {
        "model": "m1",
        "job": "job_1",
        "idle_seconds": "1.500",
        "first_token_seconds": "2.000",
        "first_result_seconds": "4.000",
    }
    docs = [json.loads(x) for x in emf]
    got = {
        name: d[name]
        for d in docs
        for name in (jm.DOWNLOAD_SECONDS, jm.LOAD_SECONDS, jm.FIRST_TOKEN_SECONDS)
        if name in d
    }
    assert got == {jm.DOWNLOAD_SECONDS: 2.0, jm.LOAD_SECONDS: 1.0, jm.FIRST_TOKEN_SECONDS: 2.0}
    for d in docs:
        [m] = d["_aws"]["CloudWatchMetrics"]
        assert m["Dimensions"] == [["Model"]] and d["Model"] == "m1"
        assert m["Metrics"][0]["Unit"] == "Seconds"


def test_without_tokens_the_result_is_the_first_token_and_no_emf_outside_aws(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.delenv("POWERTOOLS_METRICS_DISABLED", raising=False)
    clock = Clock()
    emf: list[str] = []
    times = StartTimes("m2", clock=clock, write=emf.append)
    with times.loading():
        clock.t += 0.5
    times.ready()
    clock.t += 0.25
    with caplog.at_level("INFO", logger="asyncinfer.worker"):
        times.finished("job_1", started=0.0, first_token_at=None)
    f = fields(caplog.records[0].getMessage())
    assert (f["idle_seconds"], f["first_token_seconds"], f["first_result_seconds"]) == (
        "0.000",
        "0.250",
        "0.250",
    )
    assert times.download_seconds == 0.0 and times.load_seconds == 0.5 and emf == []


class S3Loading(ModelHandler):
    """Echo whose load downloads an ``s3://`` prefix, then takes :data:`LOAD_SECONDS`."""

    def __init__(self, source: str, cache: Path) -> None:
        super().__init__(spec=MODELS["echo"])
        self.source, self.cache = source, cache

    def load(self) -> None:
        weights.s3_folder(self.source, cache_root=self.cache, s3=boto3.client("s3"))
        time.sleep(LOAD_SECONDS)

    def predict(self, items: list[WorkItem]) -> list[Result]:
        return [{"echo": i.job_id} for i in items]


def test_a_worker_logs_download_load_and_first_job(
    settings: Settings, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    s3 = boto3.client("s3")
    s3.create_bucket(Bucket="startup-weights")
    for i in range(3):
        s3.put_object(Bucket="startup-weights", Key=f"w/{i}.bin", Body=bytes([i]) * 200_000)
    job, _ = JobService(settings).submit("t1", JobRequest(model="echo", input={"sleep_seconds": 0}))
    handler = S3Loading("s3://startup-weights/w/", tmp_path)
    worker = Worker(settings, "echo", handler=handler, max_batch_size=1, max_wait_seconds=0)
    worker.intake.receive_wait_seconds = 1
    t0 = time.monotonic()
    with caplog.at_level("INFO"):
        worker.run(max_jobs=1)
    wall = time.monotonic() - t0
    lines = [r.getMessage() for r in caplog.records]
    [ready] = [m for m in lines if m.startswith("worker ready: ")]
    f = fields(ready)
    download, load = float(f["download_seconds"]), float(f["load_seconds"])
    assert download > 0 and load >= LOAD_SECONDS and download + load <= wall
    assert lines.index(ready) > next(
        n for n, m in enumerate(lines) if m.startswith("downloaded s3://startup-weights/w/")
    )
    [first] = [m for m in lines if m.startswith("first job: ")]
    g = fields(first)
    assert g["job"] == job["id"] and g["model"] == "echo"
    assert 0 <= float(g["first_token_seconds"]) <= float(g["first_result_seconds"]) < wall
    assert worker.store.get(str(job["id"]))["status"] == "succeeded"  # type: ignore[index]
