"""Receivers that let an attempt run into its deadline are given a rest, per dispatcher process.

Side-by-side batches (:mod:`.batch`) keep a slow receiver from delaying the other events of its
batch, but every attempt at it still holds one of the dispatcher's threads for the full 10 s, and
the dispatcher's concurrency is reserved and bounded: a tenant with a thousand events for a
receiver that trickles would fill it for minutes, and other tenants' events would wait in the
queue behind them. So once a tenant's attempt at a host (and port) has timed out, the same
dispatcher process sends nothing more of that tenant to it for :data:`COOLDOWN_SECONDS` (keyed
by tenant, so one tenant's slow endpoint on a shared host never rests another's): those events
are put back on the queue for about that long (message visibility) without an attempt, and the
first one after the rest probes it again. A delivery to the host ends the rest at once. Events
keep their retry window: one whose window is over is attempted (and then dead-lettered) whatever
the host's rest.
"""

from __future__ import annotations

import threading
import time

#: Seconds a host whose attempt timed out gets no other attempt from this process.
COOLDOWN_SECONDS = 60.0


class SlowHosts:
    """Which keys (``<tenant> <host>:<port>``) are resting, and for how long (thread-safe)."""

    def __init__(self, cooldown: float = COOLDOWN_SECONDS) -> None:
        self.cooldown = cooldown
        self._until: dict[str, float] = {}
        self._lock = threading.Lock()

    def rest_left(self, host: str) -> float:
        """Seconds until ``host`` may be sent to again (0: now)."""
        with self._lock:
            until = self._until.get(host)
            if until is None:
                return 0.0
            left = until - time.monotonic()
            if left <= 0:
                del self._until[host]
                return 0.0
            return left

    def timed_out(self, host: str) -> None:
        """An attempt at ``host`` ran into its deadline: rest it."""
        with self._lock:
            self._until[host] = time.monotonic() + self.cooldown
            if len(self._until) > 10_000:  # forget the oldest rather than grow without bound
                for key in sorted(self._until, key=self._until.__getitem__)[:1000]:
                    del self._until[key]

    def answered(self, host: str) -> None:
        """``host`` answered in time: its rest (if any) is over."""
        with self._lock:
            self._until.pop(host, None)
