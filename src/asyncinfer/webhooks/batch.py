"""One SQS batch of webhook events, delivered side by side within the Lambda's time.

The events of one batch belong to any tenants, so they are never sent one after another: a
receiver that takes its whole 10 s would hold back every event behind it. Each record gets a
thread of its own and the same time budget:

* its attempt must be over by ``send_deadline``: ``attempt_seconds`` (10 s) from the start, or
  sooner when the Lambda has less time left than that plus :data:`BOOKKEEPING_SECONDS` (the
  writes after the attempt; a third of the time left when that is less) plus
  :data:`RETURN_MARGIN_SECONDS`;
* the batch answers at ``batch_deadline`` at the latest (the Lambda's remaining time less
  :data:`RETURN_MARGIN_SECONDS`): a record still unfinished then, like one whose handler raised,
  is listed in ``batchItemFailures``, so SQS delivers it again after the queue's visibility
  timeout; nothing is lost and nothing waits for it.

Powertools' ``BatchProcessor`` processes records one after another (and its async variant cannot
bound a blocking call), hence this module; records are read with Powertools' ``SQSRecord``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import Any

from aws_lambda_powertools.utilities.data_classes.sqs_event import SQSRecord

log = logging.getLogger("asyncinfer.webhooks")

#: Seconds kept after an attempt's deadline for its bookkeeping (the job record's webhook state,
#: the message's next visibility) before the batch must answer.
BOOKKEEPING_SECONDS = 5.0
#: Seconds kept back from the Lambda's remaining time to return the answer.
RETURN_MARGIN_SECONDS = 1.0

#: ``deliver(record, send_deadline)``: raises to have the record retried.
Deliver = Callable[[SQSRecord, float], Any]


def batch_deadlines(
    remaining_seconds: float | None, attempt_seconds: float, *, start: float | None = None
) -> tuple[float, float]:
    """``(send_deadline, batch_deadline)``, ``time.monotonic()`` seconds.

    Args:
        remaining_seconds: the Lambda's remaining time (``None``: no limit but our own).
        attempt_seconds: the longest one attempt may take (the sender's timeout).
        start: now (monotonic), for tests.
    """
    t0 = time.monotonic() if start is None else start
    full = attempt_seconds + BOOKKEEPING_SECONDS
    budget = full if remaining_seconds is None else remaining_seconds - RETURN_MARGIN_SECONDS
    span = max(0.0, min(full, budget))
    batch_deadline = t0 + span
    send_deadline = min(t0 + attempt_seconds, batch_deadline - min(BOOKKEEPING_SECONDS, span / 3))
    return send_deadline, batch_deadline


def deliver_batch(
    records: Sequence[Mapping[str, Any]],
    deliver: Deliver,
    *,
    attempt_seconds: float,
    remaining_seconds: float | None = None,
    expected: tuple[type[BaseException], ...] = (),
) -> dict[str, list[dict[str, str]]]:
    """Deliver ``records`` (SQS event records) side by side; the partial batch response.

    Args:
        deliver: called as ``deliver(record, send_deadline)`` in a thread per record.
        attempt_seconds: the longest one attempt may take (the sender's timeout).
        remaining_seconds: the Lambda's remaining time (``None`` outside Lambda).
        expected: exceptions that are an ordinary failed attempt (logged briefly); others are
            logged with their traceback. Either way the record is retried.

    Returns:
        ``{"batchItemFailures": [{"itemIdentifier": messageId}, ...]}`` for the records whose
        ``deliver`` raised or had not returned by the batch deadline, in the batch's order.
    """
    if not records:
        return {"batchItemFailures": []}
    send_deadline, batch_deadline = batch_deadlines(remaining_seconds, attempt_seconds)
    if send_deadline <= time.monotonic():  # no time for any attempt: all back to the queue
        log.warning("no time left for %d webhook messages; retried", len(records))
        return {"batchItemFailures": [{"itemIdentifier": r["messageId"]} for r in records]}
    pool = ThreadPoolExecutor(max_workers=len(records), thread_name_prefix="webhook")
    futures: list[tuple[str, Future[Any]]] = []
    try:
        for raw in records:
            rec = SQSRecord(dict(raw))
            futures.append((rec.message_id, pool.submit(deliver, rec, send_deadline)))
        wait([f for _, f in futures], timeout=max(0.0, batch_deadline - time.monotonic()))
    finally:
        pool.shutdown(wait=False, cancel_futures=True)
    failed: list[dict[str, str]] = []
    for message_id, fut in futures:
        if not fut.done():
            log.warning("webhook message %s not done by the batch deadline; retried", message_id)
            failed.append({"itemIdentifier": message_id})
        elif fut.cancelled():
            failed.append({"itemIdentifier": message_id})
        elif (exc := fut.exception()) is not None:
            if isinstance(exc, expected):
                log.info("webhook message %s to be retried: %s", message_id, exc)
            else:
                log.error("webhook message %s failed; retried", message_id, exc_info=exc)
            failed.append({"itemIdentifier": message_id})
    return {"batchItemFailures": failed}
