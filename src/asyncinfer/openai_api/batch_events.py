"""A batch's end event (spec openai.md, "Events").

Published on the events topic with api.md's message attributes (``event_type`` the type,
``model`` the batch's model, ``tenant``, ``status``), in OpenAI's webhook event shape
``{"id": "evt_...", "object": "event", "created_at", "type", "data": {"id": "batch_..."}}``
(its webhooks guide, "Event types"). The webhook dispatcher sends that body unchanged to a batch
created with the ``webhook`` extension, signed per Standard Webhooks with the tenant's secret,
so ``openai.OpenAI(...).webhooks.unwrap(body, headers, secret=...)`` accepts it.
"""

from __future__ import annotations

import hashlib
import json
import time
from typing import Any

from asyncinfer.aws import clients
from asyncinfer.core import topology
from asyncinfer.core.settings_parts import OpenAISettings

#: Batch status -> event type.
EVENT_FOR_STATUS = {
    "completed": "batch.completed",
    "failed": "batch.failed",
    "expired": "batch.expired",
    "cancelled": "batch.cancelled",
}
BATCH_EVENTS = tuple(EVENT_FOR_STATUS.values())


def batch_event(record: dict[str, Any]) -> dict[str, Any]:
    """The event body of an ended batch ``record`` (its id is the same for every publication of
    one batch's end, so receivers can deduplicate)."""
    etype = EVENT_FOR_STATUS[record["status"]]
    digest = hashlib.sha256(f"{record['job_id']}\0{etype}".encode()).hexdigest()[:24]
    return {
        "id": f"evt_{digest}",
        "object": "event",
        "created_at": int(record.get(f"{record['status']}_at") or time.time()),
        "type": etype,
        "data": {"id": record["job_id"]},
    }


def publish_batch_event(settings: OpenAISettings, record: dict[str, Any]) -> dict[str, Any]:
    """Publish the end event of ``record`` on the topic; returns the body."""
    event = batch_event(record)
    attrs = {
        "event_type": event["type"],
        "model": str(record.get("model") or "batch"),
        "tenant": str(record["owner"]),
        "status": str(record["status"]),
        topology.WEBHOOK_ATTRIBUTE: "true" if record.get("webhook") else "false",
    }
    clients.client("sns", settings).publish(
        TopicArn=settings.topic_arn,
        Message=json.dumps(event, separators=(",", ":")),
        MessageAttributes={k: {"DataType": "String", "StringValue": v} for k, v in attrs.items()},
    )
    return event
