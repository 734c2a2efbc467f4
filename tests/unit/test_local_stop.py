"""The local stack's stop and lifelines (:mod:`asyncinfer.local.shutdown`,
:mod:`asyncinfer.local.lifeline`, :mod:`asyncinfer.local.lambda_runtime`,
:mod:`asyncinfer.local.stale`): stuck work is abandoned at its deadline and reported, children
stop when the process they hold a lifeline to dies, and a new stack notices an old one."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from asyncinfer.local import lifeline, shutdown
from asyncinfer.local.lambda_runtime import LambdaPool, describe, is_probe
from asyncinfer.local.stack import LocalOptions, LocalStack, free_port
from asyncinfer.local.stale import StateDirInUse, check_state_dir, port_in_use, process_record

LINUX = sys.platform.startswith("linux")


def stuck(event: dict, context: object) -> dict:
    """A handler that never finishes in time (a receiver trickling one byte a second)."""
    Path(event["marker"]).write_text("in")
    time.sleep(120)
    return {}


def quick(event: dict, context: object) -> dict:
    """A handler that answers at once."""
    return {"ok": True}


def _gone(pid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while lifeline.process_exists(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def _dead_pid() -> int:
    p = subprocess.Popen(["true"])
    p.wait()
    return p.pid


# ---------------------------------------------------------------------- Lambda pool
def test_pool_close_abandons_a_stuck_invocation_and_reports_it(tmp_path: Path) -> None:
    pool = LambdaPool({}, size=2)
    assert pool.invoke(f"{__name__}:quick", {"Records": []}, "dlq") == {"ok": True}
    marker = tmp_path / "in"
    errors: list[BaseException] = []

    def call() -> None:
        try:
            pool.invoke(f"{__name__}:stuck", {"Records": [{}], "marker": str(marker)}, "webhooks")
        except BaseException as exc:  # the abandoned invocation's caller is released
            errors.append(exc)

    caller = threading.Thread(target=call, daemon=True)
    caller.start()
    deadline = time.monotonic() + 60
    while not marker.exists():
        assert time.monotonic() < deadline, "the handler never started"
        time.sleep(0.05)
    t0 = time.monotonic()
    abandoned = pool.close(timeout=1.0)
    assert time.monotonic() - t0 < 5
    assert len(abandoned) == 1 and abandoned[0].startswith("webhooks (1 record), running for ")
    caller.join(10)
    assert not caller.is_alive() and errors
    assert pool.running() == []


def test_a_second_signal_cuts_the_lambda_wait_short(tmp_path: Path) -> None:
    """A second Ctrl-C abandons a stuck invocation at once instead of after its grace (the
    README promised it; the long poll still ran its whole 5 s: found by the breaker)."""
    pool = LambdaPool({}, size=1)
    marker = tmp_path / "in"

    def call() -> None:
        with contextlib.suppress(BaseException):
            pool.invoke(f"{__name__}:stuck", {"Records": [{}], "marker": str(marker)}, "webhooks")

    threading.Thread(target=call, daemon=True).start()
    deadline = time.monotonic() + 60
    while not marker.exists():
        assert time.monotonic() < deadline, "the handler never started"
        time.sleep(0.05)
    cut = threading.Event()
    threading.Timer(0.3, cut.set).start()
    t0 = time.monotonic()
    abandoned = pool.close(timeout=30.0, cut=cut)
    assert time.monotonic() - t0 < 10  # not the 30 s grace
    assert len(abandoned) == 1


def test_a_health_probe_cut_off_by_the_stop_is_not_abandoned_work(tmp_path: Path) -> None:
    """The stack's own readiness probe in flight when a SIGTERM comes during start made the stop
    exit 3 naming 'api GET /v1/health' (the SIGTERM-while-starting test expects 0)."""
    pool = LambdaPool({}, size=1)
    marker = tmp_path / "in"
    event = {"httpMethod": "GET", "path": "/v1/health", "marker": str(marker)}

    def call() -> None:
        with contextlib.suppress(BaseException):
            pool.invoke(f"{__name__}:stuck", event, "api")

    threading.Thread(target=call, daemon=True).start()
    deadline = time.monotonic() + 60
    while not marker.exists():
        assert time.monotonic() < deadline, "the handler never started"
        time.sleep(0.05)
    t0 = time.monotonic()
    assert pool.close(timeout=0.5) == []
    assert time.monotonic() - t0 < 5  # cut off all the same
    assert is_probe(event) and not is_probe({**event, "httpMethod": "POST"})


def test_pool_close_with_nothing_running_abandons_nothing() -> None:
    pool = LambdaPool({}, size=1)
    assert pool.invoke(f"{__name__}:quick", {}, "api") == {"ok": True}
    t0 = time.monotonic()
    assert pool.close(timeout=5.0) == []
    assert time.monotonic() - t0 < 3


def test_describe_names_the_request_or_the_batch() -> None:
    event = {"httpMethod": "GET", "path": "/v1/jobs/j1", "queryStringParameters": {"wait": "20"}}
    assert describe("api", event) == "api GET /v1/jobs/j1?wait=20"
    assert describe("webhooks", {"Records": [{}, {}]}) == "webhooks (2 records)"


# ---------------------------------------------------------------------- workers and clock
STUBBORN = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)"
OBEDIENT = "import time; time.sleep(60)"


def test_stop_workers_kills_only_a_worker_that_ignores_sigterm() -> None:
    stubborn = subprocess.Popen([sys.executable, "-c", STUBBORN])
    obedient = subprocess.Popen([sys.executable, "-c", OBEDIENT])
    time.sleep(1.0)  # both have installed their handlers
    clock = shutdown.StopClock()
    abandoned = shutdown.stop_workers([stubborn, obedient], clock, at=1.5)
    assert clock.elapsed() < 4
    assert abandoned == [f"worker pid {stubborn.pid} (killed: still running after SIGTERM)"]
    assert stubborn.returncode == -signal.SIGKILL and obedient.returncode == -signal.SIGTERM


def test_a_second_signal_cuts_the_waits_short() -> None:
    stubborn = subprocess.Popen([sys.executable, "-c", STUBBORN])
    time.sleep(1.0)
    clock = shutdown.StopClock()
    threading.Timer(0.5, clock.cut).start()
    abandoned = shutdown.stop_workers([stubborn], clock, at=30)
    assert clock.elapsed() < 3 and len(abandoned) == 1
    assert clock.left(30) == 0


def test_the_clock_counts_from_the_signal() -> None:
    clock = shutdown.StopClock(started=time.monotonic() - 4.0)  # the signal came 4 s ago
    assert 3.5 < clock.elapsed() < 5
    assert 0.5 < clock.left(shutdown.LAMBDA_STOP_SECONDS) <= 1.0
    assert clock.wait_until(1.0, lambda: False) is False  # past: no waiting


def test_report_exit_status_and_line(capsys: pytest.CaptureFixture[str]) -> None:
    clock = shutdown.StopClock()
    assert shutdown.report([], clock) == 0
    assert capsys.readouterr().err == ""
    assert shutdown.report(["webhooks (1 record), running for 5.0 s"], clock) == 3
    err = capsys.readouterr().err
    assert err.startswith("asyncinfer local: stopped in ")
    assert "abandoned: webhooks (1 record), running for 5.0 s" in err


# ---------------------------------------------------------------------- lifelines
TARGET = "tests.unit.lifeline_target"


def test_lifeline_runs_the_module_and_ends_it_when_the_watched_process_dies(
    tmp_path: Path,
) -> None:
    watched = subprocess.Popen(["sleep", "60"])
    out = tmp_path / "argv.json"
    child = subprocess.Popen(
        [
            sys.executable,
            *("-m", "asyncinfer.local.lifeline", "--pid", str(watched.pid), "--grace", "1"),
            *(TARGET, str(out), "--flag"),
        ],
        cwd=Path(__file__).resolve().parents[2],
    )
    deadline = time.monotonic() + 30
    while not out.exists():
        assert child.poll() is None and time.monotonic() < deadline
        time.sleep(0.05)
    argv = json.loads(out.read_text())  # as ``python -m`` gives it: the module's file first
    assert argv[0].endswith("lifeline_target.py") and argv[1:] == [str(out), "--flag"]
    assert child.poll() is None  # holds on while the watched process lives
    watched.kill()
    watched.wait()
    # The target ignores SIGTERM: the lifeline ends it after its grace.
    assert child.wait(timeout=10) == lifeline.EXIT_ORPHANED


def test_hold_on_a_process_already_gone_breaks_at_once() -> None:
    code = (
        "import signal, sys, time\n"
        "from asyncinfer.local import lifeline\n"
        f"lifeline.hold({_dead_pid()}, sig=signal.SIGTERM, grace=5)\n"
        "time.sleep(30)\n"
    )
    child = subprocess.Popen([sys.executable, "-c", code])
    assert child.wait(timeout=20) == -signal.SIGTERM
    assert lifeline.hold(None) is False  # nothing to hold on to: nothing held


@pytest.mark.skipif(not LINUX, reason="prctl is Linux's")
def test_parent_death_signal_is_set() -> None:
    code = (
        "import signal\n"
        "from asyncinfer.local.lifeline import set_parent_death_signal\n"
        "assert set_parent_death_signal(signal.SIGTERM)\n"
    )
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


def test_emulator_stops_when_its_parent_is_killed() -> None:
    """The emulator runs in a session of its own: only its lifeline stops it when the process
    that started it is SIGKILLed."""
    port = free_port()
    code = (
        "import sys, time\n"
        "from asyncinfer.local.emulator import start_emulator\n"
        "from asyncinfer.local.stack import wait_http\n"
        f"p = start_emulator({port})\n"
        f"wait_http('http://127.0.0.1:{port}/moto-api/', 60)\n"
        "print(p.pid, flush=True)\n"
        "time.sleep(120)\n"
    )
    parent = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert parent.stdout is not None
        emulator = int(parent.stdout.readline())
        assert os.getsid(emulator) != os.getsid(parent.pid)
        parent.kill()
        parent.wait()
        assert _gone(emulator, 5), "the emulator outlived its parent"
        assert not port_in_use(port)
    finally:
        parent.kill()


# ---------------------------------------------------------------------- stale state
def _write(state: Path, doc: dict) -> Path:
    state.mkdir(parents=True, exist_ok=True)
    path = state / "local.json"
    path.write_text(json.dumps(doc))
    return path


def test_a_running_stack_on_the_state_dir_is_refused_and_left_alone(tmp_path: Path) -> None:
    doc = {"api_url": "http://127.0.0.1:1234", "pid": os.getpid()}
    path = _write(tmp_path, {**doc, "stack": process_record(os.getpid())})
    with pytest.raises(StateDirInUse) as info:
        check_state_dir(tmp_path, 0)
    message = str(info.value)
    assert f"another local stack (pid {os.getpid()}" in message
    assert str(tmp_path) in message and "--state-dir" in message
    assert path.exists()


def test_a_stack_that_refuses_to_start_keeps_the_other_ones_local_json(tmp_path: Path) -> None:
    path = _write(tmp_path, {"pid": os.getpid(), "stack": process_record(os.getpid())})
    before = path.read_text()
    stack = LocalStack(LocalOptions(state_dir=tmp_path, port=0, models=["echo"]))
    with pytest.raises(StateDirInUse):
        stack.start()
    assert stack.moto is None  # nothing was started
    assert stack.stop() == []
    assert path.read_text() == before


def test_a_stale_local_json_is_reported_and_its_leftovers_stopped(tmp_path: Path) -> None:
    leftover = subprocess.Popen(["sleep", "60"])
    path = _write(
        tmp_path,
        {
            "api_url": "http://127.0.0.1:1",
            "pid": _dead_pid(),
            "processes": {
                "emulator": process_record(leftover.pid),
                # A pid reused by another process (other start time) is not touched.
                "fork_server": {"pid": os.getpid(), "start": -1},
            },
        },
    )
    notes = check_state_dir(tmp_path, 0)
    assert len(notes) == 1 and "is stale" in notes[0] and "did not stop cleanly" in notes[0]
    if lifeline.start_ticks(leftover.pid) is not None:
        assert f"stopped what it left running: emulator (pid {leftover.pid})" in notes[0]
    assert leftover.wait(timeout=5) == -signal.SIGTERM
    assert not path.exists()


def test_a_port_in_use_is_named(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        _write(tmp_path, {"api_url": f"http://127.0.0.1:{port}", "pid": _dead_pid()})
        with pytest.raises(StateDirInUse) as info:
            check_state_dir(tmp_path, port)
    message = str(info.value)
    assert f"port {port} on 127.0.0.1 is in use" in message
    assert "API port of the stale stack" in message and "--port" in message


@pytest.mark.skipif(not LINUX, reason="forkserver and /proc")
def test_fork_server_still_importing_stops_when_its_parent_is_killed() -> None:
    """Without its lifeline the fork server would notice its parent's end only after its
    imports (here 20 s)."""
    code = (
        "import time\n"
        "import multiprocessing.forkserver as fs\n"
        "from asyncinfer.local.warm import WarmStarter\n"
        "WarmStarter(preload=['json', 'tests.unit.very_slow_import']).start()\n"
        "print(fs._forkserver._forkserver_pid, flush=True)\n"
        "time.sleep(120)\n"
    )
    parent = subprocess.Popen(
        [sys.executable, "-c", code],
        stdout=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).resolve().parents[2],
    )
    try:
        assert parent.stdout is not None
        server = int(parent.stdout.readline())
        time.sleep(1.0)  # importing
        assert lifeline.process_exists(server)
        parent.kill()
        parent.wait()
        assert _gone(server, 5), "the fork server outlived its parent"
    finally:
        parent.kill()


def test_the_stacks_event_line_reads_job_and_batch_events() -> None:
    from asyncinfer.local.stack import event_line

    job = {"id": "job_1", "model": "echo", "attempts": 1, "error": {"code": "timeout"}}
    line = event_line({"type": "job.failed", "timestamp": "2026-12-01T00:00:00.000Z", "data": job})
    assert (
        line == "2026-12-01T00:00:00.000Z job.failed     job_1 model=echo attempts=1 error=timeout"
    )
    batch = {"object": "event", "type": "batch.completed", "created_at": 0, "data": {"id": "b_1"}}
    assert event_line(batch) == "1970-01-01T00:00:00Z batch.completed b_1"
