"""End to end: the local stack's autoscaler (asyncinfer.local.autoscaler running
asyncinfer.scaling.policy) with the ``echo`` model, a 3 s idle period and at most 3 workers.

The tests run in order on one stack: it starts at zero workers; a submit wakes one; idle falls to
zero; a burst rises to the maximum and falls back; scale-in while one worker is busy stops only
the idle ones and the busy job completes once.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import boto3
import httpx
import pytest

from asyncinfer.local.stack import free_port

pytestmark = pytest.mark.e2e

IDLE_SECONDS = 3.0
MAX_WORKERS = 3
READY_TIMEOUT = 120
COUNT_RE = re.compile(r"asyncinfer local: workers model=echo count=(\d+) .*busy=(\d+)")

LAUNCH = """
import sys
from pathlib import Path
from asyncinfer.local.stack import LocalOptions, run_local
sys.exit(run_local(LocalOptions(
    port={port}, models=["echo"], max_workers={max_workers}, state_dir=Path({state!r}),
    idle_seconds={idle}, scale_interval=0.25, drain_seconds=5, worker_max_batch_size=1)))
"""


@dataclass
class Stack:
    proc: subprocess.Popen[str]
    api: str
    key: str
    local: dict
    lines: list[tuple[float, str]] = field(default_factory=list)

    def client(self) -> httpx.Client:
        return httpx.Client(base_url=self.api, headers={"x-api-key": self.key}, timeout=60)

    def counts(self) -> list[tuple[float, int, int]]:
        """(time, worker count, busy) of every count-change line so far."""
        out = []
        for t, line in list(self.lines):
            m = COUNT_RE.search(line)
            if m:
                out.append((t, int(m.group(1)), int(m.group(2))))
        return out

    def count(self) -> int:
        c = self.counts()
        return c[-1][1] if c else 0

    def wait_count(self, n: int, timeout: float, since: float = 0.0) -> float:
        """Wait for a count-change line to ``n`` logged after ``since``; returns its time."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for t, c, _ in self.counts():
                if c == n and t >= since:
                    return t
            time.sleep(0.1)
        raise AssertionError(f"worker count never reached {n}: {self.counts()}")

    def visible(self) -> int:
        sqs = boto3.client(
            "sqs", endpoint_url=self.local["aws_endpoint_url"], region_name="us-east-1"
        )
        attrs = sqs.get_queue_attributes(
            QueueUrl=self.local["queues"]["echo"], AttributeNames=["ApproximateNumberOfMessages"]
        )["Attributes"]
        return int(attrs["ApproximateNumberOfMessages"])

    def settle(self, timeout: float = 15) -> None:
        """Wait until every worker told to stop has exited.

        A worker stopped while it long-polls exits without waiting for its poll (the worker does
        not join its poller threads), and the emulator keeps that poll open: a message arriving
        then stays invisible until the visibility timeout. The tests submit only once stopped
        workers are gone and their last poll (``worker_receive_wait``, 2 s) is over.
        """
        deadline = time.monotonic() + timeout
        while True:
            lines = [line for _, line in list(self.lines)]
            stopping = sum("worker stopping (idle)" in line for line in lines)
            if sum("worker stopped: pid=" in line for line in lines) >= stopping:
                time.sleep(2.5)
                return
            assert time.monotonic() < deadline, "a stopped worker did not exit"
            time.sleep(0.1)

    def event_lines(self, job_id: str) -> list[str]:
        return [
            line.split()[1] for _, line in list(self.lines) if job_id in line and " job." in line
        ]


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    state = tmp_path_factory.mktemp("state")
    code = LAUNCH.format(
        port=free_port(), max_workers=MAX_WORKERS, state=str(state), idle=IDLE_SECONDS
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    lines: list[tuple[float, str]] = []
    ready = threading.Event()

    def pump() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append((time.monotonic(), line.rstrip("\n")))
            if line.startswith("asyncinfer local: ready"):
                ready.set()

    threading.Thread(target=pump, daemon=True).start()
    if not ready.wait(READY_TIMEOUT):
        proc.kill()
        pytest.fail("local stack not ready:\n" + "\n".join(line for _, line in lines[-40:]))
    ready_line = next(line for _, line in lines if line.startswith("asyncinfer local: ready"))
    parts = dict(p.split("=", 1) for p in ready_line.split()[3:])
    local = json.loads((state / "local.json").read_text())
    yield Stack(proc=proc, api=parts["api"], key=parts["key"], local=local, lines=lines)
    if os.environ.get("ASYNCINFER_E2E_LOG"):  # keep the stack's output for a look afterwards
        with open(os.environ["ASYNCINFER_E2E_LOG"], "w") as f:
            f.writelines(f"{t:.3f} {line}\n" for t, line in lines)
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def submit(c: httpx.Client, inp: dict) -> str:
    r = c.post("/v1/jobs", json={"model": "echo", "input": inp})
    assert r.status_code == 202, r.text
    return str(r.json()["id"])


def wait_terminal(c: httpx.Client, job_id: str, timeout: float = 60) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        job = c.get(f"/v1/jobs/{job_id}", params={"wait": 10}).json()
        if job["status"] in ("succeeded", "failed", "cancelled", "expired"):
            return job
        assert time.monotonic() < deadline, f"{job_id} still {job['status']}"


def status(c: httpx.Client, job_id: str) -> str:
    return str(c.get(f"/v1/jobs/{job_id}").json()["status"])


def test_starts_at_zero_and_a_submit_starts_a_worker(stack: Stack) -> None:
    time.sleep(1.0)  # several autoscaler ticks with nothing to do
    assert stack.count() == 0, stack.counts()
    with stack.client() as c:
        t0 = time.monotonic()
        job = wait_terminal(c, submit(c, {"n": 1}))
        elapsed = time.monotonic() - t0
    assert job["status"] == "succeeded", job
    assert job["output"] == {"n": 1}
    assert job["attempts"] == 1
    assert stack.wait_count(1, 1, since=t0) >= t0
    print(f"first submit at zero -> succeeded in {elapsed:.2f}s; metrics {job['metrics']}")


def test_idle_falls_to_zero_after_the_idle_period(stack: Stack) -> None:
    # The previous test's job finished no later than the stack printed its event (the client's
    # long poll may return seconds after that).
    t_done = max(t for t, line in list(stack.lines) if " job.succeeded " in line)
    t_zero = stack.wait_count(0, IDLE_SECONDS + 15, since=0)
    assert stack.count() == 0
    assert t_zero - t_done >= IDLE_SECONDS - 1.5, "scaled to zero before the idle period"


def test_burst_rises_to_max_and_falls_back_to_zero(stack: Stack) -> None:
    stack.settle()
    with stack.client() as c:
        t0 = time.monotonic()
        ids = [submit(c, {"i": i, "sleep_seconds": 1}) for i in range(12)]
        stack.wait_count(MAX_WORKERS, 20, since=t0)
        jobs = [wait_terminal(c, j) for j in ids]
    assert [j["status"] for j in jobs] == ["succeeded"] * 12
    assert [j["output"]["i"] for j in jobs] == list(range(12))
    assert max(n for t, n, _ in stack.counts() if t >= t0) == MAX_WORKERS
    t_zero = stack.wait_count(0, IDLE_SECONDS + 20, since=t0)
    assert stack.count() == 0
    assert t_zero > t0


def test_scale_in_while_busy_stops_only_idle_workers(stack: Stack) -> None:
    """Three quick jobs bring the workers to the maximum; a long job sent once they all run is
    held by one worker and runs alone after its quick job. Once the quick jobs are done, idle
    workers go while that worker is busy; the long job is never interrupted and finishes once."""
    stack.settle()
    with stack.client() as c:
        t0 = time.monotonic()
        quick = [submit(c, {"q": i, "sleep_seconds": 2}) for i in range(3)]
        t_max = stack.wait_count(MAX_WORKERS, 10, since=t0)
        deadline = time.monotonic() + 20
        while any(status(c, j) == "queued" for j in quick):
            assert time.monotonic() < deadline
            time.sleep(0.1)
        long_id = submit(c, {"long": True, "sleep_seconds": 10})
        deadline = time.monotonic() + 20
        while status(c, long_id) != "running":
            assert time.monotonic() < deadline
            time.sleep(0.1)
        # A scale-in while the long job runs, decided with a busy worker.
        deadline = time.monotonic() + 12
        while True:
            scale_ins = [(t, n, b) for t, n, b in stack.counts() if t > t_max and n < MAX_WORKERS]
            if scale_ins:
                break
            assert time.monotonic() < deadline, f"no scale-in: {stack.counts()}"
            time.sleep(0.1)
        assert status(c, long_id) == "running", "scale-in came only after the long job"
        assert scale_ins[0][2] >= 1, scale_ins  # decided while a worker was busy
        long_job = wait_terminal(c, long_id)
        quick_jobs = [wait_terminal(c, j) for j in quick]
    assert [j["status"] for j in quick_jobs] == ["succeeded"] * 3
    assert [j["attempts"] for j in quick_jobs] == [1] * 3
    assert long_job["status"] == "succeeded", long_job
    assert long_job["output"] == {"long": True, "sleep_seconds": 10}
    assert long_job["attempts"] == 1, "the busy worker was stopped and its job released"
    deadline = time.monotonic() + 10
    while "job.succeeded" not in stack.event_lines(long_id):
        assert time.monotonic() < deadline
        time.sleep(0.2)
    assert stack.event_lines(long_id) == ["job.queued", "job.started", "job.succeeded"]
    stack.wait_count(0, IDLE_SECONDS + 20, since=t_max)
    stopped = [line for _, line in stack.lines if "worker stopped: pid=" in line]
    assert stopped, "no worker was stopped"
    assert not [line for _, line in stack.lines if "exited with" in line]
