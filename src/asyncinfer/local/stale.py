"""What a new local stack finds of an earlier one on its state directory, before it starts
anything: a stack still running there, or one that died without stopping (SIGKILL, a crash) and
left its ``local.json`` (and perhaps a process) behind; and whether its API port is free.

``local.json`` records the stack's pid and the pids of the processes it started (``processes``:
name -> ``{"pid", "start"}``, ``start`` being the process's start time in clock ticks where
``/proc`` tells it), so that a pid reused by an unrelated process is never taken for one of
them (:func:`asyncinfer.local.lifeline.start_ticks`).
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import signal
import socket
import time
from pathlib import Path
from typing import Any

from asyncinfer.local.lifeline import process_exists, start_ticks


class StateDirInUse(SystemExit):
    """Another local stack runs on this state directory, or the API port is taken: the message
    says which and what to do. A ``SystemExit`` (status 1, its message on stderr) raised before
    anything was started."""

    def __init__(self, message: str) -> None:
        super().__init__(f"asyncinfer local: {message}")
        self.message = message


def process_record(pid: int | None) -> dict[str, Any]:
    """``{"pid": pid, "start": <start ticks or None>}`` for ``local.json``."""
    return {"pid": pid, "start": start_ticks(pid) if pid else None}


def same_process(record: Any) -> bool:
    """Whether the process a :func:`process_record` names still runs (same pid, and the same
    start time where both are known)."""
    if not isinstance(record, dict) or not isinstance(record.get("pid"), int):
        return False
    pid = record["pid"]
    if pid <= 0 or not process_exists(pid):
        return False
    recorded, now = record.get("start"), start_ticks(pid)
    if recorded is not None and now is not None:
        return bool(recorded == now)
    try:  # no start time to compare (an older local.json): is it at least one of ours?
        return b"asyncinfer" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return True


def port_in_use(port: int, host: str = "127.0.0.1") -> bool:
    """Whether a TCP ``port`` on ``host`` cannot be bound now (``SO_REUSEADDR``, as the gateway
    binds: a port in TIME_WAIT is free)."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as exc:
            return exc.errno in (errno.EADDRINUSE, errno.EACCES)
    return False


def _stop(pid: int, seconds: float = 2.0) -> None:
    """SIGTERM ``pid``, SIGKILL after ``seconds``."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + seconds
    while process_exists(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    if process_exists(pid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def check_state_dir(state_dir: Path, port: int) -> list[str]:
    """Look at ``state_dir`` and ``port`` before a stack starts.

    * ``local.json`` names a stack that still runs: :class:`StateDirInUse` (nothing is touched).
    * ``local.json`` names a stack that is gone: it is stale; the processes it records that still
      run (theirs by pid and start time) are stopped (SIGTERM, SIGKILL after 2 s), the file is
      removed, and what was found is returned as lines for the user.
    * ``port`` (unless 0) cannot be bound: :class:`StateDirInUse`, naming the stale stack if the
      port was its API's.

    Returns:
        The lines to print (empty when the directory was clean).
    """
    path = state_dir / "local.json"
    notes: list[str] = []
    stale_api = ""
    doc: dict[str, Any] | None = None
    if path.exists():
        try:
            loaded = json.loads(path.read_text())
            doc = loaded if isinstance(loaded, dict) else None
        except (OSError, ValueError):
            doc = None
        if doc is None:
            notes.append(f"{path} is unreadable; a stack that died while writing it? removed it")
        else:
            owner = doc.get("stack") or {"pid": doc.get("pid")}
            pid = owner.get("pid") if isinstance(owner, dict) else None
            if same_process(owner):
                raise StateDirInUse(
                    f"another local stack (pid {pid}, api {doc.get('api_url')}) is running on "
                    f"the state directory {state_dir}; stop it (kill -TERM {pid}) or pass "
                    "another --state-dir"
                )
            stale_api = str(doc.get("api_url") or "")
            left = []
            for name, record in (doc.get("processes") or {}).items():
                if same_process(record):
                    _stop(record["pid"])
                    left.append(f"{name} (pid {record['pid']})")
            notes.append(
                f"{path} is stale: the stack that wrote it (pid {pid}) is gone and did not stop "
                "cleanly; "
                + (
                    f"stopped what it left running: {', '.join(left)}"
                    if left
                    else "none of its processes is left running"
                )
                + "; starting afresh"
            )
        path.unlink(missing_ok=True)
    if port and port_in_use(port):
        whose = (
            f" (it was the API port of the stale stack, {stale_api}; something still holds it)"
            if stale_api.endswith(f":{port}")
            else ""
        )
        raise StateDirInUse(
            f"port {port} on 127.0.0.1 is in use{whose}; pass --port with a free port, or stop "
            "what listens on it"
        )
    return notes
