"""Issue 14, behaviour 9: a chaos run on the local stack.

A few hundred echo jobs (small random sleeps; some with injected retryable or permanent failures;
some over the 64 KB inline limit, so their input and output go through S3) are submitted while
workers are killed (SIGKILL) and stopped (SIGTERM) at random and the emulator's SNS and S3 fail
for windows of a few seconds (asyncinfer.local.faults). The local autoscaler starts workers again
as the backlog requires. At the end, within a bounded time:

- every job is terminal;
- every succeeded job has exactly one output (inline, or at its S3 key) equal to its input;
- no job ran more often than its record's ``attempts`` say (``job.started`` events per attempt);
- jobs without injected failures succeeded; permanent failures failed ``invalid_input``.

Short heartbeat, lease, sweep and visibility intervals keep it to a few minutes. Every loop is
bounded in count and time. The random seed is printed (``CHAOS_SEED`` replays a run).
"""

from __future__ import annotations

import os
import random
import re
import signal
import threading
import time
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

import boto3
import httpx
import pytest

from asyncinfer.local.faults import FAULTS_FILE, INJECTED, write_faults
from tests.e2e.conftest import LocalStackProcess, local_stack

pytestmark = pytest.mark.e2e

JOBS = 240
LARGE = 8  # inputs over the 64 KB inline limit: input and output in S3
PERMANENT = 6
RETRYABLE = 12
MAX_WORKERS = 3
LEASE = 3
VISIBILITY = 8
MAX_RECEIVE = 6
CHAOS_SECONDS = 45
SETTLE_SECONDS = 240
TERMINAL = {"succeeded", "failed", "cancelled", "expired"}
#: An event-log line; another process's output may be glued on after it (no newline between).
STARTED_RE = re.compile(
    r"^\S+ job\.started\s+(job_\S+) model=\S+ attempts=(\d+?)(?=\d{4}-\d\d-|\s|$)"
)
EVENT_RE = re.compile(r"^\S+ (job\.\w+)\s+(job_\S+) ")
WORKER_RE = re.compile(r"worker started: model=echo pid=(\d+)")


@pytest.fixture
def stack(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[LocalStackProcess]:
    monkeypatch.setenv("ASYNCINFER_HEARTBEAT_SECONDS", "1")
    monkeypatch.setenv("ASYNCINFER_LEASE_SECONDS", str(LEASE))
    monkeypatch.setenv("ASYNCINFER_SWEEP_SECONDS", "1")
    monkeypatch.setenv("ASYNCINFER_RETRY_DELAY", "0.5")
    monkeypatch.setenv("ASYNCINFER_EMULATOR_FAULTS", "1")
    args = (
        "--models",
        "echo",
        "--max-workers",
        str(MAX_WORKERS),
        "--idle-seconds",
        "5",
        "--backlog-per-worker",
        "4",
        "--visibility-timeout",
        str(VISIBILITY),
        "--max-receive-count",
        str(MAX_RECEIVE),
    )
    with local_stack(tmp_path / "state", *args) as s:
        try:
            yield s
        finally:  # what the stack printed, to read after a failure
            (tmp_path / "stack.log").write_text("\n".join(s.lines) + "\n")


def job_bodies(rng: random.Random) -> list[dict]:
    bodies: list[dict] = []
    for n in range(JOBS):
        inp: dict = {"sleep_seconds": round(rng.uniform(0.0, 0.4), 2), "n": n}
        if n < LARGE:
            inp["pad"] = "x" * (70 * 1024)
        elif n < LARGE + PERMANENT:
            inp["fail"] = {"kind": "permanent"}
        elif n < LARGE + PERMANENT + RETRYABLE:
            inp["fail"] = {"kind": "retryable", "attempts": 1}
        bodies.append({"model": "echo", "input": inp})
    rng.shuffle(bodies)
    return bodies


def submit(c: httpx.Client, body: dict, key: str) -> str:
    """Submit with an idempotency key, retrying 5xx and transport errors (bounded)."""
    last = ""
    for _ in range(20):
        try:
            r = c.post("/v1/jobs", json=body, headers={"Idempotency-Key": key})
        except httpx.TransportError as exc:
            last = repr(exc)
            time.sleep(0.5)
            continue
        if r.status_code in (200, 202):
            return str(r.json()["id"])
        assert r.status_code >= 500, r.text  # never a 4xx for a valid body
        last = f"{r.status_code} {r.text}"
        time.sleep(0.5)
    raise AssertionError(f"submit never accepted: {last}")


def live_workers(stack: LocalStackProcess) -> list[int]:
    pids = []
    for line in list(stack.lines):
        m = WORKER_RE.search(line)
        if not m:
            continue
        pid = int(m.group(1))
        try:
            os.kill(pid, 0)
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except (OSError, ProcessLookupError):
            continue
        if b"asyncinfer" in cmdline or b"python" in cmdline:
            pids.append(pid)
    return pids


def chaos(stack: LocalStackProcess, rng: random.Random, faults: Path, until: float) -> list[str]:
    """Random kills, stops and fault windows until ``until`` (monotonic); returns what it did."""
    done: list[str] = []
    actions: list[str] = []
    for _ in range(1000):
        if time.monotonic() >= until:
            break
        time.sleep(rng.uniform(1.0, 3.0))
        if not actions:  # every kind of action in each round, in a random order
            actions = ["kill", "kill", "term", "sns", "s3", "both"]
            rng.shuffle(actions)
        action = actions.pop()
        if action in ("kill", "term"):
            pids = live_workers(stack)
            if pids:
                pid = rng.choice(pids)
                try:
                    os.kill(pid, signal.SIGKILL if action == "kill" else signal.SIGTERM)
                    done.append(f"{action} {pid}")
                except ProcessLookupError:
                    pass
        else:
            window = rng.uniform(3.0, 7.0)
            services = {"sns": ["sns"], "s3": ["s3"], "both": ["sns", "s3"]}[action]
            write_faults(faults, dict.fromkeys(services, window))
            done.append(f"{action} {window:.1f}s")
    write_faults(faults, {})
    return done


def started_attempts(stack: LocalStackProcess) -> dict[str, list[int]]:
    out: dict[str, list[int]] = defaultdict(list)
    for line in list(stack.lines):
        m = STARTED_RE.match(line)
        if m:
            out[m.group(1)].append(int(m.group(2)))
    return out


def test_chaos_run_every_job_terminal_one_output_no_extra_runs(
    stack: LocalStackProcess, tmp_path: Path
) -> None:
    seed = int(os.environ.get("CHAOS_SEED") or random.randrange(1 << 30))
    print(f"CHAOS_SEED={seed}")
    rng = random.Random(seed)
    faults = tmp_path / "state" / FAULTS_FILE
    bodies = job_bodies(rng)
    jobs: dict[str, dict] = {}
    chaos_until = time.monotonic() + CHAOS_SECONDS
    log: list[str] = []
    chaos_thread = threading.Thread(
        target=lambda: log.extend(chaos(stack, rng, faults, chaos_until)), daemon=True
    )
    with stack.client() as c:
        # The first jobs go in before the chaos starts, the rest during it.
        for n, body in enumerate(bodies):
            if n == JOBS // 4:
                chaos_thread.start()
            jobs[submit(c, body, f"chaos-{seed}-{n}")] = body
        chaos_thread.join(timeout=CHAOS_SECONDS + 30)
        assert not chaos_thread.is_alive()
        write_faults(faults, {})
        print("chaos:", log)
        assert any(a.startswith("kill") for a in log), log
        # The fault windows reached the code: some publishes and some S3 calls failed.
        injected = (tmp_path / "state" / "moto.log").read_text(errors="replace")
        hits = [line.split()[3] for line in injected.splitlines() if line.startswith(INJECTED)]
        print(f"injected faults: sns={hits.count('sns')} s3={hits.count('s3')}")
        assert hits.count("sns") > 0, log

        records: dict[str, dict] = {}
        deadline = time.monotonic() + SETTLE_SECONDS
        pending = set(jobs)
        while pending and time.monotonic() < deadline:
            for job_id in sorted(pending):
                r = c.get(f"/v1/jobs/{job_id}")
                assert r.status_code == 200, r.text
                if r.json()["status"] in TERMINAL:
                    records[job_id] = r.json()
                    pending.discard(job_id)
            if pending:
                time.sleep(1)
        stuck = {j: c.get(f"/v1/jobs/{j}").json()["status"] for j in sorted(pending)}
        assert not stuck, f"{len(stuck)} jobs not terminal after {SETTLE_SECONDS}s: {stuck}"

    # Exactly one output per succeeded job, equal to its input; none for the others.
    s3 = boto3.client("s3", endpoint_url=stack.local["aws_endpoint_url"], region_name="us-east-1")
    bucket = stack.local["bucket"]
    keys: list[str] = []
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix="outputs/"):
        keys += [o["Key"] for o in page.get("Contents", [])]
    problems: list[str] = []
    for job_id, rec in records.items():
        inp = jobs[job_id]["input"]
        in_s3 = [k for k in keys if k.endswith(f"/{job_id}.json")]
        if rec["status"] == "succeeded":
            if "pad" in inp:
                if rec["output"] is not None or not rec["output_url"] or len(in_s3) != 1:
                    problems.append(f"{job_id}: large output {in_s3} {rec['output_url']!r}")
                else:
                    got = httpx.get(rec["output_url"], timeout=30).json()
                    if got != inp:
                        problems.append(f"{job_id}: output in S3 differs from its input")
            elif rec["output"] != inp or rec["output_url"] is not None or in_s3:
                problems.append(f"{job_id}: output {rec['output']!r} {in_s3}")
        elif rec["output"] is not None:
            problems.append(f"{job_id}: {rec['status']} with an output")
        fail = inp.get("fail")
        if fail and fail["kind"] == "permanent":
            if rec["status"] != "failed" or rec["error"]["code"] != "invalid_input":
                problems.append(f"{job_id}: permanent failure ended {rec['status']} {rec['error']}")
        elif rec["status"] != "succeeded" and not (
            # Chaos may exhaust attempts only through max_receive_count kills in a row.
            rec["status"] == "failed" and rec["error"]["code"] == "max_attempts"
        ):
            problems.append(f"{job_id}: ended {rec['status']} {rec['error']}")
    assert not problems, "\n".join(problems[:40])

    # No job ran more often than its attempts say. The event log is at-least-once: wait for the
    # terminal events to arrive, then count the distinct attempts that started.
    deadline = time.monotonic() + 60
    lost: list[str] = list(records)
    while time.monotonic() < deadline:
        seen = {
            (m.group(2), m.group(1)) for line in list(stack.lines) if (m := EVENT_RE.match(line))
        }
        lost = [j for j, r in records.items() if (j, f"job.{r['status']}") not in seen]
        if not lost:
            break
        time.sleep(1)
    # Events are not lost (issue 14, behaviour 6): each job's terminal event came out.
    assert not lost, f"{len(lost)} terminal jobs without their terminal event: {lost[:20]}"
    started = started_attempts(stack)
    extra = {
        j: (sorted(started.get(j, [])), r["attempts"])
        for j, r in records.items()
        if len(set(started.get(j, []))) > r["attempts"] or max(started.get(j, [0])) > r["attempts"]
    }
    lines = [line for line in list(stack.lines) if any(j in line for j in extra)]
    assert not extra, f"jobs run more often than their attempts: {extra}\n" + "\n".join(lines)
    # Events are not lost (issue 14, behaviour 6): the API's job.queued and a killed worker's
    # job.started wait in their records' outboxes (asyncinfer.jobs.outbox) until the sweeper
    # publishes them, ``outbox_grace_seconds`` after they were written.
    deadline = time.monotonic() + 90
    while True:
        seen = {
            (m.group(2), m.group(1)) for line in list(stack.lines) if (m := EVENT_RE.match(line))
        }
        started = started_attempts(stack)
        no_queued = [j for j in records if (j, "job.queued") not in seen]
        never = [j for j, r in records.items() if r["status"] == "succeeded" and not started.get(j)]
        if not (no_queued or never) or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert not no_queued, f"job.queued lost for {len(no_queued)} jobs {no_queued[:5]}"
    assert not never, f"job.started lost for {len(never)} succeeded jobs {never[:5]}"
