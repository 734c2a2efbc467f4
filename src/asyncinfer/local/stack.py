"""``asyncinfer local``: the whole service on this machine.

It starts the AWS emulator (moto server) on 127.0.0.1, creates the queues, dead-letter queues,
table, bucket and topic as the CDK app does, serves the API through :mod:`.gateway` (the same
Lambda handler, fed API Gateway proxy events), runs worker processes per model, feeds the DLQ
handler with the SQS events its Lambda would get, and prints one line per job event (read from an
SQS queue subscribed to the topic, as a user's subscription would). SIGINT or SIGTERM stops every
process it started within 15 s; workers release their jobs first (:mod:`.shutdown`: what cannot
finish in time is abandoned, and the stack says what and exits non-zero). Its children stop on
their own if the stack dies (:mod:`.lifeline`), and a new stack notices a stale one on its state
directory (:mod:`.stale`).

Emulator state is in memory: stopping the stack forgets every job.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

from asyncinfer.aws import clients
from asyncinfer.core import envvars as ev
from asyncinfer.core import logs, topology
from asyncinfer.core.errors import CatalogueError
from asyncinfer.core.settings import Settings
from asyncinfer.functions.sweeper import sweep
from asyncinfer.local import shutdown
from asyncinfer.local.autoscaler import LocalAutoscaler, sqs_queue_counts
from asyncinfer.local.emulator import start_emulator
from asyncinfer.local.event_source import pump_once
from asyncinfer.local.faults import FAULTS_FILE
from asyncinfer.local.gateway import LocalGateway
from asyncinfer.local.lambda_runtime import LambdaPool
from asyncinfer.local.resources import Resources, create_resources
from asyncinfer.local.stale import StateDirInUse, check_state_dir, process_record
from asyncinfer.local.warm import WarmStarter, WorkerProcess, forkserver_available
from asyncinfer.models.registry import MODELS, use_catalogue
from asyncinfer.scaling.policy import ScalingConfig

log = logging.getLogger("asyncinfer.local")


def emit_line(line: str) -> None:
    """Write ``line`` and its newline to stdout in one write, then flush. Workers share this
    stdout: ``print`` (unbuffered, as under ``PYTHONUNBUFFERED=1``) writes the text and the
    newline separately, and a worker's log line written in between was glued onto an event
    line (``... attempts=1`` + ``2026-12-01 ...``), which misled readers of the event log."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


DLQ_HANDLER = "asyncinfer.functions.dlq:handler"
WEBHOOK_HANDLER = "asyncinfer.functions.webhook_dispatcher:handler"
BATCH_HANDLER = "asyncinfer.openai_api.expansion:handler"
BATCH_EVENTS_HANDLER = "asyncinfer.openai_api.finalize:handler"
#: Seconds a worker gets between SIGTERM and SIGKILL when the stack stops.
WORKER_STOP_SECONDS = 9.0


def event_line(event: dict[str, Any]) -> str:
    """The stack's terminal line of one event of the topic: a job event (api.md, "Events":
    ``{"type", "timestamp", "data": <job>}``) or a batch event (openai.md, "Events": OpenAI's
    ``{"object": "event", "type", "created_at", "data": {"id"}}``). Raises ``KeyError`` /
    ``TypeError`` for anything else."""
    if event.get("object") == "event":
        when = datetime.fromtimestamp(int(event["created_at"]), tz=UTC)
        return f"{when.strftime('%Y-%m-%dT%H:%M:%SZ')} {event['type']:<14} {event['data']['id']}"
    job = event["data"]
    extra = f" error={job['error'].get('code')}" if job.get("error") else ""
    return (
        f"{event['timestamp']} {event['type']:<14} {job['id']} "
        f"model={job['model']} attempts={job['attempts']}{extra}"
    )


@dataclass(kw_only=True)
class LocalOptions:
    """Options of ``asyncinfer local`` (spec, "The local stack")."""

    port: int = 8000
    #: The model catalogue (``--models-file``); default: the one :data:`MODELS` reads (the
    #: project's ``models.yaml``, or ``ASYNCINFER_MODELS_FILE``). Workers and the API get it
    #: through ``ASYNCINFER_MODELS_FILE``.
    models_file: Path | None = None
    models: list[str] = field(default_factory=lambda: list(MODELS))
    max_workers: int = 1
    state_dir: Path = Path(".asyncinfer")
    extra_keys: list[str] = field(default_factory=list)
    visibility_timeout: int = 30
    max_receive_count: int = 3
    drain_seconds: float = 4.0
    #: Autoscaling (asyncinfer.scaling.policy): workers per model go between ``min_workers`` and
    #: ``max_workers``; to ``min_workers`` after ``idle_seconds`` without jobs.
    min_workers: int = 0
    idle_seconds: float = 60.0
    backlog_per_worker: float = 1.0
    scale_interval: float = 0.5
    #: ``--max-batch-size`` of each worker (default: the model's).
    worker_max_batch_size: int | None = None
    #: Workers' ReceiveMessage WaitTimeSeconds. Short, because a stopping worker waits for its
    #: last long poll (to release what it returns), and scale-in and Ctrl-C should be quick.
    worker_receive_wait: int = 2
    #: Fork workers from a fork server that has imported torch and transformers once
    #: (:mod:`asyncinfer.local.warm`; ready in ~1 s instead of ~4.5 s); ``False`` starts each as
    #: a new ``python -m asyncinfer.worker``, as the ECS container does.
    warm_workers: bool = True


def free_port() -> int:
    """A free TCP port on 127.0.0.1."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _new_key() -> tuple[str, str]:
    """``(key value, key id)`` shaped like API Gateway's (40 and 10 characters)."""
    alphabet = "abcdefghijklmnopqrstuvwxyz0123456789"
    key_id = "".join(secrets.choice(alphabet) for _ in range(10))
    return secrets.token_urlsafe(30)[:40], key_id


class LocalStack:
    """The running local stack. :meth:`start`, then :meth:`wait` until a signal, then
    :meth:`stop`."""

    def __init__(self, opts: LocalOptions) -> None:
        try:
            catalogue = use_catalogue(opts.models_file) if opts.models_file else MODELS.catalogue
        except CatalogueError as exc:
            raise SystemExit(f"asyncinfer local: {exc}") from None
        assert catalogue is not None
        self.models_file = catalogue.path
        unknown = [m for m in opts.models if m not in MODELS]
        if unknown:
            raise SystemExit(f"unknown model(s) {unknown}; known: {sorted(MODELS)}")
        no_worker = [m for m in opts.models if not MODELS[m].handler]
        if no_worker:
            raise SystemExit(f"model(s) {no_worker} are of a kind with no worker in this build")
        self.opts = opts
        self.stop_event = threading.Event()
        #: Set by a second signal: the stop cuts its remaining waits short.
        self.hurry = threading.Event()
        #: Whether ``local.json`` is this stack's (written by it): only then does stop remove it.
        self.owns_local_json = False
        #: The clock of the stop in progress or done (:meth:`stop`).
        self.stop_clock = shutdown.StopClock(self.hurry)
        #: ``time.monotonic()`` of the first SIGINT/SIGTERM: the stop's budget counts from it.
        self.signalled_at: float | None = None
        self.autoscaler: LocalAutoscaler | None = None
        self.warm: WarmStarter | None = None
        self.moto: subprocess.Popen[bytes] | None = None
        self.pool: LambdaPool | None = None
        self.gateway: LocalGateway | None = None
        self.resources: Resources | None = None
        self.env: dict[str, str] = {}
        self.api_key, self.api_key_id = _new_key()
        self.extra = {name: _new_key() for name in opts.extra_keys}

    # ------------------------------------------------------------------ start
    def start(self) -> dict[str, Any]:
        """Start everything; returns the ``local.json`` document (``{}`` if a signal came
        first). Raises :class:`~asyncinfer.local.stale.StateDirInUse` (a ``SystemExit``) before
        starting anything when another stack runs on the state directory or the port is taken;
        a stale ``local.json`` is reported on stderr and replaced."""
        opts = self.opts
        opts.state_dir.mkdir(parents=True, exist_ok=True)
        for note in check_state_dir(opts.state_dir, opts.port):
            print(f"asyncinfer local: {note}", file=sys.stderr, flush=True)
        moto_port = free_port()
        endpoint = f"http://127.0.0.1:{moto_port}"
        faults_file = (
            opts.state_dir / FAULTS_FILE if Settings.from_env().local_emulator_faults else None
        )
        self.moto = start_emulator(
            moto_port, stderr=(opts.state_dir / "moto.log").open("wb"), faults_file=faults_file
        )
        if opts.warm_workers and forkserver_available():
            self.warm = WarmStarter()
            self.warm.start()  # imports torch and transformers while the rest starts
        if not wait_http(endpoint + "/moto-api/", 30, stop=self.stop_event):
            return {}
        base_env = {
            ev.AWS_ENDPOINT_URL: endpoint,
            ev.AWS_REGION: "us-east-1",
            ev.AWS_DEFAULT_REGION: "us-east-1",
            ev.AWS_ACCESS_KEY_ID: "local",
            ev.AWS_SECRET_ACCESS_KEY: "local",
            ev.LOCAL: "1",
            ev.VISIBILITY_TIMEOUT: str(opts.visibility_timeout),
            ev.MAX_RECEIVE_COUNT: str(opts.max_receive_count),
            ev.DRAIN_SECONDS: str(opts.drain_seconds),
            ev.MODELS_FILE: str(self.models_file or ""),
            "POWERTOOLS_SERVICE_NAME": "asyncinfer-local",
            "POWERTOOLS_LOG_LEVEL": "WARNING",
            "POWERTOOLS_TRACE_DISABLED": "true",
            "POWERTOOLS_METRICS_DISABLED": "true",
            "POWERTOOLS_METRICS_NAMESPACE": "asyncinfer",
        }
        # This process talks to the emulator too (resources, DLQ feed, event log).
        os.environ.update(base_env)
        settings = Settings.from_env()
        clients.reset()
        self.resources = create_resources(settings, opts.models)
        self.env = {**base_env, **self.resources.env()}
        self.settings = Settings.from_env({**os.environ, **self.env})

        self.pool = LambdaPool(self.env, size=8)
        keys = {self.api_key: self.api_key_id, **{v: i for v, i in self.extra.values()}}
        try:
            self.gateway = LocalGateway(self.pool, keys, opts.port)
        except OSError as exc:  # taken since check_state_dir looked
            raise StateDirInUse(f"cannot listen on 127.0.0.1:{opts.port}: {exc}") from None
        self.gateway.start()

        # Workers: none at start; the autoscaler runs the scaling policy (and replaces dead ones).
        self.autoscaler = LocalAutoscaler(
            models=opts.models,
            config=ScalingConfig(
                backlog_per_worker=opts.backlog_per_worker,
                idle_seconds=opts.idle_seconds,
                min_workers=opts.min_workers,
                max_workers=opts.max_workers,
            ),
            spawn=self._spawn_worker,
            queue_counts=sqs_queue_counts(
                clients.client("sqs", self.settings),
                {m: self.settings.priority_queues(m) for m in opts.models},
            ),
            busy_dir=opts.state_dir / "workers",
            interval=opts.scale_interval,
        )
        self.autoscaler.start()
        threading.Thread(target=self._event_log_loop, name="events", daemon=True).start()
        threading.Thread(target=self._dlq_loop, name="dlq", daemon=True).start()
        threading.Thread(target=self._sweep_loop, name="sweeper", daemon=True).start()
        threading.Thread(target=self._webhook_loop, name="webhooks", daemon=True).start()
        for url, target, code in (
            (self.resources.batch_queue, BATCH_HANDLER, "openai_batches"),
            (self.resources.batch_events_queue, BATCH_EVENTS_HANDLER, "openai_batch_counter"),
        ):
            name = topology.FUNCTIONS[code].sqs_trigger().queue
            threading.Thread(
                target=self._queue_loop, args=(url, target, name, code), name=name, daemon=True
            ).start()

        doc = {
            "api_url": self.gateway.url,
            "api_key": self.api_key,
            "api_key_id": self.api_key_id,
            "aws_endpoint_url": endpoint,
            "region": "us-east-1",
            "queues": self.resources.queues,
            "dead_letter_queues": self.resources.dlqs,
            "webhook_queue": self.resources.webhook_queue,
            "webhook_dead_letter_queue": self.resources.webhook_dlq,
            "batch_queue": self.resources.batch_queue,
            "batch_events_queue": self.resources.batch_events_queue,
            "table": self.resources.table,
            "bucket": self.resources.bucket,
            "topic_arn": self.resources.topic_arn,
            "extra_keys": {name: value for name, (value, _id) in self.extra.items()},
            "extra_key_ids": {name: key_id for name, (_v, key_id) in self.extra.items()},
            "models": opts.models,
            "pid": os.getpid(),
            # What a later stack on this state directory checks (asyncinfer.local.stale).
            "stack": process_record(os.getpid()),
            "processes": {
                "emulator": process_record(self.moto.pid),
                **({"fork_server": process_record(pid)} if (pid := self.fork_server_pid()) else {}),
            },
        }
        path = opts.state_dir / "local.json"
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(doc, indent=2))
        os.replace(tmp, path)
        self.owns_local_json = True
        if not wait_http(self.gateway.url + "/v1/health", 60, stop=self.stop_event):
            return doc
        if self.warm is not None:
            # "ready" means a job's worker starts in about a second: the imports are done.
            self.warm.wait_ready(stop=self.stop_event)
        return doc

    def fork_server_pid(self) -> int | None:
        """The warm workers' fork server's pid, if there is one."""
        return self.warm.server_pid() if self.warm is not None else None

    def _spawn_worker(self, model: str, busy_file: Path) -> WorkerProcess:
        batch = self.opts.worker_max_batch_size
        argv = ["--model", model] + (["--max-batch-size", str(batch)] if batch else [])
        env = {
            **os.environ,
            **self.env,
            "PYTHONUNBUFFERED": "1",
            ev.BUSY_FILE: str(busy_file),
            ev.RECEIVE_WAIT: str(self.opts.worker_receive_wait),
        }
        proc: WorkerProcess
        if self.warm is not None:
            proc = self.warm.spawn(argv, env)  # holds a lifeline to this process
        else:
            # ``python -m asyncinfer.worker`` holding a lifeline to the stack: it is started by
            # the autoscaler's thread, so the parent-death signal (which follows threads) cannot
            # serve.
            lifeline_argv = ["-m", "asyncinfer.local.lifeline", "--pid", str(os.getpid())]
            proc = subprocess.Popen(
                [sys.executable, *lifeline_argv, "asyncinfer.worker", *argv],
                env=env,
                start_new_session=True,  # Ctrl-C reaches the stack, which stops workers in order
            )
        log.info("worker started: model=%s pid=%s warm=%s", model, proc.pid, self.warm is not None)
        return proc

    # ------------------------------------------------------------------ background loops
    def _event_log_loop(self) -> None:
        while not self.stop_event.is_set():
            try:
                self._print_events(wait=1)
            except Exception:
                if self.stop_event.is_set():
                    return
                time.sleep(1)

    def _print_events(self, wait: int) -> int:
        """Print one line per job event waiting in the event-log queue; returns how many."""
        assert self.resources is not None
        sqs = clients.client("sqs", self.settings)
        url = self.resources.event_log_queue
        resp = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=wait)
        msgs = resp.get("Messages", [])
        for m in msgs:
            try:
                emit_line(event_line(json.loads(m["Body"])))
            except (ValueError, KeyError, TypeError, AttributeError):
                log.warning("unreadable event: %.200s", m.get("Body"))
        if msgs:
            sqs.delete_message_batch(
                QueueUrl=url,
                Entries=[
                    {"Id": str(n), "ReceiptHandle": m["ReceiptHandle"]} for n, m in enumerate(msgs)
                ],
            )
        return len(msgs)

    def _sweep_loop(self) -> None:
        """The sweeper (expiry, lease takeover, lost hand-backs, pending events: one
        :func:`~asyncinfer.functions.sweeper.sweep`, each step isolated) every
        ``Settings.sweep_seconds`` (a scheduled Lambda in AWS)."""
        while not self.stop_event.wait(self.settings.sweep_seconds):
            try:
                sweep(self.settings)
            except Exception:
                log.exception("sweep failed")

    def _dlq_loop(self) -> None:
        """Feed each dead-letter queue's messages to the DLQ Lambda handler as SQS events."""
        assert self.resources is not None and self.pool is not None
        sqs = clients.client("sqs", self.settings)
        pool = self.pool
        while not self.stop_event.is_set():
            for url in self.resources.dlqs.values():
                if self.stop_event.is_set():
                    return
                try:
                    pump_once(
                        sqs,
                        url,
                        lambda ev: pool.invoke(DLQ_HANDLER, ev, "dlq"),
                        batch_size=topology.FUNCTIONS["dlq"].sqs_trigger().batch_size,
                    )
                except Exception:
                    if self.stop_event.is_set():
                        return
                    log.exception("DLQ handler failed")
                    time.sleep(1)

    def _webhook_loop(self) -> None:
        """Feed the webhook queue's messages to the webhook dispatcher Lambda handler as SQS
        events, as the event source mapping does in AWS (see asyncinfer.local.event_source)."""
        assert self.resources is not None and self.pool is not None
        pool, url = self.pool, self.resources.webhook_queue
        sqs = clients.client("sqs", self.settings)
        while not self.stop_event.is_set():
            try:
                pump_once(
                    sqs,
                    url,
                    lambda ev: pool.invoke(WEBHOOK_HANDLER, ev, "webhooks"),
                    batch_size=topology.FUNCTIONS["webhooks"].sqs_trigger().batch_size,
                )
            except Exception:
                if self.stop_event.is_set():
                    return
                log.exception("webhook dispatcher failed")
                time.sleep(1)

    def _queue_loop(self, url: str, target: str, name: str, code: str) -> None:
        """Feed a queue's messages to a Lambda handler as SQS events (the OpenAI batch expander
        and the batch-line counter), as their event source mappings do in AWS, with the batch
        size of the function ``code``'s trigger in the topology."""
        assert self.pool is not None
        pool = self.pool
        sqs = clients.client("sqs", self.settings)
        size = topology.FUNCTIONS[code].sqs_trigger().batch_size
        while not self.stop_event.is_set():
            try:
                pump_once(sqs, url, lambda ev: pool.invoke(target, ev, name), batch_size=size)
            except Exception:
                if self.stop_event.is_set():
                    return
                log.exception("%s handler failed", name)
                time.sleep(1)

    # ------------------------------------------------------------------ stop
    def install_signal_handlers(self, *, watchdog: bool = False) -> None:
        """SIGINT and SIGTERM set :attr:`stop_event` (main thread only); a second one sets
        :attr:`hurry` (the stop cuts its waits short). Installed before :meth:`start`, so that a
        signal while the stack starts still ends in :meth:`stop` instead of leaving the emulator
        and the fork server behind. The stop's clock starts at the first signal; with
        ``watchdog``, so does a :class:`~asyncinfer.local.shutdown.Watchdog` that ends this
        process (children first) whatever :meth:`start` or :meth:`stop` is then blocked in."""

        def on_signal(*_: Any) -> None:
            if self.stop_event.is_set():
                self.hurry.set()
                return
            self.signalled_at = time.monotonic()
            self.stop_event.set()
            if watchdog:
                shutdown.start_watchdog(self)

        signal.signal(signal.SIGINT, on_signal)
        signal.signal(signal.SIGTERM, on_signal)

    def wait(self) -> None:
        """Block until SIGINT or SIGTERM (or :attr:`stop_event` set otherwise)."""
        self.stop_event.wait()

    def stop(self) -> list[str]:
        """Stop everything within :data:`~asyncinfer.local.shutdown.STOP_SECONDS` of the first
        signal (:func:`asyncinfer.local.shutdown.stop_stack` has the order and the budget).
        Returns what had to be abandoned (empty when everything finished in time)."""
        self.stop_event.set()
        self.stop_clock = shutdown.StopClock(self.hurry, started=self.signalled_at)
        return shutdown.stop_stack(self, self.stop_clock, worker_seconds=WORKER_STOP_SECONDS)

    def print_last_events(self, seconds: float) -> None:
        """Print the events still in the event-log queue (the workers' last: jobs released back
        to queued), for at most ``seconds``."""

        def drain() -> None:
            try:
                while self._print_events(wait=0) and not self.hurry.is_set():
                    pass
            except Exception:
                log.warning("could not read the last events")

        reader = threading.Thread(target=drain, name="last-events", daemon=True)
        reader.start()
        reader.join(seconds)


def wait_http(url: str, timeout: float, *, stop: threading.Event | None = None) -> bool:
    """Return ``True`` once ``url`` answers HTTP (any status), ``False`` as soon as ``stop`` is
    set; ``RuntimeError`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        if stop is not None and stop.is_set():
            return False
        try:
            httpx.get(url, timeout=2)
            return True
        except httpx.HTTPError:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{url} did not answer within {timeout}s") from None
            time.sleep(0.1)


def run_local(opts: LocalOptions) -> int:
    """Start the stack, print the ready line, serve until a signal, stop. Returns 0, or
    :data:`~asyncinfer.local.shutdown.EXIT_ABANDONED` when the stop had to abandon work (it
    says what on stderr). A watchdog started with the first signal (or the stop) ends the
    process, children included, should the start, the stop or the interpreter's exit hooks
    overrun (never cancelled: it dies with the process)."""
    logs.setup("local")
    stack = LocalStack(opts)
    stack.install_signal_handlers(watchdog=True)
    abandoned: list[str] = []
    try:
        doc = stack.start()
        if not stack.stop_event.is_set():  # a signal during start: straight to stop
            for name, value in doc["extra_keys"].items():
                print(f"asyncinfer local: extra key {name}={value}", flush=True)
            print(f"asyncinfer local: ready api={doc['api_url']} key={doc['api_key']}", flush=True)
            stack.wait()
    finally:
        if stack.signalled_at is None:  # stopping for another reason (start failed)
            shutdown.start_watchdog(stack)
        abandoned = stack.stop()
    return shutdown.report(abandoned, stack.stop_clock)
