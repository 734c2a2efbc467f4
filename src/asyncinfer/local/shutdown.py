"""The local stack's stop, against one clock: everything it started is gone within
:data:`STOP_SECONDS` of SIGINT or SIGTERM (spec ``api.md``, "The local stack"), whatever its
threads are doing.

The budget, counted from the signal (or the start of the stop), in seconds:

* Lambda invocations in progress (an API request, a long poll ``?wait=``, a webhook delivery to a
  receiver that answers one byte a second) get :data:`LAMBDA_STOP_SECONDS`; then their processes
  are killed and the invocations *abandoned*.
* Workers get SIGTERM at once and until the stack's ``WORKER_STOP_SECONDS`` (9) to release
  their jobs and exit; one still running then is killed (SIGKILL) and counted as abandoned.
* The emulator gets SIGTERM, then SIGKILL after :data:`EMULATOR_STOP_SECONDS` (moto server
  waits for its requests' threads, long polls included; its state is forgotten anyway, so this
  abandons nothing).
* A watchdog (:class:`Watchdog`) ends the process at :data:`WATCHDOG_SECONDS` whatever is left,
  killing every child it knows of first, should anything above block.

A second SIGINT or SIGTERM during the stop cuts every remaining wait short (:meth:`StopClock.cut`).
A stop that abandoned something exits with :data:`EXIT_ABANDONED` and prints, on stderr, one line
``asyncinfer local: stopped in S s; abandoned: WHAT; WHAT...``.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from asyncinfer.local.warm import WorkerProcess

if TYPE_CHECKING:
    from asyncinfer.local.stack import LocalStack

log = logging.getLogger("asyncinfer.local")

#: The spec's promise: every process the stack started is gone this long after the signal.
STOP_SECONDS = 15.0
#: When in-flight Lambda invocations are abandoned.
LAMBDA_STOP_SECONDS = 5.0
#: Seconds the emulator gets between SIGTERM and SIGKILL.
EMULATOR_STOP_SECONDS = 1.0
#: When the watchdog ends the process whatever is left.
WATCHDOG_SECONDS = 13.5
#: The exit status of a stop that abandoned work (``asyncinfer local`` exits 0 otherwise).
EXIT_ABANDONED = 3


class StopClock:
    """Deadlines of one stop, counted in seconds from its start (``time.monotonic``).

    Args:
        hurry: set (a second signal) to cut every remaining wait short.
        started: when the stop began (``time.monotonic()``, e.g. the signal's arrival); now
            by default.
    """

    def __init__(
        self, hurry: threading.Event | None = None, *, started: float | None = None
    ) -> None:
        self.started = time.monotonic() if started is None else started
        self.hurry = hurry or threading.Event()

    def elapsed(self) -> float:
        """Seconds since the stop began."""
        return time.monotonic() - self.started

    def left(self, at: float) -> float:
        """Seconds until ``at`` seconds into the stop (0 when past, or hurried)."""
        if self.hurry.is_set():
            return 0.0
        return max(0.0, at - self.elapsed())

    def cut(self) -> None:
        """Make every remaining wait end now."""
        self.hurry.set()

    def wait_until(self, at: float, done: Callable[[], bool], interval: float = 0.05) -> bool:
        """Poll ``done()`` until it is true (returns ``True``) or ``at`` seconds into the stop
        (returns ``done()``)."""
        while not done():
            remaining = self.left(at)
            if remaining <= 0:
                return done()
            self.hurry.wait(min(interval, remaining))
        return True


def stop_workers(procs: Iterable[WorkerProcess], clock: StopClock, at: float) -> list[str]:
    """SIGTERM each of ``procs`` now; SIGKILL those still running ``at`` seconds into the stop
    and wait up to 1 s more for them. Returns what was abandoned (killed, or not even gone after
    SIGKILL), one description each."""
    procs = [p for p in procs if p.poll() is None]
    for p in procs:
        p.send_signal(signal.SIGTERM)
    clock.wait_until(at, lambda: all(p.poll() is not None for p in procs))
    abandoned: list[str] = []
    stubborn = [p for p in procs if p.poll() is None]
    for p in stubborn:
        log.warning("worker %s did not stop; killing it", p.pid)
        p.kill()
    end = time.monotonic() + 1.0
    for p in stubborn:
        try:
            p.wait(timeout=max(0.05, end - time.monotonic()))
            abandoned.append(f"worker pid {p.pid} (killed: still running after SIGTERM)")
        except subprocess.TimeoutExpired:
            abandoned.append(f"worker pid {p.pid} (still there after SIGKILL)")
    return abandoned


def stop_process(proc: subprocess.Popen[bytes], name: str, seconds: float) -> bool:
    """SIGTERM ``proc``, SIGKILL after ``seconds``, wait up to 1 s more. Returns whether it had
    to be killed (for the emulator, whose state is forgotten anyway, that abandons nothing)."""
    if proc.poll() is not None:
        return False
    proc.terminate()
    try:
        proc.wait(timeout=seconds)
        return False
    except subprocess.TimeoutExpired:
        log.info(
            "%s pid %s still running %.0f s after SIGTERM; killing it", name, proc.pid, seconds
        )
        proc.kill()
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=1.0)
    return True


def stop_stack(stack: LocalStack, clock: StopClock, *, worker_seconds: float) -> list[str]:
    """Stop ``stack`` against ``clock`` (the module docstring's budget; workers are killed
    ``worker_seconds`` into the stop): the gateway stops accepting, the pumps stop pumping
    (``stack.stop_event``), workers get SIGTERM, Lambda invocations in progress get
    :data:`LAMBDA_STOP_SECONDS`, then the fork server and the emulator go, and ``local.json``
    if it is the stack's. Returns what had to be abandoned."""
    stack.stop_event.set()
    if stack.moto is None:  # refused to start (or never started): nothing to stop
        return []
    log.info("stopping")
    abandoned: list[str] = []
    if stack.gateway:
        stack.gateway.stop()  # no new request; those in progress end with the pool
    procs: list[WorkerProcess] = []
    if stack.autoscaler is not None:
        stack.autoscaler.stop(timeout=clock.left(2.0))  # no worker starts after this
        procs = stack.autoscaler.processes()
    workers = threading.Thread(
        target=lambda: abandoned.extend(stop_workers(procs, clock, worker_seconds)),
        name="stop-workers",
        daemon=True,
    )
    workers.start()
    if stack.pool:
        abandoned.extend(stack.pool.close(timeout=clock.left(LAMBDA_STOP_SECONDS), cut=clock.hurry))
    workers.join(clock.left(worker_seconds + 1.5))
    if workers.is_alive():
        abandoned.append("stopping the workers (still waiting for them)")
    if stack.resources is not None:
        stack.print_last_events(min(1.5, clock.left(worker_seconds + 2.0)))
    if stack.warm is not None:
        stack.warm.stop()  # a spawn still waiting for it fails instead of forking late
    stop_process(stack.moto, "emulator", EMULATOR_STOP_SECONDS)
    # The emulator's state is gone: so is what local.json pointed at (if this stack wrote it:
    # a stack that refused to start leaves another's alone).
    if stack.owns_local_json:
        (stack.opts.state_dir / "local.json").unlink(missing_ok=True)
    log.info("stopped in %.1f s", clock.elapsed())
    return abandoned


def children(stack: LocalStack) -> list[int]:
    """The pids of every process ``stack`` started that may still run: the emulator, the fork
    server, workers, the Lambda pool's processes."""
    pids = [stack.moto.pid if stack.moto else None, stack.fork_server_pid()]
    if stack.autoscaler is not None:
        pids += [p.pid for p in stack.autoscaler.processes()]
    pids += [process.pid for process in multiprocessing.active_children()]
    return [pid for pid in pids if pid]


def kill_children(stack: LocalStack) -> None:
    """SIGKILL every process of :func:`children` (the watchdog's last resort: no order, no
    waiting)."""
    for pid in children(stack):
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)


def report(abandoned: list[str], clock: StopClock) -> int:
    """Print the stop's outcome and return the exit status: 0, or :data:`EXIT_ABANDONED` after
    the line ``asyncinfer local: stopped in S s; abandoned: ...`` on stderr."""
    if not abandoned:
        return 0
    print(
        f"asyncinfer local: stopped in {clock.elapsed():.1f} s; abandoned: " + "; ".join(abandoned),
        file=sys.stderr,
        flush=True,
    )
    return EXIT_ABANDONED


class Watchdog:
    """Ends the process ``seconds`` after :meth:`start` unless :meth:`cancel` came first: prints
    why on stderr, calls ``kill_children()`` (SIGKILL whatever the stack started), and
    ``os._exit(EXIT_ABANDONED)``. The stop's last resort, should a wait block that the clock
    cannot cut (a thread stuck in a call, an interpreter exit hook)."""

    def __init__(self, seconds: float, kill_children: Callable[[], None]) -> None:
        self._timer = threading.Timer(seconds, self._fire, args=(seconds,))
        self._timer.daemon = True
        self._kill_children = kill_children

    def start(self) -> None:
        """Start counting."""
        self._timer.start()

    def cancel(self) -> None:
        """Stop counting (the stop finished in time)."""
        self._timer.cancel()

    def _fire(self, seconds: float) -> None:
        with contextlib.suppress(Exception):
            print(
                f"asyncinfer local: the stop was not done after {seconds:g} s; killing what is "
                "left and exiting; abandoned: whatever was still running",
                file=sys.stderr,
                flush=True,
            )
        with contextlib.suppress(Exception):
            self._kill_children()
        os._exit(EXIT_ABANDONED)


def start_watchdog(stack: LocalStack, seconds: float = WATCHDOG_SECONDS) -> Watchdog:
    """Start a :class:`Watchdog` that kills ``stack``'s children and ends this process in
    ``seconds``; returns it."""
    dog = Watchdog(seconds, lambda: kill_children(stack))
    dog.start()
    return dog
