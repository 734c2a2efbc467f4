"""Worker throughput, side by side (issue 6). Prints figures; not a test.

The same 64 generation jobs for ``smollm2-135m-instruct`` (mixed prompt lengths,
``max_new_tokens`` 16..128, half greedy and half sampled with a seed; the job list comes from a
fixed seed) run four ways:

a. a Celery worker with a Redis broker, as the seeds describe it: one job per task, prefetch 1,
   acks late, ``--pool solo`` (Redis from Debian's ``redis-server``, installed with apt-get if
   missing; Celery installed into the venv with pip if missing; both on 127.0.0.1, stopped after);
b. our worker on a moto server (the local stack's emulator), batching off (max batch 1), the jobs
   submitted from a process of their own (``bench/submitter.py``), as the API Lambda's are;
c. our worker, continuous batching at the model's ``max_batch_size`` (or ``--batch``);
d. the model alone, offline, through the same batching engine at the batch size c used.

Each run starts with the model loaded; its window runs from the first submit to the last job's
terminal state. AWS requests per job are counted with a botocore ``after-call`` hook on every
client of the API path and the worker (idle ReceiveMessage polls excluded). The time a worker
takes to be ready (``worker ready`` logged) with the cached checkpoint is measured too: as a new
process (as an ECS task starts) and as a fork of the local stack's warm fork server.

    .venv/bin/python bench/worker_throughput.py              # everything (~15 min on 2 cores)
    .venv/bin/python bench/worker_throughput.py --jobs 8 --max-new-tokens 24 --skip a
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "src"))
for _k, _v in {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_REGION": "us-east-1",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "TOKENIZERS_PARALLELISM": "false",
}.items():
    os.environ.setdefault(_k, _v)

MODEL = "smollm2-135m-instruct"

TOPICS = [
    "the water cycle",
    "how a bicycle stays upright",
    "the history of the printing press",
    "why the sky is blue",
    "how vaccines work",
    "the rules of chess",
    "what a compiler does",
    "the causes of the seasons",
    "how bees make honey",
    "the French Revolution",
    "how a refrigerator works",
    "the life cycle of a star",
]
CONTEXT = (
    "You are helping a student prepare for an exam. The student has read the textbook chapter "
    "twice but still finds the topic confusing, especially the parts that connect cause and "
    "effect. They asked for a clear explanation in plain language, with one concrete example "
    "and a short summary they can memorise. Keep the tone friendly and avoid jargon unless "
    "you explain it right away. "
)


def make_jobs(n: int, max_new_cap: int, seed: int = 1234) -> list[dict[str, Any]]:
    """``n`` job inputs: short, medium and long prompts; max_new_tokens 16..128 (capped)."""
    rng = random.Random(seed)
    jobs = []
    for i in range(n):
        topic = rng.choice(TOPICS)
        kind = i % 3
        if kind == 0:
            content = f"Explain {topic}."
        elif kind == 1:
            content = f"In a few sentences, explain {topic} and give one example."
        else:
            content = CONTEXT * rng.randint(1, 3) + f"The topic is {topic}."
        inp: dict[str, Any] = {
            "messages": [{"role": "user", "content": content}],
            "max_new_tokens": min(max_new_cap, rng.randint(16, 128)),
        }
        if i % 2:
            inp.update(temperature=0.7, top_p=0.9, seed=rng.randint(0, 2**31))
        else:
            inp["temperature"] = 0.0
        jobs.append(inp)
    return jobs


@dataclass
class RunResult:
    name: str
    seconds: float
    latencies: list[float]
    tokens: int
    aws_per_job: float | None = None
    aws_breakdown: dict[str, float] = field(default_factory=dict)
    failures: int = 0

    @property
    def jobs_per_s(self) -> float:
        return len(self.latencies) / self.seconds

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds

    def pct(self, q: float) -> float:
        xs = sorted(self.latencies)
        return xs[min(len(xs) - 1, max(0, round(q * (len(xs) - 1))))]


# --------------------------------------------------------------------------- (a) Celery
def ensure_celery_and_redis() -> str:
    """Install what is missing; returns the path of ``redis-server``."""
    redis = shutil.which("redis-server")
    if redis is None:
        print("installing redis-server (apt-get)...", flush=True)
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        subprocess.run(["apt-get", "install", "-y", "redis-server"], check=False, env=env)
        redis = shutil.which("redis-server")
        if redis is None:
            subprocess.run(["apt-get", "update"], check=True, env=env)
            subprocess.run(["apt-get", "install", "-y", "redis-server"], check=True, env=env)
            redis = shutil.which("redis-server")
    try:
        import celery  # noqa: F401
        import redis as _redis  # noqa: F401
    except ImportError:
        print("installing celery[redis] (pip)...", flush=True)
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "celery[redis]"], check=True)
    assert redis is not None
    return redis


def run_celery(jobs: list[dict[str, Any]]) -> RunResult:
    from asyncinfer.local.stack import free_port

    redis_bin = ensure_celery_and_redis()
    port = free_port()
    url = f"redis://127.0.0.1:{port}/0"
    redis_proc = subprocess.Popen(
        [redis_bin, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    os.environ["BENCH_REDIS_URL"] = url
    env = {**os.environ, "PYTHONPATH": f"{ROOT}:{ROOT / 'src'}"}
    worker = subprocess.Popen(
        [
            str(Path(sys.executable).parent / "celery"),
            "-A",
            "bench.celery_app",
            "worker",
            "--pool",
            "solo",
            "--concurrency",
            "1",
            "--prefetch-multiplier",
            "1",
            "--loglevel",
            "WARNING",
            "--without-gossip",
            "--without-mingle",
            "--without-heartbeat",
        ],
        cwd=ROOT,
        env=env,
    )
    try:
        from bench.celery_app import generate

        # Warm-up: the worker is up and the model loaded before the window opens.
        generate.apply_async(args=[{**jobs[0], "max_new_tokens": 2}]).get(timeout=300)
        t0 = time.time()
        submitted = []
        for inp in jobs:
            submitted.append((time.time(), generate.apply_async(args=[inp])))
        results = [(ts, r.get(timeout=3600)) for ts, r in submitted]
        end = max(res["ended"] for _, res in results)
        return RunResult(
            name="a. Celery + Redis, one job per task",
            seconds=end - t0,
            latencies=[res["ended"] - ts for ts, res in results],
            tokens=sum(res["tokens"] for _, res in results),
        )
    finally:
        worker.send_signal(signal.SIGTERM)
        try:
            worker.wait(timeout=30)
        except subprocess.TimeoutExpired:
            worker.kill()
        redis_proc.terminate()
        redis_proc.wait(timeout=10)


# --------------------------------------------------------------------------- (b), (c) our worker
class Stack:
    """A moto server with the model's queues, table, bucket and topic; AWS calls counted."""

    def __init__(self) -> None:
        from asyncinfer.local.emulator import start_emulator
        from asyncinfer.local.stack import free_port, wait_http
        from bench.aws_counter import AwsRequestCounter

        # A process of its own, as on the local stack (not a thread sharing the worker's GIL).
        self.port = free_port()
        self.server = start_emulator(self.port)
        self.endpoint = f"http://127.0.0.1:{self.port}"
        wait_http(self.endpoint + "/moto-api/", 30)
        self.counter = AwsRequestCounter()
        self.counter.install()
        self._n = 0

    def settings(self) -> Any:
        from asyncinfer.core.settings import Settings
        from asyncinfer.local.resources import create_resources

        self._n += 1
        base = Settings(endpoint_url=self.endpoint, region="us-east-1", receive_wait_seconds=20)
        res = create_resources(base, [MODEL], prefix=f"bench{self._n}", event_log=False)
        self.env = {**res.env(), "AWS_ENDPOINT_URL": self.endpoint}
        return res.settings(base)

    def cpu_seconds(self) -> float:
        """CPU time the emulator's process has used so far, seconds (``/proc``; 0 elsewhere):
        on the local stack it shares the worker's cores, unlike AWS's services."""
        try:
            fields = Path(f"/proc/{self.server.pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            return 0.0
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def stop(self) -> None:
        self.counter.uninstall()
        self.server.terminate()
        self.server.wait(timeout=10)


def run_worker(
    stack: Stack, handler: Any, jobs: list[dict[str, Any]], batch: int, name: str
) -> RunResult:
    from asyncinfer.core.errors import WorkerStopping
    from asyncinfer.worker.runner import Worker

    settings = stack.settings()
    done: dict[str, tuple[float, Any]] = {}
    retried: list[str] = []
    all_done = threading.Event()

    class TimedWorker(Worker):
        def finish(self, item: Any, result: Any) -> None:
            super().finish(item, result)
            if getattr(result, "retryable", False) or isinstance(result, WorkerStopping):
                retried.append(item.job_id)  # it comes back for another attempt
                return
            done[item.job_id] = (time.monotonic(), result)
            if len(done) == len(jobs):
                all_done.set()

    worker = TimedWorker(settings.worker, MODEL, handler=handler, max_batch_size=batch)
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    # The API side in a process of its own, as in AWS (the API Lambda) and on the local stack.
    submitter = subprocess.Popen(
        [sys.executable, "-m", "bench.submitter", MODEL],
        env={**os.environ, **stack.env, "PYTHONPATH": f"{ROOT}:{ROOT / 'src'}"},
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    assert submitter.stdin is not None and submitter.stdout is not None
    submitter.stdout.readline()  # ready
    time.sleep(0.5)  # pollers up
    stack.counter.reset()
    cpu0 = stack.cpu_seconds()
    t0 = time.monotonic()
    submitter.stdin.write(json.dumps(jobs) + "\n")
    submitter.stdin.flush()
    submitted: dict[str, float] = {}
    api_counts: dict[str, int] = {}
    for line in submitter.stdout:
        msg = json.loads(line)
        if "counts" in msg:
            api_counts = msg["counts"]
            break
        submitted[msg["id"]] = msg["ts"]
    submitter.wait(timeout=60)
    if len(submitted) != len(jobs):
        raise RuntimeError(f"{name}: the submitter stopped after {len(submitted)} jobs")
    if not all_done.wait(timeout=3600):
        raise RuntimeError(f"{name}: only {len(done)} of {len(jobs)} jobs finished")
    end = max(t for t, _ in done.values())
    emulator_cpu = stack.cpu_seconds() - cpu0
    # The last terminal writes (they wait for the next take) and the last partial
    # DeleteMessageBatch belong to these jobs.
    worker.journal.flush(force=True)
    worker.held.flush_deletes()
    counts = stack.counter.snapshot()
    counts.update(api_counts)
    print(f"{name}: the emulator (moto server) used {emulator_cpu:.1f} CPU s of the two cores")
    worker.request_stop()
    thread.join(timeout=60)
    total = sum(counts.values())
    results = [r for _, r in done.values()]
    return RunResult(
        name=name,
        seconds=end - t0,
        latencies=[done[j][0] - ts for j, ts in submitted.items()],
        tokens=sum(r["usage"]["completion_tokens"] for r in results if isinstance(r, dict)),
        aws_per_job=total / len(jobs),
        aws_breakdown={k: v / len(jobs) for k, v in sorted(counts.items())},
        failures=sum(1 for r in results if not isinstance(r, dict)) + len(retried),
    )


def ready_split(line: str) -> str:
    """``download D, load L`` from a ``worker ready`` line's ``download_seconds`` and
    ``load_seconds`` fields (the time to ready split, issue 13 item 4), or ``""``."""
    import re

    got = dict(re.findall(r"(download|load)_seconds=([0-9.]+)", line))
    return f"download {got['download']}, load {got['load']}" if len(got) == 2 else ""


def measure_ready(stack: Stack, batch: int, splits: list[str] | None = None) -> list[float]:
    """Seconds from ``python -m asyncinfer.worker`` starting (a cold process, as the ECS
    container starts it) to its ``worker ready`` line (whose :func:`ready_split` goes to
    ``splits``)."""
    stack.settings()
    times = []
    for _ in range(2):
        env = {**os.environ, **stack.env, "ASYNCINFER_MAX_BATCH_SIZE": str(batch)}
        t0 = time.monotonic()
        proc = subprocess.Popen(
            [sys.executable, "-m", "asyncinfer.worker", "--model", MODEL],
            env=env,
            stderr=subprocess.PIPE,
            text=True,
            cwd=ROOT,
        )
        assert proc.stderr is not None
        for line in proc.stderr:
            if "worker ready" in line:
                times.append(time.monotonic() - t0)
                if splits is not None:
                    splits.append(ready_split(line))
                break
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
    return times


#: Runs a warm fork server (asyncinfer.local.warm, as the local stack does) in a process whose
#: stderr the bench reads: after the fork server's imports, for each line on stdin it prints
#: "spawn <time.monotonic()>", forks a worker, and on the next line stops it.
_WARM_PROBE = """
import json, signal, sys, time
from asyncinfer.local.warm import WarmStarter
argv, env = json.loads(sys.argv[1]), json.loads(sys.argv[2])
starter = WarmStarter()
starter.wait_ready()
print("warm", file=sys.stderr, flush=True)
while sys.stdin.readline():
    print(f"spawn {time.monotonic()}", file=sys.stderr, flush=True)
    proc = starter.spawn(argv, env)
    sys.stdin.readline()
    proc.send_signal(signal.SIGTERM)
    proc.wait(30)
"""


def measure_ready_warm(stack: Stack, batch: int) -> list[float]:
    """Seconds from the local stack's fork server being asked for a worker
    (:class:`asyncinfer.local.warm.WarmStarter`) to that worker's ``worker ready`` line."""
    stack.settings()
    env = {**os.environ, **stack.env, "ASYNCINFER_MAX_BATCH_SIZE": str(batch)}
    probe = subprocess.Popen(
        [sys.executable, "-c", _WARM_PROBE, json.dumps(["--model", MODEL]), json.dumps(env)],
        env=env,
        stdin=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    assert probe.stdin is not None and probe.stderr is not None
    times: list[float] = []
    try:
        for line in probe.stderr:
            if line.startswith("warm"):
                break
        for _ in range(2):
            probe.stdin.write("\n")
            probe.stdin.flush()
            t0 = None
            for line in probe.stderr:
                if line.startswith("spawn "):
                    t0 = float(line.split()[1])
                elif "worker ready" in line and t0 is not None:
                    times.append(time.monotonic() - t0)
                    break
            probe.stdin.write("\n")
            probe.stdin.flush()
        probe.stdin.close()
        probe.wait(timeout=60)
    finally:
        if probe.poll() is None:
            probe.kill()
    return times


# --------------------------------------------------------------------------- (d) offline
def run_offline(handler: Any, jobs: list[dict[str, Any]], batch: int) -> RunResult:
    from asyncinfer.models.base import WorkItem
    from asyncinfer.models.schemas import GenerationInput

    items = [
        WorkItem(job_id=f"j{i}", input=GenerationInput.model_validate(inp))
        for i, inp in enumerate(jobs)
    ]
    ended: dict[str, tuple[float, Any]] = {}

    class Source:
        def __init__(self) -> None:
            self.todo = list(items)

        @property
        def stopping(self) -> bool:
            return not self.todo

        def take(self, n: int, timeout: float) -> list[WorkItem]:
            out, self.todo = self.todo[:n], self.todo[n:]
            return out

        def finish(self, item: WorkItem, result: Any) -> None:
            ended[item.job_id] = (time.monotonic(), result)

    t0 = time.monotonic()
    handler.serve(Source(), batch)
    end = max(t for t, _ in ended.values())
    results = [r for _, r in ended.values()]
    return RunResult(
        name=f"d. model alone, offline, batch {batch}",
        seconds=end - t0,
        latencies=[t - t0 for t, _ in ended.values()],
        tokens=sum(r["usage"]["completion_tokens"] for r in results if isinstance(r, dict)),
        failures=sum(1 for r in results if not isinstance(r, dict)),
    )


# --------------------------------------------------------------------------- report
def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    import torch
    import transformers

    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return (
        f"{cpu}, {os.cpu_count()} CPUs, {mem:.0f} GiB RAM, torch {torch.__version__} "
        f"({torch.get_num_threads()} threads), transformers {transformers.__version__}, "
        f"Python {platform.python_version()}; load average at start "
        f"{os.getloadavg()[0]:.1f}"
    )


def table(runs: list[RunResult]) -> str:
    lines = [
        "| run | jobs/s | generated tokens/s | p50 latency s | p95 latency s | AWS requests/job |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for r in runs:
        aws = f"{r.aws_per_job:.2f}" if r.aws_per_job is not None else "n/a"
        lines.append(
            f"| {r.name} | {r.jobs_per_s:.3f} | {r.tokens_per_s:.1f} | {r.pct(0.5):.1f} | "
            f"{r.pct(0.95):.1f} | {aws} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=64)
    parser.add_argument("--max-new-tokens", type=int, default=128, help="cap (default 128)")
    parser.add_argument("--batch", type=int, default=None, help="batch size of c and d")
    parser.add_argument("--skip", default="", help="runs to skip, e.g. 'a' or 'ab'")
    args = parser.parse_args(argv)

    import logging

    logging.basicConfig(level=logging.WARNING)
    for noisy in ("werkzeug", "transformers", "botocore"):
        logging.getLogger(noisy).setLevel(logging.ERROR)
    from asyncinfer.models.registry import MODELS

    batch = args.batch or MODELS[MODEL].max_batch_size
    jobs = make_jobs(args.jobs, args.max_new_tokens)
    print(f"machine: {machine()}", flush=True)
    print(f"{len(jobs)} jobs, max_new_tokens sum {sum(j['max_new_tokens'] for j in jobs)}")

    runs: dict[str, RunResult] = {}
    stack = Stack()
    try:
        splits: list[str] = []
        ready = measure_ready(stack, batch, splits)
        warm = measure_ready_warm(stack, batch)
        print(
            f"worker ready after (s): cold process {', '.join(f'{t:.2f}' for t in ready)}; "
            f"forked from the local stack's warm fork server {', '.join(f'{t:.2f}' for t in warm)}",
            flush=True,
        )
        print(f"worker ready split, cold process (s): {'; '.join(splits)}", flush=True)
        handler = MODELS[MODEL].load_handler()
        handler.load()
        if "a" not in args.skip:
            runs["a"] = run_celery(jobs)
            print(table([runs["a"]]), flush=True)
        if "b" not in args.skip:
            runs["b"] = run_worker(stack, handler, jobs, 1, "b. our worker, batching off")
            print(table([runs["b"]]), flush=True)
        if "c" not in args.skip:
            name = f"c. our worker, continuous batching (max {batch})"
            runs["c"] = run_worker(stack, handler, jobs, batch, name)
            print(table([runs["c"]]), flush=True)
        if "d" not in args.skip:
            runs["d"] = run_offline(handler, jobs, batch)
    finally:
        stack.stop()

    print()
    print(table(list(runs.values())))
    for key in ("b", "c"):
        if key in runs:
            parts = ", ".join(f"{k} {v:.2f}" for k, v in runs[key].aws_breakdown.items())
            print(f"AWS requests per job, {key}: {parts}")
    for key, r in runs.items():
        if r.failures:
            print(f"{key}: {r.failures} jobs did not succeed")
    c = runs.get("c")
    if c:
        for other in ("a", "b", "d"):
            if other in runs:
                o = runs[other]
                print(
                    f"c/{other}: {c.jobs_per_s / o.jobs_per_s:.2f}x jobs/s, "
                    f"{c.tokens_per_s / o.tokens_per_s:.2f}x tokens/s"
                )
    targets = []
    if c and "a" in runs:
        targets.append(f"c/a >= 8x jobs/s: {c.jobs_per_s / runs['a'].jobs_per_s >= 8}")
    if c and "d" in runs:
        targets.append(f"c >= 85% of d: {c.jobs_per_s / runs['d'].jobs_per_s >= 0.85}")
    if ready:
        targets.append(f"worker ready within 3 s: cold process {min(ready) <= 3.0}")
    if warm:
        targets.append(f"forked from the warm fork server {max(warm) <= 3.0}")
    if c and c.aws_per_job is not None:
        targets.append(f"AWS requests/job <= 7: {c.aws_per_job <= 7}")
    print("targets: " + "; ".join(targets))
    return 0


if __name__ == "__main__":
    sys.exit(main())
