"""Children of the local stack stop on their own when the stack is gone.

The stack's emulator and workers run in sessions of their own (so that a Ctrl-C reaches the
stack only, which stops them in order); nothing would stop them if the stack itself died
(SIGKILL, a crash, a closed terminal). Each of them therefore holds a *lifeline* to the stack's
process (:func:`hold`):

* a watcher thread that learns when that process is gone: through a pidfd where Linux has one
  (``os.pidfd_open``: readable once the process has exited, immune to pid reuse), else by
  polling its existence every :data:`POLL_SECONDS`;
* on Linux, for a direct child started by a thread that lives as long as its parent, the kernel's
  parent-death signal as well (``prctl(PR_SET_PDEATHSIG)``, :func:`set_parent_death_signal`).

When the lifeline breaks, the process sends itself ``sig`` (a worker drains on SIGTERM, the
emulator ends) and, if it is still there ``grace`` seconds later, exits with
:data:`EXIT_ORPHANED`.

``python -m asyncinfer.local.lifeline --pid PID [--grace S] MODULE ARGS...`` runs ``python -m
MODULE ARGS...`` holding a lifeline to ``PID`` (the stack's cold workers start this way).
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import ctypes.util
import os
import runpy
import select
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

#: How often a process's existence is polled where no pidfd is available, seconds.
POLL_SECONDS = 0.25
#: The exit status of a process that ended because its lifeline broke.
EXIT_ORPHANED = 70
#: ``PR_SET_PDEATHSIG`` of ``<linux/prctl.h>``.
_PR_SET_PDEATHSIG = 1


def process_exists(pid: int | None) -> bool:
    """Whether process ``pid`` exists and is not a zombie (``/proc``; elsewhere
    ``kill(pid, 0)``)."""
    if pid is None:
        return False
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    except OSError:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True
    return stat.rsplit(")", 1)[-1].split()[0] not in ("Z", "X")


def start_ticks(pid: int) -> int | None:
    """When process ``pid`` started, in clock ticks since boot (``/proc/<pid>/stat`` field 22),
    or ``None`` where that is unknown: with the pid, it names one process even after the pid is
    reused."""
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def set_parent_death_signal(sig: int) -> bool:
    """Ask Linux to send ``sig`` to this process when the thread that started it exits
    (``prctl(PR_SET_PDEATHSIG, sig)``, through ctypes; kept across ``exec``, cleared by
    ``fork``). Returns whether it applied (``False`` elsewhere than Linux)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        return int(libc.prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False


def wait_gone(pid: int, stop: threading.Event | None = None) -> bool:
    """Block until process ``pid`` has exited (``True``), or ``stop`` is set (``False``)."""
    fd: int | None = None
    with contextlib.suppress(AttributeError, OSError):
        fd = os.pidfd_open(pid)  # type: ignore[attr-defined,unused-ignore]
    if fd is None:
        while process_exists(pid):
            if stop is not None and stop.wait(POLL_SECONDS):
                return False
            if stop is None:
                time.sleep(POLL_SECONDS)
        return True
    try:
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        while not poller.poll(int(POLL_SECONDS * 1000)):
            if stop is not None and stop.is_set():
                return False
        return True
    finally:
        os.close(fd)


def watch(pid: int, on_gone: Callable[[], None], name: str = "lifeline") -> threading.Thread:
    """Call ``on_gone()`` in a daemon thread once process ``pid`` has exited; returns the
    (started) thread."""

    def run() -> None:
        if wait_gone(pid):
            on_gone()

    thread = threading.Thread(target=run, name=name, daemon=True)
    thread.start()
    return thread


def _break(sig: int, grace: float) -> None:
    """The lifeline broke: ``sig`` to this process, then exit after ``grace`` seconds."""
    with contextlib.suppress(OSError):
        os.kill(os.getpid(), sig)
    time.sleep(grace)
    os._exit(EXIT_ORPHANED)


def hold(
    pid: int | None,
    *,
    sig: int = signal.SIGTERM,
    grace: float = 2.0,
    pdeathsig: bool = False,
) -> bool:
    """Stop this process when process ``pid`` is gone (see the module docstring).

    Args:
        pid: the process to outlive by no more than ``grace`` seconds (``None``: nothing is
            held).
        sig: what this process sends itself first (SIGTERM: drain and exit; SIGKILL: at once).
        grace: seconds after ``sig`` before ``os._exit(EXIT_ORPHANED)``.
        pdeathsig: also set the parent-death signal (only correct when ``pid`` is the parent
            and the thread that started this process lives as long as it: the signal follows
            the starting *thread*).

    Returns:
        Whether a lifeline is held. If ``pid`` is already gone, the lifeline breaks at once.
    """
    if pid is None or pid <= 0:
        return False
    if pdeathsig and pid == os.getppid():
        set_parent_death_signal(sig)
    # Checked after the prctl: a parent that died before it would never send the signal.
    watch(pid, lambda: _break(sig, grace))
    return True


def main(argv: list[str] | None = None) -> None:
    """``--pid PID [--grace S] MODULE ARGS...``: run ``MODULE`` as ``__main__`` with
    ``ARGS`` while holding a lifeline to ``PID`` (SIGTERM first, exit after ``S`` seconds)."""
    parser = argparse.ArgumentParser(prog="python -m asyncinfer.local.lifeline")
    parser.add_argument("--pid", type=int, required=True)
    parser.add_argument("--grace", type=float, default=2.0)
    parser.add_argument("module")
    parser.add_argument("args", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    hold(args.pid, sig=signal.SIGTERM, grace=args.grace, pdeathsig=False)
    sys.argv = [args.module, *args.args]
    runpy.run_module(args.module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main(sys.argv[1:])
