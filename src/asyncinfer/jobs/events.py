"""Job events on the SNS topic (spec, "Events").

Body: ``{"type": "job.succeeded", "timestamp": "...", "data": <job object>}``; message attributes
``event_type``, ``model``, ``tenant``, ``status`` (String), for subscription filter policies.
"""

from __future__ import annotations

import json
from typing import Any

from asyncinfer import clients, lifecycle
from asyncinfer.chunks import chunked
from asyncinfer.jobs.view import render_job
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

    def _entry(self, record: dict[str, Any]) -> dict[str, Any]:
        event = event_for(record, self.payloads)
        attrs = {
            "event_type": event["type"],
            "model": record["model"],
            "tenant": record["tenant"],
            "status": record["status"],
        }
        return {
            "Message": json.dumps(event, separators=(",", ":"), ensure_ascii=False),
            "MessageAttributes": {
                k: {"DataType": "String", "StringValue": v} for k, v in attrs.items()
            },
        }

    def publish(self, record: dict[str, Any]) -> None:
        """Publish the event of ``record``'s current status."""
        self.sns.publish(TopicArn=self.settings.topic_arn, **self._entry(record))

    def publish_many(self, records: list[dict[str, Any]]) -> None:
        """Publish the events of ``records`` with PublishBatch: up to 10 entries and 256 KiB a
        call (SNS API reference, "PublishBatch"). Raises if SNS refuses any entry."""
        entries = [self._entry(r) for r in records]
        sizes = [_entry_size(e) for e in entries]
        for batch in chunked(
            entries, sizes, max_items=PUBLISH_BATCH_MAX, max_bytes=PUBLISH_BATCH_BYTES
        ):
            self._publish_batch(batch)

    def _publish_batch(self, batch: list[dict[str, Any]]) -> None:
        if len(batch) == 1:
            self.sns.publish(TopicArn=self.settings.topic_arn, **batch[0])
            return
        resp = self.sns.publish_batch(
            TopicArn=self.settings.topic_arn,
            PublishBatchRequestEntries=[{"Id": str(n), **e} for n, e in enumerate(batch)],
        )
        failed = resp.get("Failed") or []
        if failed:
            raise RuntimeError(f"SNS refused {len(failed)} of {len(batch)} events: {failed[:2]}")


#: PublishBatch limits: 10 entries, 262144 bytes of messages and attributes in all.
PUBLISH_BATCH_MAX = 10
PUBLISH_BATCH_BYTES = 262_144 - 4_096


def _entry_size(entry: dict[str, Any]) -> int:
    attrs = sum(
        len(k) + len("String") + len(v["StringValue"].encode())
        for k, v in entry["MessageAttributes"].items()
    )
    return len(entry["Message"].encode()) + attrs
