"""Bookkeeping of the messages a worker holds: their receipt handles, their jobs, and the events
that interrupt them. Shared by the main loop and the watcher thread."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Held:
    """One received SQS message and, once started, its job.

    Attributes:
        message_id: the SQS MessageId.
        receipt: the receipt handle of this receive.
        body: the raw message body.
        receive_count: ApproximateReceiveCount (1 on first delivery).
        job_id: the job id, once parsed.
        attempts: the job's attempt number while it runs (``None`` until started).
        cancel_event: set when a cancel request is seen for the running job.
        progress: ``(completion_tokens, partial output)`` reported since the last flush.
        finished: the job's result is in the worker's hands; its terminal write, event and the
            message's deletion are pending or done.
        queue_url: the queue the message came from (its priority class's queue).
        started: ``time.monotonic()`` when its job started running (0 until then).
        reported: its handler reported progress at least once.
        written_tokens: the last progress count the watcher wrote for it.
    """

    message_id: str
    receipt: str
    body: str
    queue_url: str = ""
    receive_count: int = 1
    job_id: str | None = None
    attempts: int | None = None
    cancel_event: threading.Event = field(default_factory=threading.Event)
    progress: tuple[int, dict[str, Any]] | None = None
    finished: bool = False
    started: float = 0.0
    reported: bool = False
    written_tokens: int | None = None


class InFlight:
    """The set of held messages, thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._held: dict[str, Held] = {}

    def add(self, held: Held) -> None:
        """Start holding ``held`` (heartbeats extend its visibility from now on)."""
        with self._lock:
            self._held[held.message_id] = held

    def drop(self, message_id: str) -> None:
        """Stop holding a message (deleted or released)."""
        with self._lock:
            self._held.pop(message_id, None)

    def snapshot(self) -> list[Held]:
        """The held messages now."""
        with self._lock:
            return list(self._held.values())

    def __len__(self) -> int:
        with self._lock:
            return len(self._held)
