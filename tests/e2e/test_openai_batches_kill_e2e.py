"""End to end (issue 15, item 7): a worker killed (SIGKILL) in the middle of a batch loses no line
and counts none twice.

``asyncinfer local --models echo`` (one worker at most) with short heartbeat, lease and sweep
intervals; a chat batch of 40 echo lines of 3 s each (the worker runs 10 at a time) through the
unchanged ``openai`` SDK. While lines run, the worker process is killed; its lines' leases lapse,
the sweeper puts them back, the autoscaler starts another worker, and they run again. The batch
ends ``completed`` with every ``custom_id`` exactly once in the output, no error file, and
``request_counts`` 40 = 40 completed + 0 failed, still so after the killed attempts' messages
and events have had time to come back.
"""

from __future__ import annotations

import os
import re
import signal
import time
from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.conftest import LocalStackProcess, local_stack
from tests.e2e.test_openai_batches_e2e import content_lines, line, sdk, upload, wait

pytestmark = pytest.mark.e2e

LINES = 40
SLEEP = 3.0  # seconds per line: the worker is killed while a round of 10 runs
LEASE = 3
VISIBILITY = 12  # longer than lease + sweep: the sweeper takes the lines back first
TERMINAL = {"completed", "failed", "expired", "cancelled"}
WORKER_RE = re.compile(r"worker started: model=echo pid=(\d+)")


@pytest.fixture
def stack(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[LocalStackProcess]:
    monkeypatch.setenv("ASYNCINFER_HEARTBEAT_SECONDS", "1")
    monkeypatch.setenv("ASYNCINFER_LEASE_SECONDS", str(LEASE))
    monkeypatch.setenv("ASYNCINFER_SWEEP_SECONDS", "1")
    args = ("--models", "echo", "--visibility-timeout", str(VISIBILITY))
    with local_stack(tmp_path / "state", *args) as s:
        try:
            yield s
        finally:  # what the stack printed, to read after a failure
            (tmp_path / "stack.log").write_text("\n".join(s.lines) + "\n")


def live_workers(stack: LocalStackProcess) -> list[int]:
    """Pids of the stack's echo workers that are still alive."""
    pids = []
    for text in list(stack.lines):
        m = WORKER_RE.search(text)
        if m:
            try:
                os.kill(int(m.group(1)), 0)
            except OSError:
                continue
            pids.append(int(m.group(1)))
    return pids


def batch_jobs(stack: LocalStackProcess, batch_id: str) -> list[dict[str, Any]]:
    """The line jobs of ``batch_id`` (``GET /v1/jobs``, by ``metadata.batch_id``)."""
    with stack.client() as c:
        jobs = c.get("/v1/jobs", params={"limit": 100}).json()["jobs"]
    return [j for j in jobs if j["metadata"].get("batch_id") == batch_id]


def fresh_running(jobs: list[dict[str, Any]], within: float) -> list[dict[str, Any]]:
    """The running jobs that started less than ``within`` seconds ago (so they run on)."""
    now = datetime.now(UTC)
    out = []
    for j in jobs:
        if j["status"] == "running" and j.get("started_at"):
            started = datetime.fromisoformat(j["started_at"].replace("Z", "+00:00"))
            if (now - started).total_seconds() < within:
                out.append(j)
    return out


def test_a_worker_killed_mid_batch_loses_no_line_and_counts_none_twice(
    stack: LocalStackProcess,
) -> None:
    cids = [f"kill-{i:02d}" for i in range(LINES)]
    fid = upload(stack, [line(cid, sleep_seconds=SLEEP) for cid in cids])
    client = sdk(stack)
    batch = client.batches.create(
        input_file_id=fid, endpoint="/v1/chat/completions", completion_window="24h"
    )
    # Kill the worker while lines of the batch run on it (started under half their sleep ago).
    deadline = time.monotonic() + 180
    victims: list[dict[str, Any]] = []
    while not victims:
        assert time.monotonic() < deadline, f"no line ran: {client.batches.retrieve(batch.id)}"
        victims = fresh_running(batch_jobs(stack, batch.id), within=SLEEP / 2)
        if not victims:
            time.sleep(0.2)
    pids = live_workers(stack)
    assert len(pids) == 1, pids  # --max-workers 1: the lines running are on this one
    os.kill(pids[0], signal.SIGKILL)
    before = client.batches.retrieve(batch.id)
    assert before.status == "in_progress", before
    assert before.request_counts is not None and before.request_counts.completed < LINES

    done = wait(client, batch.id, TERMINAL, timeout=300)
    assert done.status == "completed", done
    assert done.request_counts is not None
    counts = done.request_counts
    assert (counts.total, counts.completed, counts.failed) == (LINES, LINES, 0)
    assert done.output_file_id and not done.error_file_id
    outputs = content_lines(client, done.output_file_id)
    assert Counter(o["custom_id"] for o in outputs) == Counter(cids)  # each exactly once
    assert all(o["error"] is None and o["response"]["status_code"] == 200 for o in outputs)
    # The killed lines ran again (a second attempt) and succeeded; no line was lost.
    jobs = {j["id"]: j for j in batch_jobs(stack, batch.id)}
    assert len(jobs) == LINES and {j["status"] for j in jobs.values()} == {"succeeded"}
    assert any(jobs[v["id"]]["attempts"] >= 2 for v in victims), [
        (v["id"], jobs[v["id"]]["attempts"]) for v in victims
    ]
    # Late messages and events of the killed attempts (visibility timeout, outboxes) count
    # nothing more.
    time.sleep(VISIBILITY + 3)
    again = client.batches.retrieve(batch.id)
    assert again.status == "completed" and again.request_counts is not None
    assert again.request_counts.model_dump() == counts.model_dump()
