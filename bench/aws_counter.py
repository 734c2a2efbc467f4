"""Counts the AWS requests this process makes through :mod:`asyncinfer.aws.clients`, with botocore's
``after-call`` event on every client built from now on. A ``ReceiveMessage`` that returned no
message (idle polling) is not counted."""

from __future__ import annotations

import threading
from collections import Counter
from typing import Any

from asyncinfer.aws import clients


class AwsRequestCounter:
    """Install with :meth:`install` before any client is built; read :attr:`counts`."""

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()
        self._lock = threading.Lock()
        self._hooked: set[int] = set()
        self._original = clients.client

    def install(self) -> None:
        clients.reset()
        original = self._original

        def client(service: str, settings: Any = None) -> Any:
            c = original(service, settings)
            if id(c) not in self._hooked:
                self._hooked.add(id(c))
                c.meta.events.register("after-call", self._after_call)
            return c

        clients.client = client  # type: ignore[assignment]

    def uninstall(self) -> None:
        clients.client = self._original  # type: ignore[assignment]

    def _after_call(self, model: Any, parsed: Any = None, **kwargs: Any) -> None:
        name = model.name
        if name == "ReceiveMessage" and not (parsed or {}).get("Messages"):
            return
        with self._lock:
            self.counts[name] += 1

    def reset(self) -> None:
        with self._lock:
            self.counts.clear()

    def snapshot(self) -> Counter[str]:
        with self._lock:
            return Counter(self.counts)
