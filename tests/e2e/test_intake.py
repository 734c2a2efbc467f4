"""Intake by capacity on the local stack (issue 18): workers take only what they can start.

The one-at-a-time handler is the real ``echo`` model with ``ASYNCINFER_ECHO_BATCHING=0``: it then
declares ``batching`` false (capacity 1), as a handler whose ``predict`` runs items one by one
must (docs/models.md, "Batching and concurrency"). Which worker ran a job comes from the
workers' log lines, ``worker[echo:<pid>] INFO job <id> running (attempt N)``.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import pytest

from asyncinfer.core.timeutil import parse
from tests.e2e.conftest import LocalStackProcess, local_stack

pytestmark = pytest.mark.e2e

#: Long enough that two job lengths plus a loaded machine's start-up jitter stay well under
#: three (one worker holding a second job while the other idles): at 5 s, load 10 gave 14.8 s.
JOB_SECONDS = 8.0
RUNNING = re.compile(r"worker\[echo:(\d+)\] INFO job (job_\w+) running \(attempt (\d+)\)")


def submit(stack: LocalStackProcess, inp: dict) -> str:
    with stack.client() as c:
        r = c.post("/v1/jobs", json={"model": "echo", "input": inp})
        assert r.status_code == 202, r.text
        return str(r.json()["id"])


def runners(stack: LocalStackProcess) -> dict[str, str]:
    """``{job id: pid of the worker that started it}`` from the log lines so far."""
    out: dict[str, str] = {}
    for line in list(stack.lines):
        m = RUNNING.search(line)
        if m:
            out[m.group(2)] = m.group(1)
    return out


def seconds(iso: str) -> float:
    return parse(iso).timestamp()


@contextmanager
def one_at_a_time(state: Path) -> Iterator[LocalStackProcess]:
    """Echo one job at a time, at most two workers, scale-in after 4 idle seconds."""
    mp = pytest.MonkeyPatch()
    mp.setenv("ASYNCINFER_ECHO_BATCHING", "0")
    try:
        with local_stack(
            state, "--models", "echo", "--max-workers", "2", "--idle-seconds", "4"
        ) as s:
            yield s
    finally:
        mp.undo()


def test_two_workers_share_four_one_at_a_time_jobs_and_scale_in_strands_nothing(
    tmp_path: Path,
) -> None:
    with one_at_a_time(tmp_path / "state") as stack:
        share_four_jobs(stack)
        scale_in_strands_nothing(stack)


def share_four_jobs(stack: LocalStackProcess) -> None:
    """Four jobs, two workers of capacity 1: each worker runs two, one after the other; a job
    starts (``started_at``, ``queue_seconds``) when a worker is free, and the four end in about
    two job lengths instead of one worker running all four while the other idles."""
    ids = [submit(stack, {"sleep_seconds": JOB_SECONDS, "n": n}) for n in range(4)]
    jobs = [stack.wait_status(j, {"succeeded", "failed"}, timeout=180) for j in ids]
    assert [j["status"] for j in jobs] == ["succeeded"] * 4, jobs
    assert all(j["attempts"] == 1 for j in jobs)
    by_worker: dict[str, list[dict]] = {}
    who = runners(stack)
    for j in jobs:
        by_worker.setdefault(who[j["id"]], []).append(j)
    assert sorted(len(v) for v in by_worker.values()) == [2, 2], who
    starts = sorted(seconds(j["started_at"]) for j in jobs)
    ends = sorted(seconds(j["completed_at"]) for j in jobs)
    # About two job lengths from the first start to the last end (four would be one worker
    # running them all; three, one worker holding a second job while the other idles).
    assert ends[-1] - starts[0] < 2 * JOB_SECONDS + 4.0, (starts, ends)
    for runs in by_worker.values():
        first, second = sorted(runs, key=lambda j: j["started_at"])
        # The second job started when its worker became free, not when its message arrived...
        gap = seconds(second["started_at"]) - seconds(first["completed_at"])
        assert -0.1 <= gap < 2.0, (first, second)
        # ...and its queue time counts the wait until then.
        assert second["metrics"]["queue_seconds"] >= JOB_SECONDS - 1.0, second
        run = seconds(second["completed_at"]) - seconds(second["started_at"])
        assert JOB_SECONDS - 0.2 <= run < JOB_SECONDS + 1.5, second


def scale_in_strands_nothing(stack: LocalStackProcess) -> None:
    """A job submitted while idle workers scale in (each has a long poll in flight): whichever
    worker receives it runs it, or releases it to a new worker; it runs once, never to the
    dead-letter queue."""
    deadline = time.monotonic() + 90
    seen = len(stack.lines)
    while not any("worker stopping (idle)" in line for line in stack.lines[seen:]):
        assert time.monotonic() < deadline, "no scale-in"
        time.sleep(0.05)
    job_id = submit(stack, {"sleep_seconds": 0.5})
    job = stack.wait_status(job_id, {"succeeded", "failed"}, timeout=120)
    assert job["status"] == "succeeded" and job["attempts"] == 1, job


def test_a_batching_handler_still_gets_its_batch(tmp_path: Path) -> None:
    """The (batching) echo worker busy with one job while five more arrive: it receives them
    meanwhile (it has free slots), holds them, and starts the five together as its next batch,
    which runs concurrently, in about one job length."""
    with local_stack(tmp_path / "state", "--models", "echo") as stack:
        first = submit(stack, {"sleep_seconds": 8})
        stack.wait_status(first, {"running"}, timeout=120)
        with ThreadPoolExecutor(5) as pool:
            ids = list(pool.map(lambda n: submit(stack, {"sleep_seconds": 3, "n": n}), range(5)))
        before = stack.wait_status(first, {"succeeded"}, timeout=60)
        jobs = [stack.wait_status(j, {"succeeded", "failed"}, timeout=60) for j in ids]
        who = runners(stack)
    assert [j["status"] for j in jobs] == ["succeeded"] * 5, jobs
    assert len({who[j] for j in [first, *ids]}) == 1, who
    starts = [seconds(j["started_at"]) for j in jobs]
    ends = [seconds(j["completed_at"]) for j in jobs]
    assert min(starts) >= seconds(before["completed_at"]) - 0.1, (before, starts)
    assert max(starts) - min(starts) < 0.5, starts  # one take
    assert max(ends) - min(starts) < 3 + 2.0, (starts, ends)  # together, not one by one
