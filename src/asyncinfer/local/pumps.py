"""The local stack's pumps: the daemon threads that play AWS's event source mappings and
schedules (the DLQ handler and the webhook dispatcher fed SQS events, the expiry sweeper every
:data:`SWEEP_SECONDS`) and print one line per job event from the event-log queue.

Each pump checks the stop event between rounds, so none starts work once the stack stops; a
Lambda invocation already in progress ends with the pool (:meth:`LambdaPool.close`: abandoned
at its deadline, which releases the pump)."""

from __future__ import annotations

import json
import logging
import threading
import time

from asyncinfer import clients
from asyncinfer.local.event_source import pump_once
from asyncinfer.local.lambda_runtime import LambdaPool
from asyncinfer.local.resources import Resources
from asyncinfer.settings import Settings
from asyncinfer.sweeper import expire_due

log = logging.getLogger("asyncinfer.local")

DLQ_HANDLER = "asyncinfer.dlq:lambda_handler"
WEBHOOK_HANDLER = "asyncinfer.webhooks.dispatcher:lambda_handler"
#: How often the expiry sweeper runs on the local stack, seconds.
SWEEP_SECONDS = 5.0


class Pumps:
    """The stack's background loops, until ``stop_event`` is set.

    Args:
        settings: the stack's settings (its emulator endpoint and resources).
        resources: the queues the pumps read.
        pool: where the handlers run.
        stop_event: set when the stack stops.
    """

    def __init__(
        self,
        settings: Settings,
        resources: Resources,
        pool: LambdaPool,
        stop_event: threading.Event,
    ) -> None:
        self.settings = settings
        self.resources = resources
        self.pool = pool
        self.stop_event = stop_event

    def start(self) -> None:
        """Start every loop in a daemon thread."""
        for name, target in (
            ("events", self._event_log_loop),
            ("dlq", self._dlq_loop),
            ("sweeper", self._sweep_loop),
            ("webhooks", self._webhook_loop),
        ):
            threading.Thread(target=target, name=name, daemon=True).start()

    def _event_log_loop(self) -> None:
        while not self.stop_event.is_set():
            try:
                self.print_events(wait=1)
            except Exception:
                if self.stop_event.is_set():
                    return
                time.sleep(1)

    def print_events(self, wait: int) -> int:
        """Print one line per job event waiting in the event-log queue; returns how many."""
        sqs = clients.client("sqs", self.settings)
        url = self.resources.event_log_queue
        resp = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=wait)
        msgs = resp.get("Messages", [])
        for m in msgs:
            try:
                event = json.loads(m["Body"])
                job = event["data"]
                extra = f" error={job['error'].get('code')}" if job.get("error") else ""
                print(
                    f"{event['timestamp']} {event['type']:<14} {job['id']} "
                    f"model={job['model']} attempts={job['attempts']}{extra}",
                    flush=True,
                )
            except (ValueError, KeyError, TypeError, AttributeError):
                log.warning("unreadable event: %.200s", m.get("Body"))
        if msgs:
            sqs.delete_message_batch(
                QueueUrl=url,
                Entries=[
                    {"Id": str(n), "ReceiptHandle": m["ReceiptHandle"]} for n, m in enumerate(msgs)
                ],
            )
        return len(msgs)

    def _sweep_loop(self) -> None:
        """The expiry sweeper, every few seconds (a scheduled Lambda in AWS)."""
        while not self.stop_event.wait(SWEEP_SECONDS):
            try:
                expire_due(self.settings)
            except Exception:
                log.exception("expiry sweep failed")

    def _dlq_loop(self) -> None:
        """Feed each dead-letter queue's messages to the DLQ Lambda handler as SQS events."""
        sqs = clients.client("sqs", self.settings)
        pool = self.pool
        while not self.stop_event.is_set():
            for url in self.resources.dlqs.values():
                if self.stop_event.is_set():
                    return
                try:
                    pump_once(sqs, url, lambda ev: pool.invoke(DLQ_HANDLER, ev, "dlq"))
                except Exception:
                    if self.stop_event.is_set():
                        return
                    log.exception("DLQ handler failed")
                    time.sleep(1)

    def _webhook_loop(self) -> None:
        """Feed the webhook queue's messages to the webhook dispatcher Lambda handler as SQS
        events, as the event source mapping does in AWS (see asyncinfer.local.event_source)."""
        pool, url = self.pool, self.resources.webhook_queue
        sqs = clients.client("sqs", self.settings)
        while not self.stop_event.is_set():
            try:
                pump_once(sqs, url, lambda ev: pool.invoke(WEBHOOK_HANDLER, ev, "webhooks"))
            except Exception:
                if self.stop_event.is_set():
                    return
                log.exception("webhook dispatcher failed")
                time.sleep(1)
