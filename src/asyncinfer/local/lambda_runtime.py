"""A pool of local "Lambda instances": processes that each import a handler and serve one event at
a time, as Lambda execution environments do. Powertools' resolver keeps the current event in class
state, so concurrent requests need separate processes, as in AWS."""

from __future__ import annotations

import importlib
import multiprocessing
import os
import signal
import time
import uuid
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from typing import Any


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


def _init(env: dict[str, str]) -> None:
    # Ctrl-C goes to the whole process group; the stack, not each instance, decides to stop.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    os.environ.update(env)


def _invoke(target: str, function_name: str, event: dict[str, Any]) -> Any:
    if target not in _handlers:
        module, _, attr = target.partition(":")
        _handlers[target] = getattr(importlib.import_module(module), attr)
    return _handlers[target](event, LocalContext(function_name=function_name))


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
            initargs=(env,),
        )

    def invoke(self, target: str, event: dict[str, Any], function_name: str = "api") -> Any:
        """Run ``target(event, context)`` in a pool process and return its result."""
        return self._pool.submit(_invoke, target, function_name, event).result()

    def close(self) -> None:
        """Stop the processes (pending invocations are cancelled)."""
        self._pool.shutdown(wait=True, cancel_futures=True)
