"""OpenAI batch expansion and finalization at scale (issue 15, items 3 and 7). Prints figures;
not a test.

A chat batch of ``--lines`` lines (default 50,000) for the ``echo`` model, on a moto server (the
local stack's emulator, a process of its own) or with ``--inprocess`` on moto in this process
(with the emulator's DynamoDB and SQS patches, :mod:`asyncinfer.local.emulator`):

1. create: the file uploaded, ``POST /batches`` through :class:`BatchService`;
2. expand: the batch queue fed to the expander's Lambda handler, one message per invocation as
   its event source mapping does (batch size 1), each with a Lambda context of the function's
   timeout from :mod:`asyncinfer.core.topology` (``--timeout`` to try another): the figures
   are the validation, the time per chunk, lines/s, the invocations needed and the longest one
   against the timeout;
3. a worker stand-in ends every line job ``succeeded`` (UpdateItem transitions and the jobs'
   events in PublishBatch calls; the worker's own cost is ``bench/worker_throughput.py``'s);
4. count and finalize: the batch-events queue fed to the counter's handler (batch size 10, the
   topology's) until the batch ends: lines counted per second and the finalization's time.

AWS requests per phase are counted (:mod:`bench.aws_counter`); with the moto server, the CPU
seconds the emulator used too (on a laptop it shares the cores; in AWS it is not ours).

    .venv/bin/python bench/batch_expansion.py                 # 50,000 lines on a moto server
    .venv/bin/python bench/batch_expansion.py --lines 2000 --profile
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import math
import os
import pstats
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
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
    "POWERTOOLS_TRACE_DISABLED": "true",
    "POWERTOOLS_METRICS_DISABLED": "true",
    "POWERTOOLS_LOG_LEVEL": "WARNING",
}.items():
    os.environ.setdefault(_k, _v)

TENANT = "bench-tenant"
MODEL = "echo"


@dataclass
class Phase:
    """One phase's figures."""

    name: str
    wall: float = 0.0
    cpu: float = 0.0
    emulator_cpu: float = 0.0
    requests: dict[str, int] = field(default_factory=dict)
    profile: str = ""


class Env:
    """The AWS side: a moto server (or moto in process) with the service's resources."""

    def __init__(self, inprocess: bool) -> None:
        from asyncinfer.core.settings import Settings
        from asyncinfer.local.resources import create_resources
        from bench.aws_counter import AwsRequestCounter

        self.server: Any = None
        self.mock: Any = None
        if inprocess:
            from moto import mock_aws

            from asyncinfer.local.emulator import patch_dynamodb, patch_sqs_reads

            patch_dynamodb()
            patch_sqs_reads()  # and patch_sqs_sends: as the emulator's main()
            self.mock = mock_aws()
            self.mock.start()
            base = Settings(region="us-east-1")
        else:
            from asyncinfer.local.emulator import start_emulator
            from asyncinfer.local.stack import free_port, wait_http

            port = free_port()
            self.server = start_emulator(port)
            endpoint = f"http://127.0.0.1:{port}"
            wait_http(endpoint + "/moto-api/", 60)
            os.environ["AWS_ENDPOINT_URL"] = endpoint
            base = Settings(endpoint_url=endpoint, region="us-east-1")
        self.counter = AwsRequestCounter()
        self.counter.install()
        res = create_resources(base, [MODEL], prefix="bexp", event_log=False)
        for k, v in res.env().items():
            os.environ[k] = v
        self.settings = res.settings(base)

    def emulator_cpu(self) -> float:
        """CPU seconds the moto server's process has used (``/proc``; 0 in process)."""
        if self.server is None:
            return 0.0
        try:
            stat = Path(f"/proc/{self.server.pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            return 0.0
        return (int(stat[11]) + int(stat[12])) / os.sysconf("SC_CLK_TCK")

    @contextmanager
    def phase(self, name: str, phases: list[Phase], profile: bool) -> Iterator[Phase]:
        """Time a phase (wall, this process's CPU, the emulator's CPU, AWS requests)."""
        ph = Phase(name)
        self.counter.reset()
        prof = cProfile.Profile() if profile else None
        e0, c0, t0 = self.emulator_cpu(), time.process_time(), time.perf_counter()
        if prof is not None:
            prof.enable()
        try:
            yield ph
        finally:
            if prof is not None:
                prof.disable()
                out = io.StringIO()
                pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(18)
                ph.profile = out.getvalue()
            ph.wall = time.perf_counter() - t0
            ph.cpu = time.process_time() - c0
            ph.emulator_cpu = self.emulator_cpu() - e0
            ph.requests = dict(self.counter.snapshot())
            phases.append(ph)

    def stop(self) -> None:
        self.counter.uninstall()
        if self.mock is not None:
            self.mock.stop()
        if self.server is not None:
            self.server.terminate()
            self.server.wait(timeout=20)


def chat_lines(n: int) -> bytes:
    """A batch file of ``n`` chat requests for the echo model."""
    return b"".join(
        json.dumps(
            {
                "custom_id": f"req-{i}",
                "method": "POST",
                "url": "/v1/chat/completions",
                "body": {"model": MODEL, "messages": [{"role": "user", "content": f"line {i}"}]},
            }
        ).encode()
        + b"\n"
        for i in range(n)
    )


@dataclass
class LambdaContext:
    """The part of the Lambda context the handlers read: the time left of ``timeout`` s."""

    timeout: float
    started: float = field(default_factory=time.monotonic)

    def get_remaining_time_in_millis(self) -> int:
        return max(0, int((self.timeout - (time.monotonic() - self.started)) * 1000))


def feed(
    sqs: Any, url: str, handler: Callable[[dict[str, Any], Any], Any], size: int, timeout: float
) -> float | None:
    """One invocation: up to ``size`` messages of ``url`` to ``handler`` (deleting those it did
    not report failed). Returns its wall time, or ``None`` when the queue was empty."""
    from asyncinfer.local.event_source import pump_once

    t0 = time.perf_counter()
    n = pump_once(sqs, url, lambda ev: handler(ev, LambdaContext(timeout)), 0, size)
    return time.perf_counter() - t0 if n else None


def end_jobs(settings: Any, job_ids: list[str]) -> None:
    """The worker stand-in: each job queued -> running -> succeeded (conditional UpdateItems),
    then the jobs' events, PublishBatch 10 a call."""
    from asyncinfer.core.timeutil import iso, now
    from asyncinfer.jobs.events import EventPublisher
    from asyncinfer.jobs.store import JobStore

    store, events = JobStore(settings), EventPublisher(settings)
    output = json.dumps({"text": "ok", "usage": {"prompt_tokens": 3, "completion_tokens": 2}})

    def end(job_id: str) -> dict[str, Any]:
        running = store.transition(
            job_id,
            from_status="queued",
            to_status="running",
            increment_attempts=True,
            set_fields={"started_at": iso(now())},
        )
        return store.transition(
            job_id,
            from_status="running",
            to_status="succeeded",
            attempts=running["attempts"],
            set_fields={"completed_at": iso(now()), "output": output},
        )

    with ThreadPoolExecutor(max_workers=8) as pool:
        for i in range(0, len(job_ids), 200):
            ended = list(pool.map(end, job_ids[i : i + 200]))
            groups = [ended[j : j + 10] for j in range(0, len(ended), 10)]
            list(pool.map(events.publish_many, groups))


def progress(text: str) -> None:
    """A progress line on stderr."""
    print(f"[{time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    from asyncinfer.core import topology

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--lines", type=int, default=50_000)
    p.add_argument("--inprocess", action="store_true", help="moto in this process")
    p.add_argument(
        "--timeout",
        type=float,
        default=float(topology.FUNCTIONS["openai_batches"].timeout_seconds),
        help="the expander's Lambda timeout, seconds (default: the topology's)",
    )
    p.add_argument("--chunk", type=int, default=0, help="lines per chunk (default: the setting's)")
    p.add_argument("--profile", action="store_true", help="cProfile each phase (this process)")
    p.add_argument("--skip-finalize", action="store_true", help="expansion only")
    args = p.parse_args(argv)
    if args.chunk:
        os.environ["ASYNCINFER_BATCH_CHUNK"] = str(args.chunk)

    env = Env(args.inprocess)
    try:
        return run(env, args)
    finally:
        env.stop()


def run(env: Env, args: argparse.Namespace) -> int:
    from asyncinfer.aws import clients
    from asyncinfer.core import topology
    from asyncinfer.core.settings import get_settings
    from asyncinfer.openai_api import expansion, finalize
    from asyncinfer.openai_api.batch_store import TERMINAL, BatchStore
    from asyncinfer.openai_api.batches import BatchService, parse_request
    from asyncinfer.openai_api.files import FileStore

    get_settings.cache_clear()
    expansion._expander.cache_clear()
    settings = get_settings()
    sqs = clients.client("sqs", settings)
    store = BatchStore(settings)
    phases: list[Phase] = []
    chunk_times: list[float] = []
    invocations: list[float] = []
    validate_time: list[float] = []
    finalize_time: list[float] = []

    def timed(target: Any, name: str, sink: list[float]) -> None:
        original = getattr(target, name)

        def wrapper(*a: Any, **kw: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return original(*a, **kw)
            finally:
                sink.append(time.perf_counter() - t0)

        setattr(target, name, wrapper)

    timed(expansion.Expander, "expand_chunk", chunk_times)
    timed(expansion.Expander, "validate", validate_time)
    timed(finalize, "finalize", finalize_time)
    timed(expansion, "finalize", finalize_time)

    n = args.lines
    with env.phase("create", phases, args.profile):
        data = chat_lines(n)
        files = FileStore(clients.client("s3", settings), settings.bucket)
        fid = files.create(TENANT, data, filename="in.jsonl", purpose="batch")["id"]
        batch = BatchService(settings).create(
            TENANT,
            parse_request({"input_file_id": fid, "endpoint": "/v1/chat/completions"}),
        )
    batch_id = batch["id"]
    exp_size = topology.FUNCTIONS["openai_batches"].sqs_trigger().batch_size
    with env.phase("expand", phases, args.profile):
        while True:
            rec = store.get(batch_id) or {}
            if rec.get("expanded") or rec.get("status") in TERMINAL:
                break
            took = feed(sqs, settings.batch_queue_url, expansion.handler, exp_size, args.timeout)
            if took is not None:
                invocations.append(took)
                progress(
                    f"expander invocation {len(invocations)}: {took:.1f} s, "
                    f"{len(chunk_times)} chunks"
                )
    rec = store.get(batch_id) or {}
    if rec.get("status") != "in_progress" or int(rec.get("next_line", 0)) != n:
        print(f"expansion did not finish: {rec.get('status')} next_line={rec.get('next_line')}")
        return 1

    if not args.skip_finalize:
        with env.phase("worker stand-in", phases, args.profile):
            ids = [str(ln["line_job"]) for ln in store.lines(batch_id) if ln.get("line_job")]
            progress(f"ending {len(ids)} jobs")
            end_jobs(settings, ids)
        cnt_size = topology.FUNCTIONS["openai_batch_counter"].sqs_trigger().batch_size
        cnt_timeout = float(topology.FUNCTIONS["openai_batch_counter"].timeout_seconds)
        counter_calls: list[float] = []
        with env.phase("count + finalize", phases, args.profile):
            while (store.get(batch_id) or {}).get("status") not in TERMINAL:
                took = feed(
                    sqs, settings.batch_events_queue_url, finalize.handler, cnt_size, cnt_timeout
                )
                if took is not None:
                    counter_calls.append(took)
                    if len(counter_calls) % 50 == 0:
                        progress(f"counter invocation {len(counter_calls)}")
        rec = store.get(batch_id) or {}

    report(args, n, rec, phases, chunk_times, invocations, validate_time, finalize_time, env)
    return 0


def report(
    args: argparse.Namespace,
    n: int,
    rec: dict[str, Any],
    phases: list[Phase],
    chunk_times: list[float],
    invocations: list[float],
    validate_time: list[float],
    finalize_time: list[float],
    env: Env,
) -> None:
    from asyncinfer.openai_api.expansion import RESERVE_SECONDS

    where = "moto in process" if args.inprocess else "a moto server (the local stack's emulator)"
    print(f"# batch expansion: {n} chat lines, echo model, {where}")
    print(f"# {os.cpu_count()} CPUs; expander timeout {args.timeout:.0f} s")
    for ph in phases:
        reqs = sum(ph.requests.values())
        print(
            f"{ph.name:>18}: {ph.wall:8.1f} s wall, {ph.cpu:7.1f} s CPU here, "
            f"{ph.emulator_cpu:7.1f} s CPU emulator, {reqs} AWS requests"
            f" ({reqs / max(1, n):.2f}/line)"
        )
        top = sorted(ph.requests.items(), key=lambda kv: -kv[1])[:8]
        print("                    " + ", ".join(f"{k} {v}" for k, v in top))
    expand = next(p for p in phases if p.name == "expand")
    if validate_time:
        print(f"validation (read + check {n} lines + write chunks): {validate_time[0]:.1f} s")
    if chunk_times:
        chunk = int(rec.get("chunk_lines") or 0)
        srt = sorted(chunk_times)
        print(
            f"chunks: {len(chunk_times)} of {chunk} lines; per chunk median "
            f"{srt[len(srt) // 2]:.2f} s, max {srt[-1]:.2f} s "
            f"({chunk / srt[len(srt) // 2]:.0f} lines/s per chunk)"
        )
    print(f"expansion: {n / expand.wall:.0f} lines/s overall ({expand.wall:.1f} s)")
    budget = args.timeout - min(RESERVE_SECONDS, args.timeout / 3)
    longest = max(invocations) if invocations else 0.0
    print(
        f"expander invocations: {len(invocations)} (budget {budget:.0f} s each; needed at this "
        f"rate: {math.ceil(expand.wall / budget)}); longest {longest:.1f} s of the "
        f"{args.timeout:.0f} s timeout: {'OK' if longest < args.timeout else 'OVER THE TIMEOUT'}"
    )
    if finalize_time:
        print(f"finalization (files written, batch ended): {max(finalize_time):.1f} s")
    if rec:
        print(
            f"batch {rec.get('status')}: total {rec.get('total')}, completed "
            f"{rec.get('completed')}, failed {rec.get('failed')}"
        )
    for ph in phases:
        if ph.profile:
            print(f"\n--- profile: {ph.name} (this process, by own time) ---")
            print("\n".join(ph.profile.splitlines()[:40]))


if __name__ == "__main__":
    raise SystemExit(main())
