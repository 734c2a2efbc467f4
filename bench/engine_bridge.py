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

Overhead = (bridge wall time / in-process wall time - 1) x 100 (target <= 10%). Queue and AWS
costs are the same for both paths and left out: this is the cost of the HTTP hop, the SSE
parsing and the server's threads.

    .venv/bin/python bench/engine_bridge.py                  # 64 jobs (a few minutes on 2 cores)
    .venv/bin/python bench/engine_bridge.py --jobs 8 --max-new-tokens 16
    .venv/bin/python bench/engine_bridge.py --jobs 16 --repeat 3     # alternated, best of each

Both runs use the entry's ``device: auto``: on a host with CUDA the engine runs on the GPU.
"""

from __future__ import annotations

import argparse
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


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--jobs", type=int, default=64)
    p.add_argument("--max-new-tokens", type=int, default=48)
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument(
        "--repeat", type=int, default=1, help="rounds of (a, b), alternated; the best of each"
    )
    args = p.parse_args()
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
            f"{args.concurrency}, {args.repeat} round(s)"
        )
        run(direct, jobs(min(4, args.jobs), 4), args.concurrency)  # warm-up
        run(bridge, jobs(min(4, args.jobs), 4), args.concurrency)
        rounds: list[tuple[float, float]] = []
        tok_a = tok_b = 0
        for r in range(args.repeat):
            wall_a, tok_a = run(direct, jobs(args.jobs, args.max_new_tokens), args.concurrency)
            wall_b, tok_b = run(bridge, jobs(args.jobs, args.max_new_tokens), args.concurrency)
            rounds.append((wall_a, wall_b))
            pct = (wall_b / wall_a - 1) * 100
            print(f"round {r + 1}: a {wall_a:7.2f} s  b {wall_b:7.2f} s  {pct:+.1f}%")
    finally:
        engine.terminate()
        engine.wait(30)
    best_a, best_b = min(a for a, _ in rounds), min(b for _, b in rounds)
    print(f"a. in-process : {best_a:7.2f} s  {tok_a} tokens  {tok_a / best_a:7.1f} tokens/s")
    print(f"b. bridge     : {best_b:7.2f} s  {tok_b} tokens  {tok_b / best_b:7.1f} tokens/s")
    print(f"bridge overhead: {(best_b / best_a - 1) * 100:+.1f}% (target <= 10%; best of each)")
    if tok_a != tok_b:
        print(f"note: token counts differ ({tok_a} vs {tok_b}): stop strings or EOS differ")
    return 0


if __name__ == "__main__":
    sys.exit(main())
