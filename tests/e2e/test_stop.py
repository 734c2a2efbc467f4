"""End to end: ``asyncinfer local`` stops within 15 s whatever it is doing, says what it
abandoned, and leaves nothing behind, even when it is SIGKILLed; a new stack on the same state
directory says that the old one's ``local.json`` is stale."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from asyncinfer.local.shutdown import EXIT_ABANDONED
from asyncinfer.local.stack import free_port
from asyncinfer.local.warm import process_exists
from tests.e2e.conftest import LocalStackProcess, local_stack

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(not Path("/proc").is_dir(), reason="needs /proc"),
]


def descendants(pid: int) -> set[int]:
    """Every process below ``pid`` (``/proc``), children of children included."""
    parents: dict[int, int] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            parents[int(stat.parent.name)] = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
    found: set[int] = set()
    frontier = {pid}
    while frontier:
        frontier = {child for child, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found


def all_gone(pids: set[int], timeout: float) -> set[int]:
    """Wait up to ``timeout`` seconds for ``pids`` to exit; returns those still there."""
    deadline = time.monotonic() + timeout
    while (left := {p for p in pids if process_exists(p)}) and time.monotonic() < deadline:
        time.sleep(0.1)
    return left


def port_free(url: str) -> bool:
    """Whether nothing listens at ``url``'s port on 127.0.0.1 any more."""
    port = int(url.rsplit(":", 1)[1].split("/")[0])
    with socket.socket() as s:
        s.settimeout(2)
        return s.connect_ex(("127.0.0.1", port)) != 0


class TricklingReceiver:
    """A webhook receiver on 127.0.0.1 that reads the request, then answers one byte a second
    (never finishing within a delivery's time limit)."""

    def __init__(self) -> None:
        self.server = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.server.getsockname()[1]}/hooks"
        self.got = threading.Event()
        self.closed = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self.closed.is_set():
            try:
                conn, _ = self.server.accept()
            except OSError:
                return
            threading.Thread(target=self._trickle, args=(conn,), daemon=True).start()

    def _trickle(self, conn: socket.socket) -> None:
        with conn:
            conn.recv(65536)
            self.got.set()
            for byte in b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok" * 10:
                if self.closed.wait(1.0):
                    return
                try:
                    conn.sendall(bytes([byte]))
                except OSError:
                    return

    def close(self) -> None:
        self.closed.set()
        self.server.close()


def test_stop_with_a_trickling_webhook_receiver_is_quick_and_says_what_it_abandoned(
    tmp_path: Path,
) -> None:
    receiver = TricklingReceiver()
    try:
        with local_stack(tmp_path / "state", "--models", "echo") as s:
            with s.client() as c:
                r = c.post(
                    "/v1/jobs",
                    json={
                        "model": "echo",
                        "input": {"n": 1},
                        "webhook": {"url": receiver.url, "events": ["job.succeeded"]},
                    },
                )
                assert r.status_code == 202, r.text
            assert receiver.got.wait(120), "no delivery began:\n" + "\n".join(s.lines[-30:])
            # And a long poll on a job that will not end within it.
            with s.client() as c:
                slow = c.post("/v1/jobs", json={"model": "echo", "input": {"sleep_seconds": 30}})
            polled: list[object] = []

            def long_poll() -> None:
                try:
                    with s.client() as c:
                        polled.append(c.get(f"/v1/jobs/{slow.json()['id']}?wait=20").status_code)
                except httpx.HTTPError as exc:
                    polled.append(exc)

            poller = threading.Thread(target=long_poll, daemon=True)
            poller.start()
            time.sleep(1.0)  # the request reaches its Lambda instance
            children = descendants(s.proc.pid)
            t0 = time.monotonic()
            s.proc.send_signal(signal.SIGINT)
            code = s.proc.wait(timeout=20)
            took = time.monotonic() - t0
            assert took < 15, f"the stop took {took:.1f} s"
            assert code == EXIT_ABANDONED
            time.sleep(0.5)  # the output pump's last lines
            summary = [line for line in s.lines if "abandoned:" in line]
            assert len(summary) == 1, "\n".join(s.lines[-20:])
            assert summary[0].startswith("asyncinfer local: stopped in ")
            # The delivery in progress (its batch may hold the job's other events, dropped).
            assert re.search(r"webhooks \(\d+ records?\), running for ", summary[0])
            assert f"api GET /v1/jobs/{slow.json()['id']}?wait=20, running for " in summary[0]
            poller.join(5)
            assert polled and polled[0] != 200  # answered 502 when abandoned, or cut off
            assert port_free(s.local["aws_endpoint_url"]) and port_free(s.api)
            assert all_gone(children, 5) == set()
            assert not (tmp_path / "state" / "local.json").exists()
    finally:
        receiver.close()


def _wait_for_worker(s: LocalStackProcess, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not any("workers model=echo count=1" in line for line in s.lines):
        assert time.monotonic() < deadline, "no worker:\n" + "\n".join(s.lines[-30:])
        time.sleep(0.1)
    with s.client() as c:  # the worker is up: a job runs
        job = c.post("/v1/jobs", json={"model": "echo", "input": {"n": 1}}).json()
    assert s.wait_status(job["id"], {"succeeded"}, timeout=120)["status"] == "succeeded"


@pytest.mark.parametrize("workers", ["warm", "cold"])
def test_sigkill_leaves_no_process_and_the_next_stack_says_it_was_stale(
    tmp_path: Path, workers: str
) -> None:
    state = tmp_path / "state"
    flags = ["--models", "echo", "--min-workers", "1"] + (["--cold-workers"] * (workers == "cold"))
    with local_stack(state, *flags) as s:
        _wait_for_worker(s)
        children = descendants(s.proc.pid)
        # The emulator, the Lambda pool, the worker (and for warm workers the fork server, of
        # which the worker is a child).
        assert len(children) >= 3
        s.proc.kill()
        s.proc.wait()
        left = all_gone(children, 10)
        assert left == set(), {p: Path(f"/proc/{p}/cmdline").read_bytes()[:120] for p in left}
        assert port_free(s.local["aws_endpoint_url"]) and port_free(s.api)
        stale = json.loads((state / "local.json").read_text())
        assert stale["pid"] == s.proc.pid

    # A new stack on the same state directory says so, and starts.
    exe = Path(sys.executable).parent / "asyncinfer"
    proc = subprocess.Popen(
        [str(exe), "local", "--port", str(free_port()), "--state-dir", str(state), *flags[:2]],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        assert proc.stderr is not None
        first = proc.stderr.readline()
        assert first.startswith(f"asyncinfer local: {state / 'local.json'} is stale"), first
        assert f"(pid {s.proc.pid}) is gone and did not stop cleanly" in first
        assert "none of its processes is left running" in first
        proc.send_signal(signal.SIGTERM)  # while it starts: it stops in order, exit 0
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()


def test_a_second_stack_on_a_running_ones_state_dir_is_refused(tmp_path: Path) -> None:
    state = tmp_path / "state"
    with local_stack(state, "--models", "echo") as s:
        exe = Path(sys.executable).parent / "asyncinfer"
        for port, expected in (
            (free_port(), f"another local stack (pid {s.proc.pid}, api {s.api}) is running"),
            (int(s.api.rsplit(":", 1)[1]), "is in use"),
        ):
            other = state if "another" in expected else tmp_path / "other"
            r = subprocess.run(
                [str(exe), "local", "--port", str(port), "--state-dir", str(other)],
                capture_output=True,
                text=True,
                timeout=120,
            )
            assert r.returncode == 1 and expected in r.stderr, r.stderr
        assert json.loads((state / "local.json").read_text())["pid"] == s.proc.pid
        assert httpx.get(s.api + "/v1/health", timeout=10).status_code == 200
