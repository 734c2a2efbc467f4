"""The :class:`~asyncinfer.models.base.WorkSource` of ``asyncinfer serve-openai``: the HTTP
requests waiting for, or running in, the model handler's ``serve`` loop.

Each request is a :class:`Request` holding one :class:`~asyncinfer.models.base.WorkItem`; the
handler takes items (they are then *running*), reports progress through ``on_progress`` and hands
each result to :meth:`RequestSource.finish`. The counts are vLLM's scheduler gauges:
``num_requests_waiting`` (submitted, not yet taken) and ``num_requests_running``.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from asyncinfer.models.base import Result, WorkItem


@dataclass
class Request:
    """One HTTP request's job and what the handler reported for it.

    Attributes:
        item: the work item the handler runs.
        tokens: completion tokens so far (from progress).
        partial: the last partial output (``{"text", "usage", ...}``), or ``None``.
        result: the handler's result once finished, else ``None``.
        done: set when ``result`` is in.
    """

    item: WorkItem
    tokens: int = 0
    partial: dict[str, Any] | None = None
    result: Result | None = None
    done: bool = False
    changed: threading.Condition = field(default_factory=threading.Condition)

    def progress(self, tokens: int, partial: dict[str, Any]) -> None:
        """``on_progress`` of the item (the handler's thread)."""
        with self.changed:
            self.tokens, self.partial = tokens, partial
            self.changed.notify_all()

    def wait(self, timeout: float) -> None:
        """Wait up to ``timeout`` seconds for progress or the result."""
        with self.changed:
            if not self.done:
                self.changed.wait(timeout)


class RequestSource:
    """Requests in, results out, for one handler's ``serve`` loop (thread-safe).

    Counters for ``/metrics``: :attr:`waiting`, :attr:`running`, :attr:`peak_running` (most
    running at once since start), :attr:`total` (requests submitted), :attr:`closed` (requests
    whose client went away before the result)."""

    def __init__(self) -> None:
        self._lock = threading.Condition()
        self._waiting: deque[Request] = deque()
        self._running: dict[int, Request] = {}
        self._stopping = False
        self.peak_running = 0
        self.total = 0
        self.closed = 0

    # ------------------------------------------------------------------ HTTP side
    def submit(self, item: WorkItem) -> Request:
        """Queue ``item`` for the handler; its progress goes to the returned request."""
        req = Request(item=item)
        item.on_progress = req.progress
        with self._lock:
            self._waiting.append(req)
            self.total += 1
            self._lock.notify_all()
        return req

    def withdraw(self, req: Request) -> bool:
        """Take a request the handler has not taken out of the queue (its client went away);
        ``False`` when it is running already (then set its ``cancel_event``)."""
        with self._lock:
            try:
                self._waiting.remove(req)
            except ValueError:
                return False
            return True

    def stop(self) -> None:
        """Take no more requests; ``serve`` returns once the running ones are done."""
        with self._lock:
            self._stopping = True
            for req in self._waiting:
                req.item.stop_event.set()
            self._lock.notify_all()

    @property
    def waiting(self) -> int:
        with self._lock:
            return len(self._waiting)

    @property
    def running(self) -> int:
        with self._lock:
            return len(self._running)

    # ------------------------------------------------------------------ WorkSource
    @property
    def stopping(self) -> bool:
        with self._lock:
            return self._stopping

    def take(self, max_items: int, timeout: float) -> list[WorkItem]:
        """Up to ``max_items`` waiting requests' items, waiting up to ``timeout`` seconds for
        the first."""
        deadline = time.monotonic() + timeout
        with self._lock:
            while not self._waiting and not self._stopping:
                left = deadline - time.monotonic()
                if left <= 0:
                    return []
                self._lock.wait(left)
            if self._stopping:
                return []
            out: list[WorkItem] = []
            while self._waiting and len(out) < max_items:
                req = self._waiting.popleft()
                self._running[id(req.item)] = req
                out.append(req.item)
            self.peak_running = max(self.peak_running, len(self._running))
            return out

    def finish(self, item: WorkItem, result: Result) -> None:
        with self._lock:
            req = self._running.pop(id(item), None)
        if req is None:
            return
        with req.changed:
            req.result, req.done = result, True
            req.changed.notify_all()
