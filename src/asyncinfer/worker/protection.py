"""ECS task scale-in protection, held while a worker has jobs in hand.

ECS service auto scaling picks tasks to stop when it scales in; a protected task is skipped
(ECS developer guide, "Protect your Amazon ECS tasks from being terminated by scale-in events":
``PUT $ECS_AGENT_URI/task-protection/v1/state`` with ``{"ProtectionEnabled": bool,
"ExpiresInMinutes": n}``). Outside ECS (no ``ECS_AGENT_URI``) this does nothing.

On the local stack the same signal goes to a file instead: with ``ASYNCINFER_BUSY_FILE`` set
(``Settings.busy_file``; ``ECS_AGENT_URI`` is ``Settings.ecs_agent_uri``), the
worker writes ``1`` (busy) or ``0`` (idle) there, and the local autoscaler never stops a worker
whose file says ``1``.
"""

from __future__ import annotations

import logging
import os
import time

log = logging.getLogger("asyncinfer.worker")

#: How long one protection request lasts, minutes; renewed while work goes on.
EXPIRES_IN_MINUTES = 60


class ScaleInProtection:
    """Turns protection on when work starts and off when the worker is idle."""

    def __init__(self, agent_uri: str | None = None, busy_file: str | None = None) -> None:
        """``agent_uri``: ECS's agent endpoint, ``busy_file``: the local stack's busy file (the
        worker passes ``Settings.ecs_agent_uri`` / ``Settings.busy_file``); either may be empty
        or ``None`` (nothing to signal there)."""
        self.agent_uri = agent_uri or None
        self.busy_file = busy_file or None
        self.enabled = False
        self.renew_at = 0.0
        if self.busy_file:
            self._write_busy(False)

    def _write_busy(self, busy: bool) -> None:
        assert self.busy_file
        tmp = f"{self.busy_file}.tmp"
        with open(tmp, "w") as f:
            f.write("1" if busy else "0")
        os.replace(tmp, self.busy_file)

    def set(self, busy: bool) -> None:
        """Hold protection while ``busy``; release it when not. Failures are logged, never
        raised: protection is a scaling courtesy, not a condition for running jobs."""
        if not self.agent_uri and not self.busy_file:
            return
        now = time.monotonic()
        if busy == self.enabled and (not busy or now < self.renew_at):
            return
        if self.busy_file:
            self._write_busy(busy)
        if not self.agent_uri:
            self.enabled = busy
            self.renew_at = float("inf")
            return
        import httpx  # only on ECS: ~0.1 s of a worker's start elsewhere

        body = {"ProtectionEnabled": busy}
        if busy:
            body["ExpiresInMinutes"] = EXPIRES_IN_MINUTES  # type: ignore[assignment]
        try:
            r = httpx.put(f"{self.agent_uri}/task-protection/v1/state", json=body, timeout=5)
            r.raise_for_status()
        except httpx.HTTPError as exc:
            log.warning("scale-in protection %s failed: %s", "on" if busy else "off", exc)
            return
        self.enabled = busy
        self.renew_at = now + EXPIRES_IN_MINUTES * 60 / 2
