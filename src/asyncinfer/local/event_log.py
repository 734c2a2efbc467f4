"""The local stack's event printer: one terminal line per event of the topic, read from an SQS
queue subscribed to it (as a user's subscription would be)."""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime
from typing import Any

log = logging.getLogger("asyncinfer.local")


def emit_line(line: str) -> None:
    """Write ``line`` and its newline to stdout in one write, then flush. Workers share this
    stdout: ``print`` (unbuffered, as under ``PYTHONUNBUFFERED=1``) writes the text and the
    newline separately, and a worker's log line written in between was glued onto an event
    line (``... attempts=1`` + ``2026-12-01 ...``), which misled readers of the event log."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def event_line(event: dict[str, Any]) -> str:
    """The stack's terminal line of one event of the topic: a job event (api.md, "Events":
    ``{"type", "timestamp", "data": <job>}``) or a batch event (openai.md, "Events": OpenAI's
    ``{"object": "event", "type", "created_at", "data": {"id"}}``). Raises ``KeyError`` /
    ``TypeError`` for anything else."""
    if event.get("object") == "event":
        when = datetime.fromtimestamp(int(event["created_at"]), tz=UTC)
        return f"{when.strftime('%Y-%m-%dT%H:%M:%SZ')} {event['type']:<14} {event['data']['id']}"
    job = event["data"]
    extra = f" error={job['error'].get('code')}" if job.get("error") else ""
    return (
        f"{event['timestamp']} {event['type']:<14} {job['id']} "
        f"model={job['model']} attempts={job['attempts']}{extra}"
    )


def print_events(sqs: Any, url: str, wait: int) -> int:
    """Print one line per event waiting in the event-log queue ``url`` (ReceiveMessage waiting
    up to ``wait`` seconds), then delete them; returns how many. An unreadable body is logged
    and deleted with the rest."""
    resp = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=wait)
    msgs = resp.get("Messages", [])
    for m in msgs:
        try:
            emit_line(event_line(json.loads(m["Body"])))
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
