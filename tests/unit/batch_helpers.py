"""Helpers of the OpenAI batch unit tests: upload a file, run the batch queue and the
batch-events queue through their Lambda handlers (moto in-process), and end line jobs as a
worker would (conditional transitions, then the job's event)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from asyncinfer.aws import clients
from asyncinfer.core.settings import Settings
from asyncinfer.core.timeutil import iso, now
from asyncinfer.jobs.events import EventPublisher
from asyncinfer.jobs.store import JobStore
from asyncinfer.local.event_source import pump_once
from asyncinfer.openai_api import expansion, finalize
from asyncinfer.openai_api.files import FileStore


def upload(settings: Settings, tenant: str, lines: list[Any]) -> str:
    """Store a ``purpose=batch`` file of ``lines`` (dicts become JSON, str/bytes as they are)."""
    out = []
    for ln in lines:
        if isinstance(ln, bytes):
            out.append(ln)
        elif isinstance(ln, str):
            out.append(ln.encode())
        else:
            out.append(json.dumps(ln).encode())
    files = FileStore(clients.client("s3", settings), settings.bucket)
    return files.create(tenant, b"\n".join(out) + b"\n", filename="in.jsonl", purpose="batch")["id"]


def chat_line(cid: str, model: str = "echo", **body: Any) -> dict[str, Any]:
    """One chat request line."""
    return {
        "custom_id": cid,
        "method": "POST",
        "url": "/v1/chat/completions",
        "body": {"model": model, "messages": [{"role": "user", "content": cid}], **body},
    }


def run_batch_queue(settings: Settings, rounds: int = 50) -> int:
    """Feed the batch queue to the expander until it is empty; returns the messages run."""
    sqs = clients.client("sqs", settings)
    total = 0
    for _ in range(rounds):
        n = pump_once(sqs, settings.batch_queue_url, lambda ev: expansion.handler(ev, None), wait=0)
        if not n:
            break
        total += n
    return total


def run_events(settings: Settings, rounds: int = 200) -> int:
    """Feed the batch-events queue to the counter until it is empty."""
    sqs = clients.client("sqs", settings)
    total = 0
    for _ in range(rounds):
        n = pump_once(
            sqs,
            settings.batch_events_queue_url,
            lambda ev: finalize.handler(ev, None),
            wait=0,
        )
        if not n:
            break
        total += n
    return total


def line_jobs(settings: Settings, tenant: str) -> list[dict[str, Any]]:
    """Every job record of ``tenant``."""
    store = JobStore(settings)
    out: list[dict[str, Any]] = []
    cursor = None
    while True:
        page, cursor = store.list_for_tenant(tenant, limit=100, cursor=cursor)
        out.extend(page)
        if not cursor:
            return out


def finish(
    settings: Settings,
    record: dict[str, Any],
    outcome: Callable[[dict[str, Any]], tuple[str, Any]],
) -> dict[str, Any] | None:
    """End a queued job as a worker would: ``outcome(record)`` gives ``("succeeded", output)``
    or ``("failed", error dict)``; publishes its event. Returns the ended record (``None`` if it
    was not queued)."""
    store = JobStore(settings)
    if record["status"] != "queued":
        return None
    running = store.transition(
        record["job_id"],
        from_status="queued",
        to_status="running",
        increment_attempts=True,
        set_fields={"started_at": iso(now())},
    )
    status, value = outcome(running)
    fields: dict[str, Any] = {"completed_at": iso(now())}
    if status == "succeeded":
        fields["output"] = json.dumps(value)
    else:
        fields["error"] = value
    ended = store.transition(
        record["job_id"],
        from_status="running",
        to_status=status,
        attempts=running["attempts"],
        set_fields=fields,
    )
    EventPublisher(settings).publish(ended)
    return ended


def echo_ok(record: dict[str, Any]) -> tuple[str, Any]:
    """A successful echo of the job's input (as the echo model answers)."""
    return "succeeded", {"text": "ok", "usage": {"prompt_tokens": 3, "completion_tokens": 2}}
