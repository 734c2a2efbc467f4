"""The worker's intake: one long-polling thread per priority class (high, normal, low) with its
own queue, the inboxes of received messages not yet started, and the priority rule by which
the next one is taken.

Priorities: admission is by strict priority, except that every fifth admission while a higher
class has backlog goes to a lower class (normal and low in turn), so lower classes get at least
a fifth of the slots and are never starved.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable

from asyncinfer.worker.held import HeldMessages
from asyncinfer.worker.inflight import Held

log = logging.getLogger("asyncinfer.worker")

#: The priority classes, highest first.
CLASSES = ("high", "normal", "low")


class Intake:
    """Receives messages for one worker and hands them out by priority.

    Args:
        held: the held messages (the SQS client, and where a received message is held).
        queues: ``{priority: queue URL}``, highest class first.
        room: how many more jobs the worker could start now (free slots less the messages in
            hand).
        busy: whether jobs are running now.
        stop_event: set when the worker takes no more work.
        receive_max: most messages a receive asks for (at most 10, the SQS limit).
        receive_wait_seconds: the long poll's wait, seconds.
        max_wait_seconds: the gather window, seconds.
        stop_release_delay: how long a message received after the stop stays hidden, seconds.
    """

    #: One admission in this many goes to a lower class while a higher class has backlog.
    LOWER_CLASS_EVERY = 5

    def __init__(
        self,
        held: HeldMessages,
        queues: dict[str, str],
        *,
        room: Callable[[], int],
        busy: Callable[[], bool],
        stop_event: threading.Event,
        receive_max: int,
        receive_wait_seconds: int,
        max_wait_seconds: float,
        stop_release_delay: float,
    ) -> None:
        self.held = held
        self.queues = queues
        self.room = room
        self.busy = busy
        self.stop_event = stop_event
        self.receive_max = receive_max
        self.receive_wait_seconds = receive_wait_seconds
        self.max_wait_seconds = max_wait_seconds
        self.stop_release_delay = stop_release_delay
        self.inboxes: dict[str, queue.Queue[Held]] = {p: queue.Queue() for p in queues}
        self.arrived = threading.Condition()
        self._admitted = 0
        self._lower_turn = 0
        self._threads: list[threading.Thread] = []

    # ------------------------------------------------------------------ threads
    def start(self) -> None:
        """Start one poller thread per class."""
        self._threads = [
            threading.Thread(
                target=self.poll_loop, args=(priority, url), name=f"poll-{priority}", daemon=True
            )
            for priority, url in self.queues.items()
        ]
        for t in self._threads:
            t.start()

    def join(self, timeout: float) -> None:
        """Wait up to ``timeout`` seconds for the pollers (a long poll in flight may still
        return messages: they are released with the rest)."""
        deadline = time.monotonic() + timeout
        for t in self._threads:
            t.join(timeout=max(0.0, deadline - time.monotonic()))

    def wake(self) -> None:
        """Wake whoever waits for messages (the stop)."""
        with self.arrived:
            self.arrived.notify_all()

    def poll_loop(self, priority: str, url: str) -> None:
        """Receive messages of one class until the stop."""
        inbox = self.inboxes[priority]
        while not self.stop_event.is_set():
            most = self.receive_max
            # Receive while there is room for more jobs; a class whose inbox is empty receives
            # anyway, so that the priority rule has its messages in hand when a slot frees.
            if inbox.qsize() and self.room() <= 0:
                time.sleep(0.01)
                continue
            try:
                resp = self.held.sqs.receive_message(
                    QueueUrl=url,
                    MaxNumberOfMessages=most,
                    WaitTimeSeconds=self.receive_wait_seconds,
                    MessageSystemAttributeNames=["ApproximateReceiveCount"],
                )
            except Exception:
                if self.stop_event.is_set():
                    return
                log.exception("receive failed; retrying in 1s")
                time.sleep(1)
                continue
            messages = resp.get("Messages", [])
            for m in messages:
                held = Held(
                    message_id=m["MessageId"],
                    receipt=m["ReceiptHandle"],
                    body=m["Body"],
                    queue_url=url,
                    receive_count=int(m.get("Attributes", {}).get("ApproximateReceiveCount", 1)),
                )
                self.held.hold(held)
                if self.stop_event.is_set():
                    self.held.release([held], delay=self.stop_release_delay)
                else:
                    inbox.put(held)
            self.wake()
            if messages and len(messages) < most and self.busy():
                # Messages are coming in one by one while jobs run: let a few more arrive, so
                # that the next receive (and the start of what it brings) is fuller.
                self.stop_event.wait(self.max_wait_seconds)

    # ------------------------------------------------------------------ taking
    def backlog(self) -> int:
        """Messages received and not yet taken."""
        return sum(q.qsize() for q in self.inboxes.values())

    def wait(self, timeout: float) -> None:
        """Wait up to ``timeout`` seconds for a message in hand (or the stop)."""
        deadline = time.monotonic() + timeout
        with self.arrived:
            while not self.backlog() and not self.stop_event.is_set():
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self.arrived.wait(left)

    def take(self, max_items: int, gather_seconds: float) -> list[Held]:
        """Up to ``max_items`` messages in hand by the priority rule, after waiting up to
        ``gather_seconds`` for that many to arrive."""
        held: list[Held] = []
        if not self.backlog() or self.stop_event.is_set():
            return held
        gather_until = time.monotonic() + gather_seconds
        while self.backlog() < max_items and time.monotonic() < gather_until:
            time.sleep(0.005)
        while len(held) < max_items and not self.stop_event.is_set():
            h = self.next_held()
            if h is None:
                break
            held.append(h)
        return held

    def next_held(self) -> Held | None:
        """The next message by the priority rule (see the module docstring)."""
        order = [p for p in CLASSES if p in self.inboxes]
        waiting = [p for p in order if self.inboxes[p].qsize()]
        if not waiting:
            return None
        pick = waiting[0]
        lower = waiting[1:]
        self._admitted += 1
        if lower and self._admitted % self.LOWER_CLASS_EVERY == 0:
            pick = lower[self._lower_turn % len(lower)]
            self._lower_turn += 1
        try:
            return self.inboxes[pick].get_nowait()
        except queue.Empty:
            return None

    def drain(self) -> list[Held]:
        """Empty the inboxes: the messages received and never taken."""
        pending: list[Held] = []
        for inbox in self.inboxes.values():
            while True:
                try:
                    pending.append(inbox.get_nowait())
                except queue.Empty:
                    break
        return pending
