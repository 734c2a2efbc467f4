"""Starting the local stack as a subprocess, as a user would, for end-to-end tests."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from asyncinfer.local.stack import free_port

READY_TIMEOUT = 240


@dataclass
class LocalStackProcess:
    """A running ``asyncinfer local`` and what it printed."""

    proc: subprocess.Popen[str]
    api: str
    key: str
    local: dict
    lines: list[str] = field(default_factory=list)

    def client(self, key: str | None = None) -> httpx.Client:
        return httpx.Client(base_url=self.api, headers={"x-api-key": key or self.key}, timeout=60)

    def event_types(self, job_id: str) -> list[str]:
        return [line.split()[1] for line in self.lines if job_id in line and " job." in line]

    def wait_status(self, job_id: str, statuses: set[str], timeout: float = 120) -> dict:
        deadline = time.monotonic() + timeout
        with self.client() as c:
            while True:
                job = c.get(f"/v1/jobs/{job_id}").json()
                if job["status"] in statuses:
                    return job
                assert time.monotonic() < deadline, f"{job_id} still {job['status']}"
                time.sleep(0.1)


@contextmanager
def local_stack(state: Path, *args: str) -> Iterator[LocalStackProcess]:
    """Run ``asyncinfer local --port <free> --state-dir <state> <args>`` until the block ends."""
    exe = Path(sys.executable).parent / "asyncinfer"
    proc = subprocess.Popen(
        [str(exe), "local", "--port", str(free_port()), "--state-dir", str(state), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    lines: list[str] = []
    ready = threading.Event()

    def pump() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line.rstrip("\n"))
            if line.startswith("asyncinfer local: ready"):
                ready.set()

    threading.Thread(target=pump, daemon=True).start()
    try:
        if not ready.wait(READY_TIMEOUT):
            raise AssertionError("local stack not ready:\n" + "\n".join(lines[-40:]))
        ready_line = next(line for line in lines if line.startswith("asyncinfer local: ready"))
        parts = dict(p.split("=", 1) for p in ready_line.split()[3:])
        local = json.loads((state / "local.json").read_text())
        yield LocalStackProcess(proc, parts["api"], parts["key"], local, lines)
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
