"""Job events on the SNS topic (spec, "Events").

Body: ``{"type": "job.succeeded", "timestamp": "...", "data": <job object>}``; message attributes
``event_type``, ``model``, ``tenant``, ``status`` (String), for subscription filter policies.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from asyncinfer.aws import clients
from asyncinfer.aws.payloads import PayloadStore
from asyncinfer.core import lifecycle, topology
from asyncinfer.core.chunks import chunked
from asyncinfer.core.settings_needs import EventsConfig
from asyncinfer.core.timeutil import iso, now
from asyncinfer.jobs import outbox
from asyncinfer.jobs.record import JobRecord
from asyncinfer.jobs.view import render_job

if TYPE_CHECKING:
    from asyncinfer.jobs.store import JobStore


def event_for(record: JobRecord, payloads: PayloadStore | None = None) -> dict[str, Any]:
    """The event body for ``record``'s current status."""
    return {
        "type": lifecycle.EVENT_FOR_STATUS[record["status"]],
        "timestamp": iso(now()),
        "data": render_job(record, payloads),
    }


class EventPublisher:
    """Publishes one event per job transition to the topic of ``settings``, and removes each
    published event from its record's outbox (:mod:`asyncinfer.jobs.outbox`; ``store``: the job
    table, made from ``settings`` when first needed)."""

    def __init__(
        self,
        settings: EventsConfig,
        payloads: PayloadStore | None = None,
        store: JobStore | None = None,
        *,
        defer_started: bool = False,
    ) -> None:
        self.settings = settings
        self.sns = clients.client("sns", settings)
        self.payloads = payloads or PayloadStore(settings)
        self._store = store
        #: Leave ``job.started`` keys in the outbox after publishing them: the worker's terminal
        #: write of the attempt removes them (:class:`~asyncinfer.worker.journal.Journal`).
        self.defer_started = defer_started

    @property
    def store(self) -> JobStore:
        """The job table whose outboxes the publisher clears."""
        if self._store is None:
            from asyncinfer.jobs.store import JobStore

            self._store = JobStore(self.settings)
        return self._store

    def _cleared(self, record: JobRecord, keys: list[str] | None = None) -> None:
        """After a publish: remove the event's keys (``keys``, else those of the record's
        status) from the record's outbox. Never raises."""
        if keys is None:
            if self.defer_started and record["status"] == lifecycle.RUNNING:
                return
            keys = outbox.pending_keys(record, lifecycle.EVENT_FOR_STATUS[record["status"]])
        if keys:
            outbox.clear(self.store, record["job_id"], keys)

    def _entry(self, record: JobRecord) -> dict[str, Any]:
        event = event_for(record, self.payloads)
        attrs = {
            "event_type": event["type"],
            "model": record["model"],
            "tenant": record["tenant"],
            "status": record["status"],
            topology.WEBHOOK_ATTRIBUTE: "true" if record.get("webhook") else "false",
        }
        return {
            "Message": json.dumps(event, separators=(",", ":"), ensure_ascii=False),
            "MessageAttributes": {
                k: {"DataType": "String", "StringValue": v} for k, v in attrs.items()
            },
        }

    def publish(self, record: JobRecord, *, keys: list[str] | None = None) -> None:
        """Publish the event of ``record``'s current status, then clear it from the record's
        outbox (``keys``: the outbox keys it stands for; default: the record's pending keys of
        that event type). Raises what SNS raises (the event then stays pending)."""
        self.sns.publish(TopicArn=self.settings.topic_arn, **self._entry(record))
        self._cleared(record, keys)

    def publish_many(self, records: list[JobRecord], *, clear: bool = True) -> None:
        """Publish the events of ``records`` with PublishBatch: up to 10 entries and 256 KiB a
        call (SNS API reference, "PublishBatch"), then remove them from their records'
        outboxes (``clear=False``: the caller does, as the bulk submit's confirm). Raises if
        SNS refuses any entry (nothing is cleared then)."""
        entries = [self._entry(r) for r in records]
        sizes = [_entry_size(e) for e in entries]
        for batch in chunked(
            entries, sizes, max_items=PUBLISH_BATCH_MAX, max_bytes=PUBLISH_BATCH_BYTES
        ):
            self._publish_batch(batch)
        if clear:
            for record in records:
                self._cleared(record)

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
