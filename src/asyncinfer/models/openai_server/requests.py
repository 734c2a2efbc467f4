"""The :class:`~asyncinfer.models.base.WorkSource` of ``asyncinfer serve-openai``: the HTTP
requests waiting for, or running in, the model handler's ``serve`` loop.

Each request is a :class:`Request` holding one :class:`~asyncinfer.models.base.WorkItem`; the
handler takes items (they are then *running*), reports progress through ``on_progress`` and hands
each result to :meth:`RequestSource.finish`. The counts are vLLM's scheduler gauges:
``num_requests_waiting`` (submitted, not yet taken) and ``num_requests_running``.
"""

from __future__ import annotations

import contextlib
import selectors
import socket
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from asyncinfer.models.base import Result, WorkItem


def _wake_pair() -> tuple[socket.socket, socket.socket]:
    """A connected, non-blocking socket pair: a byte written to the second wakes a ``select`` on
    the first (and stays until read, so no wake is lost)."""
    pair = socket.socketpair()
    for end in pair:
        end.setblocking(False)
    return pair


#: Most time an idle engine's take waits for the rest of a burst of requests, seconds.
GATHER_SECONDS = 0.05
#: Longest gap between two requests of one burst, seconds.
GATHER_GAP_SECONDS = 0.01


@dataclass
class Request:
    """One HTTP request's job and what the handler reported for it.

    The request's thread sleeps until something happens (:meth:`wait_for`): progress or the
    result (the handler's thread writes a byte to the request's wake socket) or its client's
    socket turning readable (a closed connection): no polling, so the request threads take no
    CPU, and no core from the engine, between progress reports.

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
    changed: threading.RLock = field(default_factory=threading.RLock)
    _wake: tuple[socket.socket, socket.socket] | None = field(
        default_factory=_wake_pair, repr=False
    )

    def progress(self, tokens: int, partial: dict[str, Any]) -> None:
        """``on_progress`` of the item (the handler's thread)."""
        with self.changed:
            self.tokens, self.partial = tokens, partial
        self._signal()

    def settle(self, result: Result) -> None:
        """Record the handler's result (``done``) and wake the request's thread."""
        with self.changed:
            self.result, self.done = result, True
        self._signal()

    def wait_for(self, sock: socket.socket | None, timeout: float) -> bool:
        """Sleep until progress or the result comes (one not yet waited for: none is missed),
        ``sock`` is readable, or ``timeout`` seconds pass; ``True`` when ``sock`` is readable
        (its peer closed it, or sent more)."""
        with self.changed:
            if self.done or self._wake is None:
                return False
            reader = self._wake[0]
        # A selector, not select.select: that refuses descriptors past FD_SETSIZE (1,024),
        # which a server with a few hundred connections (three descriptors each) reaches.
        try:
            with selectors.DefaultSelector() as selector:
                selector.register(reader, selectors.EVENT_READ)
                if sock is not None:
                    selector.register(sock, selectors.EVENT_READ)
                readable = [key.fileobj for key, _ in selector.select(timeout)]
        except (OSError, ValueError):  # the client's socket closed under us
            return True
        if reader in readable:
            try:
                while reader.recv(4096):
                    pass
            except (BlockingIOError, OSError):
                pass
        return sock is not None and sock in readable

    def close(self) -> None:
        """Close the wake socket (the request's thread is done with it)."""
        with self.changed:
            wake, self._wake = self._wake, None
        for end in wake or ():
            end.close()

    def _signal(self) -> None:
        with self.changed:
            wake = self._wake
        if wake is not None:
            # BlockingIOError: a wake is pending anyway; closed: no one waits any more.
            with contextlib.suppress(OSError):
                wake[1].send(b"!")


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
        the first.

        A caller that waits (``timeout > 0``: the engine is idle) and gets a first request also
        gathers the burst it came in: while requests keep arriving less than
        :data:`GATHER_GAP_SECONDS` apart (and at most :data:`GATHER_SECONDS` in all), up to
        ``max_items``. Requests sent together (a client's concurrent jobs, which HTTP delivers
        one by one) then start in one batch and decode in step, as the same jobs would in
        process, instead of the first alone and the rest a step behind. A busy engine
        (``timeout`` 0) takes what is there: it admits the others at its next step anyway."""
        deadline = time.monotonic() + timeout
        with self._lock:
            while not self._waiting and not self._stopping:
                left = deadline - time.monotonic()
                if left <= 0:
                    return []
                self._lock.wait(left)
            if timeout > 0:
                end = time.monotonic() + GATHER_SECONDS
                while not self._stopping and len(self._waiting) < max_items:
                    seen = len(self._waiting)
                    left = end - time.monotonic()
                    if left <= 0 or not self._lock.wait(min(left, GATHER_GAP_SECONDS)):
                        break
                    if len(self._waiting) == seen:  # woken by something else: no arrival
                        break
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
        if req is not None:
            req.settle(result)
