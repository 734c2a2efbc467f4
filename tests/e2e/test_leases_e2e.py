"""Issue 14 on the local stack: a job whose worker is killed (``kill -9``) after the job's TTL
passed while it runs ends terminal (run again by the next worker), never ``running`` for ever nor
``expired``. Short heartbeat, lease and sweep intervals keep it quick."""

from __future__ import annotations

import os
import re
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.conftest import LocalStackProcess, local_stack

pytestmark = pytest.mark.e2e

TTL = 10
LEASE = 3
#: Longer than lease + sweep period: the sweeper takes the job back before its message returns.
VISIBILITY = 12
SLEEP = 20  # longer than the TTL: the worker is killed while the job runs, after its TTL


@pytest.fixture
def stack(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[LocalStackProcess]:
    monkeypatch.setenv("ASYNCINFER_HEARTBEAT_SECONDS", "1")
    monkeypatch.setenv("ASYNCINFER_LEASE_SECONDS", str(LEASE))
    monkeypatch.setenv("ASYNCINFER_SWEEP_SECONDS", "1")
    args = ("--models", "echo", "--visibility-timeout", str(VISIBILITY))
    with local_stack(tmp_path / "state", *args) as s:
        yield s


def worker_pids(stack: LocalStackProcess) -> list[int]:
    return [
        int(m.group(1))
        for line in list(stack.lines)
        if (m := re.search(r"worker started: model=echo pid=(\d+)", line))
    ]


def test_worker_killed_after_the_ttl_passed_leaves_no_job_running(
    stack: LocalStackProcess,
) -> None:
    with stack.client() as c:
        r = c.post(
            "/v1/jobs",
            json={"model": "echo", "input": {"sleep_seconds": SLEEP}, "ttl_seconds": TTL},
        )
        assert r.status_code == 202, r.text
        job = r.json()
    job_id = job["id"]
    submitted = time.monotonic()
    running = stack.wait_status(job_id, {"running"}, timeout=60)
    assert running["attempts"] == 1
    time.sleep(max(0.0, submitted + TTL + 1 - time.monotonic()))  # past the TTL, still running
    assert stack.wait_status(job_id, {"running"}, timeout=1)["attempts"] == 1
    pids = worker_pids(stack)
    assert len(pids) == 1, pids
    os.kill(pids[0], signal.SIGKILL)
    killed = time.monotonic()
    # The sweeper takes it back once the lease lapsed, before the message comes back.
    back = stack.wait_status(job_id, {"queued"}, timeout=VISIBILITY - 2)
    assert back["attempts"] == 1
    assert time.monotonic() - killed < VISIBILITY

    done = stack.wait_status(
        job_id, {"succeeded", "failed", "cancelled", "expired"}, timeout=SLEEP + 60
    )
    assert done["status"] == "succeeded", done
    assert done["attempts"] == 2
    assert done["output"] == {"sleep_seconds": SLEEP}
    deadline = time.monotonic() + 10  # the event-log lines of the last events
    while "job.succeeded" not in stack.event_types(job_id) and time.monotonic() < deadline:
        time.sleep(0.2)
    types = stack.event_types(job_id)
    assert "job.expired" not in types
    # Taken back once (by the sweeper), then run to the end by the next worker.
    assert types == ["job.queued", "job.started", "job.queued", "job.started", "job.succeeded"]
