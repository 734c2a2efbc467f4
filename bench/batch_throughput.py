"""The OpenAI batch path against plain jobs (issue 15, item 8). Prints figures; not a test.

The same generation requests as ``bench/worker_throughput.py`` (its ``make_jobs``: 64 for
``smollm2-135m-instruct`` by default, mixed prompt lengths, ``max_new_tokens`` 16..128, half
greedy and half sampled with a seed) run two ways on one local stack (``asyncinfer local
--models smollm2-135m-instruct --min-workers 1``, a subprocess, as a user starts it):

a. as jobs: ``POST /v1/jobs`` one after another (httpx), then one long poll at a time
   (``GET /v1/jobs/{id}?wait=20``, in submission order) until every job is terminal; with
   ``--jobs-wait list``, ``GET /v1/jobs`` pages every ``--poll`` seconds instead (each 100-job
   page costs the local stack's emulator and Lambda runtime ~0.3 s of CPU that the worker then
   lacks on two cores: measured 2026-12-01, that alone made path a about half as fast);
b. as one batch file through the ``openai`` SDK: ``files.create`` of the JSONL (each job input
   as a chat body: ``max_new_tokens`` as ``max_tokens``), ``batches.create``,
   ``batches.retrieve`` every ``--poll`` seconds until the batch is terminal, then
   ``files.content`` of the output file.

Each window runs from the first request to the client holding the last result (b: the output
file downloaded). Both paths are warmed first (a job, and a one-line batch: the worker has the
model loaded and the stack's Lambda pool has imported the batch functions). Figures: wall time,
lines/s, generated tokens/s, b's phases (upload and create, validation and expansion, running,
finalization, download) and b's overhead over a in percent (target: within 10%), over
``--rounds`` interleaved rounds (a b, b a, ...: median and spread). Jobs keep their
default priority (``normal``), batch lines theirs (``low``); on an otherwise idle stack the
queues are read alike.

    .venv/bin/python bench/batch_throughput.py                                  # 64 requests
    .venv/bin/python bench/batch_throughput.py --jobs 8 --max-new-tokens 16     # a short run
"""

from __future__ import annotations

import argparse
import io
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "src"))

from bench.worker_throughput import MODEL, machine, make_jobs  # noqa: E402

TERMINAL_JOB = {"succeeded", "failed", "cancelled", "expired"}
TERMINAL_BATCH = {"completed", "failed", "expired", "cancelled"}
READY = "asyncinfer local: ready"


@dataclass
class Stack:
    """A running ``asyncinfer local``: its API URL and key."""

    api: str
    key: str
    lines: list[str] = field(default_factory=list)


@contextmanager
def local_stack(state: Path, port: int, timeout: float = 600) -> Iterator[Stack]:
    """Run ``asyncinfer local --models MODEL --min-workers 1`` on ``port`` (0: a free one) with
    its state in ``state`` until the block ends; its output goes to ``state/stack.log``."""
    from asyncinfer.local.stack import free_port

    exe = Path(sys.executable).parent / "asyncinfer"
    cmd = [str(exe), "local", "--port", str(port or free_port()), "--state-dir", str(state)]
    cmd += ["--models", MODEL, "--min-workers", "1", "--idle-seconds", "3600"]
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(ROOT / "src")}
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
    )
    lines: list[str] = []
    ready = threading.Event()

    def pump() -> None:
        assert proc.stdout is not None
        with (state / "stack.log").open("w") as log:
            for text in proc.stdout:
                lines.append(text.rstrip("\n"))
                log.write(text)
                if text.startswith(READY):
                    ready.set()

    state.mkdir(parents=True, exist_ok=True)
    threading.Thread(target=pump, daemon=True).start()
    try:
        if not ready.wait(timeout):
            raise RuntimeError("local stack not ready:\n" + "\n".join(lines[-30:]))
        ready_line = next(t for t in lines if t.startswith(READY))
        parts = dict(p.split("=", 1) for p in ready_line.split()[3:])
        yield Stack(parts["api"], parts["key"], lines)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@dataclass
class Run:
    name: str
    seconds: float
    lines: int
    tokens: int
    failures: int
    phases: dict[str, float] = field(default_factory=dict)

    @property
    def lines_per_s(self) -> float:
        return self.lines / self.seconds


def chat_line(i: int, inp: dict[str, Any]) -> dict[str, Any]:
    """The batch line of job input ``inp`` (the generation input of api.md as a chat body)."""
    body: dict[str, Any] = {"model": MODEL, "messages": inp["messages"]}
    body["max_tokens"] = inp["max_new_tokens"]
    for k in ("temperature", "top_p", "seed"):
        if k in inp:
            body[k] = inp[k]
    return {"custom_id": f"r{i:05d}", "method": "POST", "url": "/v1/chat/completions", "body": body}


def run_jobs(stack: Stack, jobs: list[dict[str, Any]], poll: float, how: str = "wait") -> Run:
    """Path a: ``POST /v1/jobs`` each, then wait until all are terminal: ``how="wait"`` holds
    one long poll at a time (``GET /v1/jobs/{id}?wait=20``, api.md, in submission order: the
    fewest requests a client can make), ``how="list"`` reads ``GET /v1/jobs`` pages every
    ``poll`` seconds (on the local stack each 100-job page costs the emulator and the Lambda
    runtime about 0.3 s of CPU, which the worker then lacks: it slowed path a by half)."""
    import httpx

    with httpx.Client(base_url=stack.api, headers={"x-api-key": stack.key}, timeout=120) as c:
        t0 = time.monotonic()
        ids: list[str] = []
        for inp in jobs:
            r = c.post("/v1/jobs", json={"model": MODEL, "input": inp})
            r.raise_for_status()
            ids.append(r.json()["id"])
        done: dict[str, dict[str, Any]] = {}
        wanted = set(ids)
        if how == "wait":
            for job_id in ids:
                while job_id not in done:
                    r = c.get(f"/v1/jobs/{job_id}", params={"wait": 20})
                    r.raise_for_status()
                    j = r.json()
                    if j["status"] in TERMINAL_JOB:
                        done[job_id] = j
        while len(done) < len(ids):
            time.sleep(poll)
            cursor = None
            while True:
                params: dict[str, Any] = {"limit": 100, **({"cursor": cursor} if cursor else {})}
                page = c.get("/v1/jobs", params=params).json()
                for j in page["jobs"]:
                    if j["id"] in wanted and j["status"] in TERMINAL_JOB:
                        done[j["id"]] = j
                cursor = page.get("next_cursor")
                if not cursor or wanted <= done.keys():
                    break
        seconds = time.monotonic() - t0
    tokens = sum(
        int(((j.get("output") or {}).get("usage") or {}).get("completion_tokens") or 0)
        for j in done.values()
    )
    failures = sum(1 for j in done.values() if j["status"] != "succeeded")
    return Run(f"a. jobs (POST /v1/jobs, {how})", seconds, len(jobs), tokens, failures)


def run_batch(stack: Stack, jobs: list[dict[str, Any]], poll: float, name: str = "") -> Run:
    """Path b: one batch file through the SDK, until its output file is downloaded."""
    import openai

    data = b"".join(json.dumps(chat_line(i, inp)).encode() + b"\n" for i, inp in enumerate(jobs))
    client = openai.OpenAI(base_url=f"{stack.api}/openai/v1", api_key=stack.key, timeout=120)
    t0 = time.monotonic()
    f = client.files.create(file=("requests.jsonl", io.BytesIO(data)), purpose="batch")
    b = client.batches.create(
        input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    created = time.monotonic()
    seen: dict[str, float] = {}
    while b.status not in TERMINAL_BATCH:
        time.sleep(poll)
        b = client.batches.retrieve(b.id)
        seen.setdefault(b.status, time.monotonic())
    ended = time.monotonic()
    outputs = []
    if b.output_file_id:
        text = client.files.content(b.output_file_id).text
        outputs = [json.loads(x) for x in text.splitlines() if x.strip()]
    seconds = time.monotonic() - t0
    running = seen.get("in_progress", created)
    finalizing = seen.get("finalizing", ended)
    phases = {
        "upload + create": created - t0,
        "validating + expansion (until in_progress seen)": running - created,
        "in_progress": finalizing - running,
        "finalizing (until completed seen)": ended - finalizing,
        "download output": seconds - (ended - t0),
    }
    tokens = sum(int(o["response"]["body"]["usage"]["completion_tokens"]) for o in outputs)
    counts = b.request_counts
    failures = (counts.failed if counts else len(jobs)) + (0 if b.status == "completed" else 1)
    return Run(name or "b. one batch (openai SDK)", seconds, len(jobs), tokens, failures, phases)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=64, help="requests (64)")
    parser.add_argument("--max-new-tokens", type=int, default=128, help="cap (default 128)")
    parser.add_argument("--poll", type=float, default=0.5, help="client poll interval, s (0.5)")
    parser.add_argument("--port", type=int, default=0, help="the stack's API port (a free one)")
    parser.add_argument("--state-dir", default=None, help="the stack's state (a temporary dir)")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds (3)")
    parser.add_argument(
        "--jobs-wait",
        choices=("wait", "list"),
        default="wait",
        help="path a's client: one long poll at a time (wait) or list pages every --poll (list)",
    )
    args = parser.parse_args(argv)
    # A SIGTERM (``timeout``, a CI runner) unwinds like Ctrl-C, so the stack is stopped too.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))

    jobs = make_jobs(args.jobs, args.max_new_tokens)
    print(f"machine: {machine()}", flush=True)
    print(f"{len(jobs)} requests, max_new_tokens sum {sum(j['max_new_tokens'] for j in jobs)}")
    pairs: list[tuple[Run, Run]] = []
    with tempfile.TemporaryDirectory(prefix="batch-bench-") as tmp:
        state = Path(args.state_dir) if args.state_dir else Path(tmp)
        with local_stack(state, args.port) as stack:
            warm = [{**jobs[0], "max_new_tokens": 2}]
            run_jobs(stack, warm, args.poll, args.jobs_wait)
            run_batch(stack, warm, args.poll)
            print("warmed up (a job and a one-line batch)", flush=True)
            for n in range(args.rounds):
                # Interleaved (a b, b a, ...): drift in the machine's load falls on both alike.
                order = ("a", "b") if n % 2 == 0 else ("b", "a")
                got: dict[str, Run] = {}
                for path in order:
                    got[path] = (
                        run_jobs(stack, jobs, args.poll, args.jobs_wait)
                        if path == "a"
                        else run_batch(stack, jobs, args.poll)
                    )
                a, b = got["a"], got["b"]
                pairs.append((a, b))
                print(
                    f"round {n + 1} ({' '.join(order)}): a {a.seconds:.1f} s  b {b.seconds:.1f} s"
                    f"  overhead {(b.seconds / a.seconds - 1) * 100:+.1f}%",
                    flush=True,
                )

    a, b = pairs[0]
    print()
    print("| path | wall s, median (min..max) | lines/s | generated tokens/s | not succeeded |")
    print("|---|---:|---:|---:|---:|")
    for k, name in ((0, a.name), (1, b.name)):
        runs = [p[k] for p in pairs]
        secs = [r.seconds for r in runs]
        med = statistics.median(secs)
        print(
            f"| {name} | {med:.1f} ({min(secs):.1f}..{max(secs):.1f}) | {len(jobs) / med:.3f} | "
            f"{runs[0].tokens / med:.1f} | {sum(r.failures for r in runs)} |"
        )
    phases = ", ".join(f"{k} {v:.1f}" for k, v in b.phases.items())
    print(f"batch phases, first round (s): {phases}")
    overheads = [(pb.seconds / pa.seconds - 1) * 100 for pa, pb in pairs]
    overhead = statistics.median(overheads)
    print(f"generated tokens: jobs {a.tokens}, batch {b.tokens}")
    print(
        f"batch overhead over jobs, median of the rounds' pairs: {overhead:+.1f}% "
        f"({min(overheads):+.1f}..{max(overheads):+.1f}; target within 10%: {overhead <= 10})"
    )
    return 0 if not any(pa.failures or pb.failures for pa, pb in pairs) else 1


if __name__ == "__main__":
    sys.exit(main())
