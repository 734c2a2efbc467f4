"""End to end (issue 16): an ``openai-server`` entry whose engine is ``asyncinfer serve-openai``
with SmolLM2 on a loopback port, started by the test, fed by the local stack's worker: Paris
through the queue, progress, a cancel that closes the engine's stream, an engine that is not
ready yet, an engine restart mid-job, and backpressure (counted at the engine)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from asyncinfer.local.stack import free_port
from tests.e2e.conftest import LocalStackProcess, local_stack

pytestmark = pytest.mark.e2e

#: The most requests the entry lets one worker keep in flight at the engine.
CONCURRENCY = 2
PARIS = {"messages": [{"role": "user", "content": "What is the capital of France?"}]}
STORY = {"messages": [{"role": "user", "content": "Write a very long story about a dragon."}]}


class Engine:
    """``asyncinfer serve-openai --model MODEL`` (default smollm2-135m-instruct) on one port,
    restartable."""

    def __init__(self, port: int, model: str = "smollm2-135m-instruct") -> None:
        self.model = model
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        self.proc: subprocess.Popen[str] | None = None
        self.lines: list[str] = []

    def start(self) -> None:
        exe = Path(sys.executable).parent / "asyncinfer"
        self.proc = subprocess.Popen(
            [
                str(exe),
                "serve-openai",
                "--model",
                self.model,
                "--port",
                str(self.port),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        proc = self.proc

        def pump() -> None:
            assert proc.stdout is not None
            for line in proc.stdout:
                self.lines.append(line.rstrip("\n"))

        threading.Thread(target=pump, daemon=True).start()

    def wait_ready(self, timeout: float = 180) -> None:
        deadline = time.monotonic() + timeout
        while True:
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "engine not ready:\n" + "\n".join(self.lines[-20:])
            time.sleep(0.3)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)
        self.proc = None

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def metric(self, name: str) -> float:
        text = httpx.get(self.url + "/metrics", timeout=5).text
        return sum(float(ln.split()[-1]) for ln in text.splitlines() if ln.startswith(name + "{"))


@pytest.fixture(scope="module")
def engine() -> Iterator[Engine]:
    e = Engine(free_port())
    try:
        yield e
    finally:
        e.stop()


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, engine: Engine) -> Iterator[LocalStackProcess]:
    folder = tmp_path_factory.mktemp("catalogue")
    (folder / "models.yaml").write_text(
        f"""\
models:
  - id: smol-engine
    kind: openai-server
    description: SmolLM2 behind asyncinfer serve-openai
    max_batch_size: {CONCURRENCY}
    engine: {{url: "{engine.url}", model: smollm2-135m-instruct}}
    limits: {{max_new_tokens: 1024}}
    compute: {{gpus: 0, price_per_hour: 1.0}}
"""
    )
    with local_stack(
        tmp_path_factory.mktemp("state"),
        *("--models-file", str(folder / "models.yaml"), "--min-workers", "1"),
    ) as s:
        yield s


def submit(stack: LocalStackProcess, inp: dict) -> str:
    with stack.client() as c:
        r = c.post("/v1/jobs", json={"model": "smol-engine", "input": inp})
        assert r.status_code == 202, r.text
        return str(r.json()["id"])


def get(stack: LocalStackProcess, job_id: str) -> dict:
    with stack.client() as c:
        return dict(c.get(f"/v1/jobs/{job_id}").json())


def test_1_jobs_wait_in_the_queue_until_the_engine_is_ready(
    stack: LocalStackProcess, engine: Engine
) -> None:
    ids = [submit(stack, {**PARIS, "max_new_tokens": 20}) for _ in range(2)]
    time.sleep(8)  # the worker is up; the engine is not
    for job_id in ids:
        job = get(stack, job_id)
        assert job["status"] == "queued" and job["attempts"] == 0, job
    engine.start()
    engine.wait_ready()
    for job_id in ids:
        job = stack.wait_status(job_id, {"succeeded", "failed"}, timeout=180)
        assert job["status"] == "succeeded", job
        assert job["attempts"] == 1
        out = job["output"]
        assert "Paris" in out["text"] and out["finish_reason"] in ("stop", "length")
        assert out["usage"]["prompt_tokens"] > 0 and out["usage"]["completion_tokens"] > 0
        assert job["metrics"]["compute_seconds"] > 0


def test_2_progress_then_a_cancel_closes_the_stream_at_the_engine(
    stack: LocalStackProcess, engine: Engine
) -> None:
    job_id = submit(stack, {**STORY, "max_new_tokens": 1000})
    deadline = time.monotonic() + 120
    while True:
        job = get(stack, job_id)
        if job["status"] == "running" and (job.get("progress") or {}).get("completion_tokens"):
            break
        assert job["status"] in ("queued", "running"), job
        assert time.monotonic() < deadline, job
        time.sleep(0.2)
    with stack.client() as c:
        assert c.post(f"/v1/jobs/{job_id}/cancel").status_code in (200, 202)
    job = stack.wait_status(job_id, {"cancelled", "succeeded", "failed"}, timeout=60)
    assert job["status"] == "cancelled", job
    deadline = time.monotonic() + 30
    while not any("stream closed" in ln and job_id in ln for ln in engine.lines):
        assert time.monotonic() < deadline, "\n".join(engine.lines[-20:])
        time.sleep(0.2)
    time.sleep(1)
    assert engine.metric("vllm:num_requests_running") == 0  # generation stopped at the engine


def test_3_backpressure_never_more_in_flight_than_the_entry_allows(
    stack: LocalStackProcess, engine: Engine
) -> None:
    ids = [submit(stack, {**PARIS, "max_new_tokens": 24}) for _ in range(6)]
    for job_id in ids:
        job = stack.wait_status(job_id, {"succeeded", "failed"}, timeout=240)
        assert job["status"] == "succeeded", job
    assert engine.metric("asyncinfer_engine_running_peak") == CONCURRENCY
    assert engine.metric("vllm:num_requests_waiting") == 0


def test_4_an_engine_restart_mid_job_retries_the_job(
    stack: LocalStackProcess, engine: Engine
) -> None:
    job_id = submit(stack, {**STORY, "max_new_tokens": 200})
    deadline = time.monotonic() + 120
    while (get(stack, job_id).get("progress") or {}).get("completion_tokens", 0) < 1:
        assert time.monotonic() < deadline, get(stack, job_id)
        time.sleep(0.2)
    engine.kill()
    time.sleep(3)
    job = get(stack, job_id)
    assert job["status"] in ("queued", "running"), job  # given back, not failed
    engine.start()
    engine.wait_ready()
    job = stack.wait_status(job_id, {"succeeded", "failed", "cancelled"}, timeout=240)
    assert job["status"] == "succeeded", job
    assert job["attempts"] == 2 and job["output"]["usage"]["completion_tokens"] > 0
