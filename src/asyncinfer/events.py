"""Job events on the SNS topic (spec, "Events").

Body: ``{"type": "job.succeeded", "timestamp": "...", "data": <job object>}``; message attributes
``event_type``, ``model``, ``tenant``, ``status`` (String), for subscription filter policies.
"""

from __future__ import annotations

import json
from typing import Any

from asyncinfer import clients, lifecycle
from asyncinfer.jobview import render_job
from asyncinfer.payloads import PayloadStore
from asyncinfer.settings import Settings
from asyncinfer.timeutil import iso, now


def event_for(record: dict[str, Any], payloads: PayloadStore | None = None) -> dict[str, Any]:
    """The event body for ``record``'s current status."""
    return {
        "type": lifecycle.EVENT_FOR_STATUS[record["status"]],
        "timestamp": iso(now()),
        "data": render_job(record, payloads),
    }


class EventPublisher:
    """Publishes one event per job transition to the topic of ``settings``."""

    def __init__(self, settings: Settings, payloads: PayloadStore | None = None) -> None:
        self.settings = settings
        self.sns = clients.client("sns", settings)
        self.payloads = payloads or PayloadStore(settings)

    def publish(self, record: dict[str, Any]) -> dict[str, Any]:
        """Publish the event of ``record``'s current status; returns the event body."""
        event = event_for(record, self.payloads)
        attrs = {
            "event_type": event["type"],
            "model": record["model"],
            "tenant": record["tenant"],
            "status": record["status"],
        }
        self.sns.publish(
            TopicArn=self.settings.topic_arn,
            Message=json.dumps(event, separators=(",", ":"), ensure_ascii=False),
            MessageAttributes={
                k: {"DataType": "String", "StringValue": v} for k, v in attrs.items()
            },
        )
        return event
