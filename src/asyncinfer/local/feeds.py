"""The local stack's function wiring: what feeds each Lambda handler on this machine.

In AWS, event source mappings hand the SQS-triggered functions their batches and a schedule runs
the sweeper. Here a thread per queue (group) polls it and invokes the same handler in the stack's
:class:`~asyncinfer.local.lambda_runtime.LambdaPool` with the event its Lambda would get, in the
batch size of the function's trigger in :mod:`asyncinfer.core.topology`; the sweeper runs in
this process every ``sweep_seconds`` with its part of the settings.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from asyncinfer.aws import clients
from asyncinfer.core import topology
from asyncinfer.core.settings_needs import AwsConfig
from asyncinfer.core.settings_parts import SweeperSettings
from asyncinfer.functions.sweeper import sweep
from asyncinfer.local.event_source import pump_once
from asyncinfer.local.lambda_runtime import LambdaPool
from asyncinfer.local.resources import Resources

log = logging.getLogger("asyncinfer.local")

DLQ_HANDLER = "asyncinfer.functions.dlq:handler"
WEBHOOK_HANDLER = "asyncinfer.functions.webhook_dispatcher:handler"
BATCH_HANDLER = "asyncinfer.openai_api.expansion:handler"
BATCH_EVENTS_HANDLER = "asyncinfer.openai_api.finalize:handler"


def sweep_loop(stop: threading.Event, settings: SweeperSettings) -> None:
    """The sweeper (expiry, lease takeover, lost hand-backs, pending events: one
    :func:`~asyncinfer.functions.sweeper.sweep`, each step isolated) every
    ``settings.sweep_seconds`` until ``stop`` is set (a scheduled Lambda in AWS); a failed sweep
    is logged."""
    while not stop.wait(settings.sweep_seconds):
        try:
            sweep(settings)
        except Exception:
            log.exception("sweep failed")


def feed_loop(
    stop: threading.Event,
    sqs: Any,
    urls: Sequence[str],
    invoke: Callable[[dict[str, Any]], Any],
    *,
    batch_size: int,
    name: str,
) -> None:
    """Until ``stop`` is set, hand the messages of each queue of ``urls`` to ``invoke`` as SQS
    events of at most ``batch_size`` records (:func:`~asyncinfer.local.event_source.pump_once`:
    the records the handler reports failed stay for their retry). A failure is logged as
    ``name``'s and the loop pauses a second."""
    while not stop.is_set():
        for url in urls:
            if stop.is_set():
                return
            try:
                pump_once(sqs, url, invoke, batch_size=batch_size)
            except Exception:
                if stop.is_set():
                    return
                log.exception("%s handler failed", name)
                time.sleep(1)


def start_feeds(
    stop: threading.Event,
    pool: LambdaPool,
    resources: Resources,
    aws: AwsConfig,
    sweeper: SweeperSettings,
) -> list[threading.Thread]:
    """Start the daemon threads that feed the DLQ handler (every dead-letter queue), the webhook
    dispatcher, the OpenAI batch expander and batch-line counter, and run the sweeper; returns
    them. ``aws``: where this process's SQS client connects (the emulator)."""
    sqs = clients.client("sqs", aws)

    def handler(target: str, name: str) -> Callable[[dict[str, Any]], Any]:
        return lambda event: pool.invoke(target, event, name)

    feeds: list[tuple[str, Sequence[str], str, str]] = [
        ("dlq", list(resources.dlqs.values()), DLQ_HANDLER, "dlq"),
        ("webhooks", [resources.webhook_queue], WEBHOOK_HANDLER, "webhooks"),
    ]
    for code, url, target in (
        ("openai_batches", resources.batch_queue, BATCH_HANDLER),
        ("openai_batch_counter", resources.batch_events_queue, BATCH_EVENTS_HANDLER),
    ):
        feeds.append((code, [url], target, topology.FUNCTIONS[code].sqs_trigger().queue))
    threads = [threading.Thread(target=sweep_loop, args=(stop, sweeper), name="sweeper")]
    for code, urls, target, name in feeds:
        size = topology.FUNCTIONS[code].sqs_trigger().batch_size
        kwargs = {"batch_size": size, "name": name}
        args = (stop, sqs, urls, handler(target, name))
        threads.append(threading.Thread(target=feed_loop, args=args, kwargs=kwargs, name=name))
    for t in threads:
        t.daemon = True
        t.start()
    return threads
