"""A pool of local "Lambda instances": processes that each import a handler and serve one event at
a time, as Lambda execution environments do. Powertools' resolver keeps the current event in class
state, so concurrent requests need separate processes, as in AWS.

:meth:`LambdaPool.close` takes a deadline: invocations still running then (a webhook receiver
answering one byte a second, a long poll) are abandoned, their processes killed, and reported.
Each instance holds a lifeline to the pool's process (:mod:`asyncinfer.local.lifeline`) and ends
at once if that process dies."""

from __future__ import annotations

import contextlib
import importlib
import itertools
import multiprocessing
import os
import signal
import threading
import time
import uuid
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from asyncinfer.local import lifeline


@dataclass
class LocalContext:
    """The parts of the Lambda context object that handlers and Powertools read."""

    function_name: str = "asyncinfer-local"
    function_version: str = "$LATEST"
    memory_limit_in_mb: int = 1024
    aws_request_id: str = field(default_factory=lambda: str(uuid.uuid4()))
    invoked_function_arn: str = "arn:aws:lambda:us-east-1:123456789012:function:asyncinfer-local"
    log_group_name: str = "/aws/lambda/asyncinfer-local"
    log_stream_name: str = "local"
    timeout_seconds: float = 30.0
    started: float = field(default_factory=time.monotonic)

    def get_remaining_time_in_millis(self) -> int:
        """Milliseconds left of the invocation's timeout."""
        return max(0, int((self.timeout_seconds - (time.monotonic() - self.started)) * 1000))


_handlers: dict[str, Any] = {}


def _init(env: dict[str, str], owner: int) -> None:
    # Ctrl-C goes to the whole process group; the stack, not each instance, decides to stop.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # Started by whichever thread first needed it: no parent-death signal (it follows threads).
    lifeline.hold(owner, sig=signal.SIGKILL, grace=0.0, pdeathsig=False)
    os.environ.update(env)


def _invoke(target: str, function_name: str, event: dict[str, Any]) -> Any:
    if target not in _handlers:
        module, _, attr = target.partition(":")
        _handlers[target] = getattr(importlib.import_module(module), attr)
    return _handlers[target](event, LocalContext(function_name=function_name))


def describe(function_name: str, event: dict[str, Any]) -> str:
    """A one-line description of an invocation, for the stop report: ``api GET /v1/jobs/x
    ?wait=20`` (an API Gateway event) or ``webhooks (3 records)`` (an SQS event)."""
    if "httpMethod" in event:
        query = "&".join(f"{k}={v}" for k, v in (event.get("queryStringParameters") or {}).items())
        return f"{function_name} {event['httpMethod']} {event.get('path')}" + (
            f"?{query}" if query else ""
        )
    records = event.get("Records")
    if isinstance(records, list):
        return f"{function_name} ({len(records)} record{'s' * (len(records) != 1)})"
    return function_name


def is_probe(event: dict[str, Any]) -> bool:
    """Whether an invocation is a health probe (``GET``/``HEAD /v1/health``): it changes nothing,
    so one cut off by the stop is not reported as abandoned work (the stack's own readiness
    probe is in flight during a start on a busy machine)."""
    return event.get("httpMethod") in ("GET", "HEAD") and event.get("path") == "/v1/health"


class LambdaPool:
    """Invokes handlers (``"module:function"``) in up to ``size`` worker processes.

    Args:
        env: environment variables of the functions (the Lambda's configuration).
        size: the most concurrent invocations (the reserved concurrency, if you like).
    """

    def __init__(self, env: dict[str, str], size: int = 8) -> None:
        self._pool = ProcessPoolExecutor(
            max_workers=size,
            mp_context=multiprocessing.get_context("spawn"),
            initializer=_init,
            initargs=(env, os.getpid()),
        )
        self._lock = threading.Lock()
        self._ids = itertools.count()
        #: Invocations submitted and not finished: id -> (description, monotonic start).
        self._running: dict[int, tuple[str, float]] = {}
        #: Those of :attr:`_running` that are health probes (:func:`is_probe`).
        self._probes: set[int] = set()

    def invoke(self, target: str, event: dict[str, Any], function_name: str = "api") -> Any:
        """Run ``target(event, context)`` in a pool process and return its result. Raises what
        the handler raised, ``RuntimeError`` once :meth:`close` began, and
        ``concurrent.futures.process.BrokenProcessPool`` for an invocation abandoned by it."""
        key = next(self._ids)
        with self._lock:
            self._running[key] = (describe(function_name, event), time.monotonic())
            if is_probe(event):
                self._probes.add(key)
        try:
            future: Future[Any] = self._pool.submit(_invoke, target, function_name, event)
            return future.result()
        finally:
            with self._lock:
                self._running.pop(key, None)
                self._probes.discard(key)

    def running(self) -> list[tuple[str, float]]:
        """The invocations in progress: ``(description, seconds running)``, oldest first."""
        now = time.monotonic()
        with self._lock:
            items = sorted(self._running.values(), key=lambda item: item[1])
        return [(what, now - started) for what, started in items]

    def close(self, timeout: float | None = None, cut: threading.Event | None = None) -> list[str]:
        """Stop the processes: invocations not started are cancelled, those in progress get
        until ``timeout`` seconds (``None``: for ever) or until ``cut`` is set (a second signal);
        any still running then is abandoned, its process killed. Returns the abandoned
        invocations' descriptions (with their run time), health probes (:func:`is_probe`) left
        out."""
        # The executor's own dict of processes (its manager thread keeps it), taken before
        # shutdown drops the executor's reference to it.
        processes: dict[int, Any] = getattr(self._pool, "_processes", None) or {}
        self._pool.shutdown(wait=False, cancel_futures=True)
        deadline = None if timeout is None else time.monotonic() + timeout
        while self._running and (deadline is None or time.monotonic() < deadline):
            if cut is not None and cut.is_set():
                break
            time.sleep(0.05)
        cut_off = bool(self._running)
        now = time.monotonic()
        with self._lock:
            work = [v for k, v in self._running.items() if k not in self._probes]
        abandoned = [
            f"{what}, running for {now - started:.1f} s"
            for what, started in sorted(work, key=lambda item: item[1])
        ]
        live: list[Any] = []
        with contextlib.suppress(RuntimeError):  # changed size meanwhile: nothing to wait for
            live = list(processes.values())
        if cut_off:
            for process in live:
                with contextlib.suppress(Exception):
                    process.kill()
        end = time.monotonic() + 1.0
        for process in live:
            with contextlib.suppress(Exception):
                process.join(timeout=max(0.0, end - time.monotonic()))
                if process.is_alive():
                    process.kill()
                    process.join(timeout=0.2)
        return abandoned
