"""The messages a worker holds: their visibility (heartbeat extensions, releases) and the
batched deletion of finished ones.

SQS requests: ChangeMessageVisibilityBatch and DeleteMessageBatch, up to 10 entries a call
(the SQS batch limit), grouped by queue.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from typing import Any

from asyncinfer.worker.inflight import Held, InFlight

log = logging.getLogger("asyncinfer.worker")

#: Finished jobs' messages are deleted in batches: when 10 are pending, once the oldest has
#: waited this long, seconds, or at once when the worker has no job in progress (a message not
#: yet deleted stays invisible under the heartbeat; a redelivery finds its job terminal and
#: deletes it).
DELETE_FLUSH_SECONDS = 5.0
#: Most entries of one SQS batch request.
SQS_BATCH = 10


def by_queue(held: Iterable[Held]) -> dict[str, list[Held]]:
    """``held`` grouped by the queue each message came from."""
    out: dict[str, list[Held]] = {}
    for h in held:
        out.setdefault(h.queue_url, []).append(h)
    return out


class HeldMessages:
    """The held messages of one worker and the SQS requests on them.

    Args:
        sqs: a boto3 SQS client (or a stub with the same methods).
        before_delete: called before a batch of deletes (writes the pending terminal records
            and publishes their events; a message is queued for deletion only once its event
            is out).
        inflight: the set of held messages (default: a new one).
    """

    def __init__(
        self,
        sqs: Any,
        *,
        before_delete: Callable[[], None] = lambda: None,
        inflight: InFlight | None = None,
    ) -> None:
        self.sqs = sqs
        self.inflight = inflight or InFlight()
        self.before_delete = before_delete
        # Appended to without the lock: taking the list over (``a, self.a = self.a, []``)
        # loses no append.
        self.to_delete: list[Held] = []
        self._delete_since = 0.0

    def hold(self, held: Held) -> None:
        """Start holding ``held``: heartbeats extend its visibility from now on."""
        self.inflight.add(held)

    def change_visibility(self, held: Iterable[Held], seconds: float) -> None:
        """Set the visibility timeout of ``held`` to ``seconds`` from now (raises on an AWS
        fault; entries SQS refuses are logged)."""
        for url, group in by_queue(held).items():
            for i in range(0, len(group), SQS_BATCH):
                chunk = group[i : i + SQS_BATCH]
                resp = self.sqs.change_message_visibility_batch(
                    QueueUrl=url,
                    Entries=[
                        {
                            "Id": str(n),
                            "ReceiptHandle": h.receipt,
                            "VisibilityTimeout": int(seconds),
                        }
                        for n, h in enumerate(chunk)
                    ],
                )
                for f in resp.get("Failed", []):
                    log.warning("visibility change failed: %s", f)

    def release(self, held: Iterable[Held], delay: float = 0) -> None:
        """Make messages visible again after ``delay`` seconds and stop holding them (an AWS
        fault is logged: they reappear after their visibility timeout)."""
        held = list(held)
        try:
            self.change_visibility(held, delay)
        except Exception:
            log.exception("could not release messages; they reappear after the timeout")
        for h in held:
            self.inflight.drop(h.message_id)

    def forget(self, held: Held) -> None:
        """Stop holding a message without any SQS call: no more visibility extensions, no
        delete, no release (its receipt handle may be stale: another worker holds it now)."""
        self.inflight.drop(held.message_id)

    def delete_later(self, held: Held) -> None:
        """Queue a message for the next batch of deletes."""
        if not self.to_delete:
            self._delete_since = time.monotonic()
        self.to_delete.append(held)

    def flush_deletes_due(self) -> None:
        """Delete the finished messages when 10 are pending or the oldest waited
        :data:`DELETE_FLUSH_SECONDS`."""
        if self.to_delete and (
            len(self.to_delete) >= SQS_BATCH
            or time.monotonic() - self._delete_since >= DELETE_FLUSH_SECONDS
        ):
            self.flush_deletes()

    def flush_deletes(self) -> None:
        """Delete finished messages, up to 10 per DeleteMessageBatch call, after
        ``before_delete`` (a job's terminal write and event go before its message's deletion:
        a message is queued for deletion only once its event is out). ``before_delete`` takes
        the write lock itself for its writes and publishes without it."""
        self.before_delete()
        held, self.to_delete = self.to_delete, []
        for url, group in by_queue(held).items():
            for i in range(0, len(group), SQS_BATCH):
                chunk = group[i : i + SQS_BATCH]
                resp = self.sqs.delete_message_batch(
                    QueueUrl=url,
                    Entries=[
                        {"Id": str(n), "ReceiptHandle": h.receipt} for n, h in enumerate(chunk)
                    ],
                )
                for f in resp.get("Failed", []):
                    log.error("delete failed: %s", f)
        for h in held:
            self.inflight.drop(h.message_id)
