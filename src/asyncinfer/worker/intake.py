"""The worker's intake: receive from SQS only as many messages as the worker can start now,
from the priority classes (high, normal, low) that have their own queue, and hand them to the
next take.

Receive by capacity. The worker's capacity is the number of jobs its handler runs at once (its
free batch slots for a handler that runs a batch as one step; one for a handler that runs items
one at a time: :attr:`~asyncinfer.models.base.ModelHandler.batching`). One intake thread
receives while the worker has room (capacity less the jobs running and the messages in hand),
never more than that room: a message the worker could not start stays in the queue, visible to
every other worker (a busy worker reserving messages that an idle one could run is the prefetch
problem of Celery's ``worker_prefetch_multiplier``). The messages in hand wait at most for the
gather window of the next take; their visibility is extended like the running jobs' and they are
released when the worker stops.

Polling. With one class, a long poll of ``receive_wait_seconds`` (SQS ReceiveMessage
WaitTimeSeconds). With several: a sweep of short receives (WaitTimeSeconds 0) over the classes
in priority order, up to the room; when a sweep finds nothing, long polls of
:data:`SWEEP_WAIT_SECONDS` on one class after another until one brings messages, then sweeps
again. (An SQS receive reads one queue; parallel long polls on every class would receive up to
the room from each, more than the worker can start.)

Priorities: a sweep receives from the highest class first, except that every fifth sweep starts
with a lower class (normal and low in turn), so while a higher class has backlog the lower
classes still get at least one receive in five (one job in five for a one-at-a-time handler)
and are never starved.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from typing import Any

from asyncinfer.worker.held import HeldMessages
from asyncinfer.worker.inflight import Held

log = logging.getLogger("asyncinfer.worker")

#: The priority classes, highest first.
CLASSES = ("high", "normal", "low")
#: With several classes, the long poll of one class while every class is empty, seconds: a job
#: of another class that arrives meanwhile waits at most about this long times the classes.
SWEEP_WAIT_SECONDS = 2
#: Most messages of one SQS ReceiveMessage call.
SQS_RECEIVE_MAX = 10


class Intake:
    """Receives messages for one worker, up to its room, and hands them out by priority.

    Args:
        held: the held messages (the SQS client, and where a received message is held).
        queues: ``{priority: queue URL}``, highest class first.
        capacity: most jobs the worker runs at once.
        running: how many jobs run now (taken, not finished).
        stop_event: set when the worker takes no more work.
        receive_max: most messages a receive asks for (at most 10, the SQS limit).
        receive_wait_seconds: the long poll's wait, seconds.
        max_wait_seconds: the gather window, seconds.
        stop_release_delay: how long a message received after the stop stays hidden, seconds.
        ready: whether the handler can start jobs now (:meth:`ModelHandler.ready`); while it
            is ``False`` the room is 0 and nothing is received.
    """

    #: One sweep in this many starts with a lower class.
    LOWER_CLASS_EVERY = 5

    def __init__(
        self,
        held: HeldMessages,
        queues: dict[str, str],
        *,
        capacity: int,
        running: Callable[[], int],
        stop_event: threading.Event,
        receive_max: int,
        receive_wait_seconds: int,
        max_wait_seconds: float,
        stop_release_delay: float,
        ready: Callable[[], bool] | None = None,
    ) -> None:
        self.held = held
        self.queues = queues
        self.capacity = capacity
        self.running = running
        self.stop_event = stop_event
        self.receive_max = receive_max
        self.receive_wait_seconds = receive_wait_seconds
        self.max_wait_seconds = max_wait_seconds
        self.stop_release_delay = stop_release_delay
        self.ready = ready
        self.inboxes: dict[str, queue.Queue[Held]] = {p: queue.Queue() for p in queues}
        self.arrived = threading.Condition()
        #: Messages taken out of the inboxes whose starts are being written: they count against
        #: the room until :meth:`started` (or the intake would receive one more for each).
        self.starting = 0
        self._sweeps = 0  # sweeps so far (every fifth starts with a lower class)
        self._lower_turn = 0
        self._idle_turn = 0
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------ room
    def room(self) -> int:
        """How many more messages the worker may receive now: capacity less the jobs running
        and the messages in hand; 0 while the handler is not ready."""
        if self.ready is not None and not self.ready():
            return 0
        return self.capacity - self.running() - self.backlog() - self.starting

    def backlog(self) -> int:
        """Messages received and not yet taken."""
        return sum(q.qsize() for q in self.inboxes.values())

    # ------------------------------------------------------------------ the thread
    def start(self) -> None:
        """Start the intake thread."""
        self._thread = threading.Thread(target=self.loop, name="intake", daemon=True)
        self._thread.start()

    def join(self, timeout: float) -> None:
        """Wait up to ``timeout`` seconds for the intake thread (a long poll in flight may still
        return messages: they are released with the rest)."""
        if self._thread is not None:
            self._thread.join(timeout=timeout)

    def wake(self) -> None:
        """Wake whoever waits for messages (the stop)."""
        with self.arrived:
            self.arrived.notify_all()

    def loop(self) -> None:
        """Receive until the stop, never more than the room."""
        swept_empty = False
        while not self.stop_event.is_set():
            room = self.room()
            if room <= 0:
                time.sleep(0.01)
                continue
            try:
                if len(self.queues) == 1:
                    (url,) = self.queues.values()
                    got = self._receive(url, room, self.receive_wait_seconds)
                elif swept_empty:
                    order = list(self.queues)
                    url = self.queues[order[self._idle_turn % len(order)]]
                    self._idle_turn += 1
                    wait = min(self.receive_wait_seconds, SWEEP_WAIT_SECONDS)
                    got = self._receive(url, room, wait)
                else:
                    got = self._sweep(room)
                swept_empty = got == 0
            except Exception:
                if self.stop_event.is_set():
                    return
                log.exception("receive failed; retrying in 1s")
                time.sleep(1)
                continue
            self.wake()
            if got and got < min(room, self.receive_max) and self.running():
                # Messages are coming in one by one while jobs run: let a few more arrive, so
                # that the next receive (and the start of what it brings) is fuller.
                self.stop_event.wait(self.max_wait_seconds)

    def _sweep(self, room: int) -> int:
        """Short receives over the classes by the priority rule, up to ``room`` in all: highest
        class first, except that every fifth sweep starts with a lower class (normal and low in
        turn)."""
        classes = [p for p in CLASSES if p in self.queues]
        self._sweeps += 1
        if len(classes) > 1 and self._sweeps % self.LOWER_CLASS_EVERY == 0:
            lower = classes[1:]
            turn = self._lower_turn % len(lower)
            self._lower_turn += 1
            classes = lower[turn:] + lower[:turn] + classes[:1]
        got = 0
        for p in classes:
            if got >= room or self.stop_event.is_set():
                break
            got += self._receive(self.queues[p], room - got, 0)
        return got

    def _receive(self, url: str, most: int, wait: int) -> int:
        """One ReceiveMessage call for up to ``most`` (and ``receive_max``) messages: each is
        held and put in its class's inbox (released at once, hidden for one receive wait, when
        the worker stopped meanwhile). Returns how many came."""
        priority = next(p for p, u in self.queues.items() if u == url)
        resp: dict[str, Any] = self.held.sqs.receive_message(
            QueueUrl=url,
            MaxNumberOfMessages=max(1, min(most, self.receive_max)),
            WaitTimeSeconds=wait,
            MessageSystemAttributeNames=["ApproximateReceiveCount"],
        )
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
                self.inboxes[priority].put(held)
        return len(messages)

    # ------------------------------------------------------------------ taking
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
        """Up to ``max_items`` messages in hand, highest class first, after waiting up to
        ``gather_seconds`` for that many to arrive (the gather window of a batch). They count
        as starting until :meth:`started` is called with their number."""
        held: list[Held] = []
        if not self.backlog() or self.stop_event.is_set():
            return held
        gather_until = time.monotonic() + gather_seconds
        while self.backlog() < max_items and time.monotonic() < gather_until:
            if self.room() <= 0:
                break  # no more can come: the worker is full
            time.sleep(0.005)
        while len(held) < max_items and not self.stop_event.is_set():
            h = self.next_held()
            if h is None:
                break
            self.starting += 1
            held.append(h)
        return held

    def started(self, n: int) -> None:
        """``n`` messages of the last :meth:`take` are started (counted as running), deleted or
        released: they no longer count as starting."""
        self.starting -= n

    def next_held(self) -> Held | None:
        """The next message in hand, highest class first (the share of the lower classes was
        given when they were received)."""
        for p in CLASSES:
            inbox = self.inboxes.get(p)
            if inbox is not None:
                try:
                    return inbox.get_nowait()
                except queue.Empty:
                    continue
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
