"""The overhead of the ``openai-server`` bridge (issue 16). Prints figures; not a test.

The same generation jobs for ``smollm2-135m-instruct`` (greedy, mixed prompts, ``max_new_tokens``
fixed so both runs generate the same tokens) run two ways, each with the model loaded first and
the same concurrency:

a. **in-process**: the causal-lm handler's ``serve`` loop over the jobs (our engine, continuous
   batching at ``--concurrency``);
b. **bridge**: the ``openai-server`` handler (:mod:`asyncinfer.models.openai_server.handler`)
   over the same jobs, ``--concurrency`` streaming requests in flight against
   ``asyncinfer serve-openai`` (a process of its own on a loopback port, the same engine at the
   same batch size), as the worker feeds a sidecar engine.

Overhead = (bridge / in-process - 1) x 100 (target <= 10%), in wall time and in CPU time. Queue
and AWS costs are the same for both paths and left out: this is the cost of the HTTP hop, the SSE
parsing and the server's threads.

A shared, loaded machine makes one round's wall time swing widely (single rounds on the loaded
2-core CI machine ranged from -86% to +142%), so the two paths are **interleaved** over
``--rounds`` rounds (a b, b a, a b, ...: drift in the machine's load falls on both alike) and
the report gives, per path, the **median** and the spread (min..max) over rounds of the wall
time per job, and of the **CPU seconds** spent: for (a) this process's CPU time
(``time.process_time``: the engine runs in it), for (b) this process's (the bridge's client)
plus the engine process's (``/proc/<pid>/stat`` utime + stime). CPU time counts the work done,
not the time waited for a core another program held, so it moves much less with other load.
(b)'s CPU is printed split too, client and engine. Each round also prints the engine's decoding
steps and mean rows per step (:data:`asyncinfer.models.engine.runner.COUNTS`: this process's
for (a), the ``asyncinfer_engine_decode_*`` counters of serve-openai's ``/metrics`` for (b)):
the same jobs in more, smaller steps cost more wall and CPU time whatever the HTTP hop costs.

    .venv/bin/python bench/engine_bridge.py                  # 64 jobs x 4 rounds (minutes)
    .venv/bin/python bench/engine_bridge.py --jobs 8 --max-new-tokens 16 --rounds 4

Both runs use the entry's ``device: auto``: on a host with CUDA the engine runs on the GPU.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx

from asyncinfer.local.stack import free_port
from asyncinfer.models.base import WorkItem
from asyncinfer.models.catalogue import parse_catalogue
from asyncinfer.models.engine.runner import COUNTS
from asyncinfer.models.openai_server.protocol import gauge
from asyncinfer.models.registry import MODELS, spec_of
from asyncinfer.models.schemas import GenerationInput

QUESTIONS = [
    "What is the capital of France?",
    "Name three primary colours.",
    "Write a haiku about the sea.",
    "Explain what a queue is in one sentence.",
    "Give me a short tip for learning to cook.",
    "What is two plus two?",
    "Describe a cat to someone who has never seen one.",
    "Why is the sky blue?",
]


class ListSource:
    """A WorkSource over a fixed list of items."""

    def __init__(self, items: list[WorkItem]) -> None:
        self.todo = list(items)
        self.done: dict[str, Any] = {}
        self.lock = threading.Lock()

    @property
    def stopping(self) -> bool:
        return not self.todo

    def take(self, max_items: int, timeout: float) -> list[WorkItem]:
        with self.lock:
            out, self.todo = self.todo[:max_items], self.todo[max_items:]
        return out

    def finish(self, item: WorkItem, result: Any) -> None:
        self.done[item.job_id] = result


def jobs(n: int, max_new_tokens: int) -> list[WorkItem]:
    out = []
    for i in range(n):
        q = QUESTIONS[i % len(QUESTIONS)] + (" Please answer briefly." * (i % 3))
        inp = GenerationInput(
            messages=[{"role": "user", "content": q}],  # type: ignore[list-item]
            max_new_tokens=max_new_tokens,
        )
        out.append(WorkItem(job_id=f"job_{i:03d}", input=inp))
    return out


def run(handler: Any, items: list[WorkItem], concurrency: int) -> tuple[float, int]:
    """``(wall seconds, completion tokens)`` of ``items`` through ``handler.serve``."""
    source = ListSource(items)
    t0 = time.perf_counter()
    handler.serve(source, concurrency)
    wall = time.perf_counter() - t0
    bad = [r for r in source.done.values() if not isinstance(r, dict)]
    assert not bad and len(source.done) == len(items), bad[:3]
    tokens = sum(int(r["usage"]["completion_tokens"]) for r in source.done.values())
    return wall, tokens


def start_engine(concurrency: int) -> tuple[subprocess.Popen[bytes], str]:
    """``asyncinfer serve-openai`` on a free loopback port, once ready: ``(process, url)``."""
    port = free_port()
    exe = Path(sys.executable).parent / "asyncinfer"
    cmd = [str(exe), "serve-openai", "--model", "smollm2-135m-instruct", "--port", str(port)]
    cmd += ["--max-batch-size", str(concurrency)]
    engine = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 300
    while True:
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return engine, url
        except httpx.HTTPError:
            pass
        assert time.monotonic() < deadline and engine.poll() is None, "engine did not start"
        time.sleep(0.3)


class Round:
    """One path's run in one round: wall seconds, CPU seconds (``cpu`` = ``client`` + ``engine``:
    this process's and the engine process's), completion tokens, decoding steps and rows
    decoded (their ratio is the mean batch size)."""

    def __init__(
        self, wall: float, client: float, engine: float, tokens: int, steps: int, rows: int
    ) -> None:
        self.wall, self.client, self.engine, self.tokens = wall, client, engine, tokens
        self.cpu = client + engine
        self.steps, self.rows = steps, rows

    def batch(self) -> float:
        """Mean rows per decoding step."""
        return self.rows / self.steps if self.steps else 0.0


def process_cpu(pid: int) -> float:
    """CPU seconds (user + system) process ``pid`` has used so far (Linux ``/proc``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def decode_counts(url: str | None) -> tuple[int, int]:
    """``(decoding steps, rows decoded)`` so far: of this process's engine, or of the engine at
    ``url`` (its ``/metrics``)."""
    if url is None:
        return COUNTS.steps, COUNTS.rows
    page = httpx.get(url + "/metrics", timeout=10).text
    steps = gauge(page, "asyncinfer_engine_decode_steps_total") or 0.0
    rows = gauge(page, "asyncinfer_engine_decode_rows_total") or 0.0
    return int(steps), int(rows)


def measured(
    handler: Any, n: int, tokens: int, concurrency: int, engine: tuple[int, str] | None
) -> Round:
    """Run ``n`` jobs through ``handler``; CPU of this process, plus the engine's if given
    (``(pid, url)``), and the decoding steps of the engine that ran them."""
    url = engine[1] if engine else None
    steps0, rows0 = decode_counts(url)
    cpu0 = time.process_time()
    eng0 = process_cpu(engine[0]) if engine else 0.0
    wall, done = run(handler, jobs(n, tokens), concurrency)
    client = time.process_time() - cpu0
    eng = process_cpu(engine[0]) - eng0 if engine else 0.0
    steps1, rows1 = decode_counts(url)
    return Round(wall, client, eng, done, steps1 - steps0, rows1 - rows0)


def spread(values: list[float]) -> str:
    """``median (min..max)`` of ``values``."""
    return f"{statistics.median(values):8.3f} ({min(values):.3f}..{max(values):.3f})"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--jobs", type=int, default=64)
    p.add_argument("--max-new-tokens", type=int, default=48)
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument(
        "--rounds", "--repeat", type=int, default=4, help="rounds of both paths, interleaved"
    )
    args = p.parse_args()
    # A SIGTERM (a timeout) ends the run through the finally below, which stops the engine.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    direct = MODELS["smollm2-135m-instruct"].load_handler()
    direct.load()
    engine, url = start_engine(args.concurrency)
    try:
        cat = parse_catalogue(
            {
                "models": [
                    {
                        "id": "bridge",
                        "kind": "openai-server",
                        "max_batch_size": args.concurrency,
                        "engine": {"url": url, "model": "smollm2-135m-instruct"},
                    }
                ]
            }
        )
        bridge = spec_of(cat.models[0], cat).load_handler()
        bridge.load()
        while not bridge.ready():
            time.sleep(0.05)
        print(
            f"{args.jobs} jobs, {args.max_new_tokens} new tokens, concurrency "
            f"{args.concurrency}, {args.rounds} rounds interleaved; {os.cpu_count()} CPUs"
        )
        run(direct, jobs(min(4, args.jobs), 4), args.concurrency)  # warm-up
        run(bridge, jobs(min(4, args.jobs), 4), args.concurrency)
        a: list[Round] = []
        b: list[Round] = []
        for r in range(args.rounds):
            order = ("a", "b") if r % 2 == 0 else ("b", "a")
            for path in order:
                if path == "a":
                    a.append(
                        measured(direct, args.jobs, args.max_new_tokens, args.concurrency, None)
                    )
                else:
                    b.append(
                        measured(
                            bridge,
                            args.jobs,
                            args.max_new_tokens,
                            args.concurrency,
                            (engine.pid, url),
                        )
                    )
            wall_pct = (b[-1].wall / a[-1].wall - 1) * 100
            cpu_pct = (b[-1].cpu / a[-1].cpu - 1) * 100
            print(
                f"round {r + 1} ({' '.join(order)}): a {a[-1].wall:7.2f} s {a[-1].cpu:7.2f} cpu-s"
                f"  b {b[-1].wall:7.2f} s {b[-1].cpu:7.2f} cpu-s"
                f" (client {b[-1].client:.2f} + engine {b[-1].engine:.2f})"
                f"  wall {wall_pct:+.1f}%  cpu {cpu_pct:+.1f}%\n"
                f"    decoding steps / mean batch: a {a[-1].steps} / {a[-1].batch():.2f}"
                f"  b {b[-1].steps} / {b[-1].batch():.2f}",
                flush=True,
            )
    finally:
        engine.terminate()
        engine.wait(30)
    n = args.jobs
    print("per job, median (min..max) over rounds:")
    for name, rs in (("a. in-process", a), ("b. bridge    ", b)):
        print(
            f"  {name}: wall {spread([x.wall / n for x in rs])} s"
            f"  cpu {spread([x.cpu / n for x in rs])} s  {rs[-1].tokens} tokens"
            f"  steps {spread([float(x.steps) for x in rs])}"
        )
    print(
        f"  b's cpu per job: client {spread([x.client / n for x in b])} s"
        f"  engine {spread([x.engine / n for x in b])} s"
    )
    walls = [(y.wall / x.wall - 1) * 100 for x, y in zip(a, b, strict=True)]
    cpus = [(y.cpu / x.cpu - 1) * 100 for x, y in zip(a, b, strict=True)]
    print(
        f"bridge overhead (target <= 10%), median (min..max) of the rounds' pairs:\n"
        f"  wall {statistics.median(walls):+.1f}% ({min(walls):+.1f}..{max(walls):+.1f})\n"
        f"  cpu  {statistics.median(cpus):+.1f}% ({min(cpus):+.1f}..{max(cpus):+.1f})"
    )
    if a[-1].tokens != b[-1].tokens:
        print(f"note: token counts differ ({a[-1].tokens} vs {b[-1].tokens}): stop strings or EOS")
    return 0


if __name__ == "__main__":
    sys.exit(main())
