"""The local stack's warm worker starts (:mod:`asyncinfer.local.warm`): workers forked from a
fork server get their own session and exactly the environment given, and behave as
``subprocess.Popen`` does for the stack (exit status, signals, wait with a timeout)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from asyncinfer.local.warm import WarmStarter, forkserver_available

pytestmark = pytest.mark.skipif(not forkserver_available(), reason="no forkserver here")

HERE = f"{__name__}"


def report(argv: list[str]) -> int:
    """A worker body: writes its environment, session and parent to ``argv[0]``; exits 3."""
    Path(argv[0]).write_text(
        json.dumps(
            {
                "env": dict(os.environ),
                "sid": os.getsid(0),
                "pid": os.getpid(),
                "modules": sorted(m for m in ("json", "torch") if m in sys.modules),
                "sigint_default": signal.getsignal(signal.SIGINT) is signal.default_int_handler,
            }
        )
    )
    return 3


def sleep_until_term(argv: list[str]) -> int:
    """A worker body: exits 0 on SIGTERM, after writing ``argv[0]``."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    Path(argv[0]).write_text("up")
    time.sleep(60)
    return 1


def ignore_term(argv: list[str]) -> int:
    """A worker body that ignores SIGTERM (the stack then kills it)."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    Path(argv[0]).write_text("up")
    time.sleep(60)
    return 1


def _wait_for(path: Path, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.02)


@pytest.fixture(scope="module")
def starter() -> WarmStarter:
    s = WarmStarter(preload=["json"])
    s.wait_ready()
    return s


def test_fork_gets_exact_env_own_session_and_exit_status(
    starter: WarmStarter, tmp_path: Path
) -> None:
    out = tmp_path / "report.json"
    proc = starter.spawn([str(out)], {"ONLY": "this", "PATH": "/usr/bin"}, entry=f"{HERE}:report")
    assert proc.wait(timeout=30) == 3
    assert proc.returncode == 3 and proc.poll() == 3
    got = json.loads(out.read_text())
    assert got["env"] == {"ONLY": "this", "PATH": "/usr/bin"}
    assert got["sid"] == got["pid"] == proc.pid  # its own session: Ctrl-C goes to the stack only
    assert got["sid"] != os.getsid(0)
    assert got["modules"] == ["json"]  # preloaded; nothing the fork server was not asked for
    assert got["sigint_default"]  # the fork server ignores SIGINT; its forks do not


def test_fork_server_ignores_ctrl_c_during_its_imports(tmp_path: Path) -> None:
    """A Ctrl-C in the stack's terminal reaches the fork server too (same process group), also
    while it is still importing: it goes on and serves forks (the stack stops on Ctrl-C by
    itself)."""
    import multiprocessing.forkserver as fs

    old = fs._forkserver._forkserver_pid  # type: ignore[attr-defined]
    if old:
        os.kill(old, signal.SIGKILL)  # a new fork server, with a slow import to interrupt
        time.sleep(0.3)
    slow = WarmStarter(preload=["json", "tests.unit.slow_import"])
    slow.start()
    server_pid = fs._forkserver._forkserver_pid  # type: ignore[attr-defined]
    assert server_pid and server_pid != old
    time.sleep(0.3)  # inside the one-second import
    os.kill(server_pid, signal.SIGINT)
    out = tmp_path / "after.json"
    proc = slow.spawn([str(out)], {}, entry=f"{HERE}:report")
    assert proc.wait(timeout=30) == 3
    assert fs._forkserver._forkserver_pid == server_pid  # type: ignore[attr-defined]
    assert json.loads(out.read_text())["sigint_default"]


def test_sigterm_wait_timeout_and_kill(starter: WarmStarter, tmp_path: Path) -> None:
    up = tmp_path / "up"
    proc = starter.spawn([str(up)], {}, entry=f"{HERE}:sleep_until_term")
    _wait_for(up)
    assert proc.poll() is None and proc.returncode is None
    with pytest.raises(subprocess.TimeoutExpired):
        proc.wait(timeout=0.2)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 0

    stubborn_up = tmp_path / "stubborn"
    stubborn = starter.spawn([str(stubborn_up)], {}, entry=f"{HERE}:ignore_term")
    _wait_for(stubborn_up)
    stubborn.send_signal(signal.SIGTERM)
    with pytest.raises(subprocess.TimeoutExpired):
        stubborn.wait(timeout=0.5)
    stubborn.kill()
    assert stubborn.wait(timeout=30) == -signal.SIGKILL
    stubborn.send_signal(signal.SIGTERM)  # after exit: nothing happens, nothing raises


def test_worker_outlives_a_killed_fork_server(starter: WarmStarter, tmp_path: Path) -> None:
    """Without the fork server no exit status comes back (multiprocessing says 255): the worker
    still counts as running while its process exists, can be stopped, and the next spawn gets a
    new fork server."""
    import multiprocessing.forkserver as fs

    up = tmp_path / "up"
    proc = starter.spawn([str(up)], {}, entry=f"{HERE}:sleep_until_term")
    _wait_for(up)
    server_pid = fs._forkserver._forkserver_pid  # type: ignore[attr-defined]
    assert server_pid
    os.kill(server_pid, signal.SIGKILL)
    time.sleep(0.5)
    assert proc.poll() is None  # still running, though its status pipe is closed
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 255  # gone; its status was lost with the fork server
    out = tmp_path / "again.json"
    again = starter.spawn([str(out)], {"A": "1"}, entry=f"{HERE}:report")
    assert again.wait(timeout=60) == 3
