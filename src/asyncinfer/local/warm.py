"""Warm worker starts for the local stack: workers forked from a process that has already
imported torch, transformers' model code and the worker.

A worker started as a new interpreter (``python -m asyncinfer.worker``, as the ECS container
does) spends ~3.5 s of its start importing torch and transformers' llama modeling before it loads
the cached checkpoint. The local stack starts its workers from zero whenever work arrives, so it
starts them instead from a fork server (the standard library's ``multiprocessing`` ``forkserver``
start method, with :data:`PRELOAD` imported once, when the stack starts): each worker is a fork
of that process, loads its model and is ready in about a second. This is the local stack's
analogue of a warm pool or of Modal's memory snapshots; on AWS a new ECS task still starts cold.

The fork server imports modules only: it runs no torch operation, so no OpenMP thread pool
exists to be copied into a fork, and it holds no model, no client and no socket. Each worker
gets its own session (as ``subprocess.Popen(start_new_session=True)`` gives: Ctrl-C reaches the
stack, which stops the workers in order) and exactly the environment the stack gives it.
"""

from __future__ import annotations

import contextlib
import importlib
import multiprocessing
import multiprocessing.context
import multiprocessing.forkserver
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from typing import Protocol

from asyncinfer.local.lifeline import hold, process_exists

__all__ = ["ForkedWorker", "WarmStarter", "WorkerProcess", "forkserver_available", "process_exists"]

#: What the fork server imports once: every module a worker of the local stack's models would
#: import before it loads a checkpoint (a name that does not import is skipped).
PRELOAD = [
    "torch",
    "transformers",
    "transformers.models.llama.modeling_llama",
    "transformers.models.bert.modeling_bert",
    "accelerate",
    "safetensors.torch",
    "boto3",
    "asyncinfer.worker.runner",
    "asyncinfer.models.kinds.causal_lm",
    "asyncinfer.models.engine",
    "asyncinfer.models.kinds.embeddings",
]


#: Imported by the fork server before :data:`PRELOAD`: it then ends at once if this process dies.
HOLD_MODULE = "asyncinfer.local.forkserver_hold"


class WorkerProcess(Protocol):
    """What the local stack needs of a worker process: the part of ``subprocess.Popen`` it uses."""

    @property
    def pid(self) -> int | None: ...

    @property
    def returncode(self) -> int | None: ...

    def poll(self) -> int | None: ...

    def send_signal(self, sig: int) -> None: ...

    def wait(self, timeout: float | None = None) -> int: ...

    def kill(self) -> None: ...


class ForkedWorker:
    """A worker forked from the fork server, with ``subprocess.Popen``'s interface
    (:class:`WorkerProcess`). ``returncode`` is the exit status, or ``-signal`` for a worker
    killed by a signal, as ``Popen`` reports it.

    The fork server reaps the worker and passes its status on. If the fork server itself is
    gone (killed), ``multiprocessing`` reads no status and reports 255 while the worker may still
    run: the worker then counts as running for as long as its process exists (``/proc``, else
    ``kill(pid, 0)``), and as exited with 255 after.
    """

    def __init__(self, process: multiprocessing.process.BaseProcess) -> None:
        self._process = process

    @property
    def pid(self) -> int | None:
        return self._process.pid

    @property
    def returncode(self) -> int | None:
        return self.poll()

    def poll(self) -> int | None:
        """The exit status, or ``None`` while the worker runs."""
        if self._process.is_alive():
            return None
        code = self._process.exitcode
        if code == _STATUS_LOST and process_exists(self._process.pid):
            return None
        return code

    def send_signal(self, sig: int) -> None:
        """Send ``sig`` to the worker (nothing if it has exited)."""
        if self.poll() is None and self._process.pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self._process.pid, sig)

    def wait(self, timeout: float | None = None) -> int:
        """Wait for the worker to exit; returns its status. Raises
        ``subprocess.TimeoutExpired`` after ``timeout`` seconds."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            code = self.poll()
            if code is not None:
                return code
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(f"worker {self.pid}", timeout or 0)
            self._process.join(0.05)
            if not self._process.is_alive():
                time.sleep(0.05)  # orphaned by a lost fork server: poll its process

    def kill(self) -> None:
        """SIGKILL the worker."""
        self.send_signal(signal.SIGKILL)


#: What ``multiprocessing`` reports for a fork whose status the fork server could not pass on.
_STATUS_LOST = 255


#: What a forked worker runs: ``"module:function"``, called with the worker's argv; it returns
#: the exit status.
WORKER_ENTRY = "asyncinfer.worker.__main__:main"


#: Seconds a forked worker gets to drain (it is sent SIGTERM) once the stack is gone, before it
#: exits on its own (:func:`asyncinfer.local.lifeline.hold`).
ORPHAN_GRACE_SECONDS = 2.0


def _run_worker(entry: str, argv: list[str], env: dict[str, str], lifeline: int | None) -> None:
    """The forked worker's body: its own session, a lifeline to process ``lifeline`` (the
    stack: the worker stops on its own if the stack dies), line-buffered output, exactly
    ``env`` as its environment, then ``entry(argv)``; the process exits with what it returns."""
    os.setsid()
    if lifeline is not None:
        hold(lifeline, sig=signal.SIGTERM, grace=ORPHAN_GRACE_SECONDS, pdeathsig=False)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    for stream in (sys.stdout, sys.stderr):
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None:
            reconfigure(line_buffering=True)
    os.environ.clear()
    os.environ.update(env)
    # torch read OMP_NUM_THREADS when the fork server imported it, from the stack's environment.
    threads = env.get("OMP_NUM_THREADS", "")
    if threads.isdigit() and int(threads) > 0 and "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(int(threads))
    module, _, function = entry.partition(":")
    main = getattr(importlib.import_module(module), function)
    code = main(argv)
    sys.stdout.flush()
    sys.stderr.flush()
    sys.exit(code)


def _nothing() -> None:
    """The body of :meth:`WarmStarter.wait_ready`'s process."""


class WarmStarter:
    """Starts workers as forks of a fork server that has imported :data:`PRELOAD`.

    ``start()`` launches the fork server (it imports in the background: the first worker asked
    for meanwhile waits for those imports, no longer); ``spawn(argv, env)`` forks a worker that
    runs ``python -m asyncinfer.worker`` with the arguments ``argv`` and exactly the environment
    ``env``. The fork server exits when the process that started it does (at once: it holds a
    lifeline to it, :mod:`asyncinfer.local.forkserver_hold`).

    As with any ``multiprocessing`` program, the script that starts the stack must guard its
    entry with ``if __name__ == "__main__":`` (each fork imports it as ``__mp_main__``).

    Args:
        preload: modules the fork server imports (default :data:`PRELOAD`). The fork server is
            one per process: the first ``start`` or ``spawn`` fixes what it imported.

    Raises:
        ValueError: on a platform without the ``forkserver`` start method (not POSIX).
    """

    def __init__(self, preload: list[str] | None = None) -> None:
        self._ctx = multiprocessing.get_context("forkserver")
        self._preload = list(PRELOAD if preload is None else preload)

    def start(self) -> None:
        """Launch the fork server now (it is otherwise launched by the first ``spawn``).

        It is launched ignoring SIGINT: it shares the terminal's process group with the stack,
        and a Ctrl-C during its imports would otherwise end it with a traceback (the stack stops
        on Ctrl-C by itself; the fork server exits when the stack does). Its forks restore the
        default SIGINT handler."""
        # First a lifeline to this process (asyncinfer.local.forkserver_hold), then the imports.
        self._ctx.set_forkserver_preload([HOLD_MODULE, *self._preload])
        if threading.current_thread() is not threading.main_thread():
            multiprocessing.forkserver.ensure_running()
            return
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN)  # inherited across exec
        try:
            multiprocessing.forkserver.ensure_running()
        finally:
            signal.signal(signal.SIGINT, previous)

    def stop(self) -> None:
        """Stop the fork server (SIGKILL), if this process started one: a spawn still waiting for
        it fails instead of forking a worker later. Workers already forked go on; their exit
        status is then read from ``/proc`` (see :class:`ForkedWorker`)."""
        pid = self.server_pid()
        if pid:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

    def server_pid(self) -> int | None:
        """The fork server's pid, if this process started one (and has not seen it stop)."""
        server = multiprocessing.forkserver._forkserver
        pid = getattr(server, "_forkserver_pid", None)
        return int(pid) if pid else None

    def wait_ready(self, stop: threading.Event | None = None) -> bool:
        """Block until the fork server has finished its imports (it forks a process that does
        nothing, and that process exits); returns ``True`` then, or ``False`` as soon as
        ``stop`` is set."""
        self.start()
        done = threading.Event()

        def check() -> None:
            try:
                process = self._ctx.Process(
                    target=_nothing, name="asyncinfer-warm-check", daemon=True
                )
                process.start()
                process.join()
            except Exception:  # the fork server was stopped meanwhile
                pass
            finally:
                done.set()

        threading.Thread(target=check, name="warm-check", daemon=True).start()
        while not done.wait(0.1):
            if stop is not None and stop.is_set():
                return False
        return True

    def spawn(
        self, argv: list[str], env: Mapping[str, str], *, entry: str = WORKER_ENTRY
    ) -> ForkedWorker:
        """Fork a worker: ``entry`` (default: ``asyncinfer.worker``'s ``main``) called with
        ``argv``, under exactly the environment ``env``. The worker holds a lifeline to this
        process: if this process dies, the worker is sent SIGTERM and exits within
        :data:`ORPHAN_GRACE_SECONDS` (it is a child of the fork server, not of this process)."""
        self.start()  # (re)launches the fork server if it is not running
        process = self._ctx.Process(
            target=_run_worker,
            args=(entry, list(argv), dict(env), os.getpid()),
            name="asyncinfer-worker",
            daemon=True,  # stopped if the stack exits without stopping it
        )
        process.start()
        return ForkedWorker(process)


def forkserver_available() -> bool:
    """Whether this platform has the ``forkserver`` start method."""
    return "forkserver" in multiprocessing.get_all_start_methods()
