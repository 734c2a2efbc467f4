"""The bulk submit: many jobs written in a few AWS requests per hundred jobs instead of nine
requests per job (issue 15: the batch expander's lines). :meth:`JobService.submit` (the API
path) is unchanged; this writes the same records, messages and events with the same guarantees.

The jobs come checked and built (:meth:`JobService.prepare`: every input validated, sized and,
when over the inline limit, given its S3 ``input_ref``, before anything is written) with ids
the caller **derives** from what names the job (:func:`asyncinfer.core.ids.derived_job_id`:
the batch id and the line's ``custom_id``). The record's conditional create is then the claim:
a run made again (a crash, a duplicate message) finds the records it made and makes only the
missing ones, so no idempotency key items are needed. For one call of :meth:`BulkSubmitter.submit`
(at most a few hundred jobs):

1. **read**: the records that exist (BatchGetItem, 100 keys a call; strongly consistent, as
   every read here: a record a run wrote just before, its answer lost, must be found);
2. **inputs**: the S3 copies of the new jobs' inputs that their messages do not carry;
3. **records**: the new ones in TransactWriteItems calls of up to 100 conditional puts
   (:meth:`~asyncinfer.jobs.transact.BatchWriter.create_many`), with the same two-phase
   ``submitting_until`` as a single submit (``expires_epoch`` as short as the submit lease,
   or the caller's ``lease_seconds``, until the confirm), so a crash leaves no job ``queued``
   without a message for long: the expiry sweeper ends it. A transaction refused because some
   records exist is sent again without them (those are read back and treated as found);
4. **events**: ``job.queued`` of the jobs to send, PublishBatch (10 a call), before their
   messages, so that as few requests as can be lie between a job's message and its confirm
   (a worker that started the job meanwhile makes its confirm go alone);
5. **messages**: SendMessageBatch (10 entries and 256 KiB a call, each entry with the tenant's
   ``MessageGroupId``) for the new records and for found ones still ``submitting`` and
   ``queued`` at attempt 0 (a run that died before it confirmed them: their message may or may
   not be out, so it is sent again; a second message of a job is dropped by the worker, which
   starts a job at most once per attempt and deletes a message other than the one its attempt
   runs from: :mod:`asyncinfer.worker.recovery`). Failed entries are sent once more; those
   still failing make the call raise after the rest is confirmed (the caller runs it again;
   a job never sent ends ``expired`` by the sweeper if no run comes);
6. **confirm**: ``expires_epoch`` set, ``submitting_until`` removed and, when the events went
   out, the outbox removed in the same write (TransactWriteItems of up to 100 updates,
   :meth:`~asyncinfer.jobs.transact.BatchWriter.confirm_many`; one refused because a worker
   already started the job and added its ``job.started`` key is written alone, clearing only
   ``job.queued``). A crash before the confirm leaves the key: the outbox sweeper publishes
   the event again (at least once, as every event), and the re-run publishes it again too.

Requests per 100 jobs (inline inputs, one queue): 1 BatchGetItem + 1 TransactWriteItems + 10
SendMessageBatch + 10 PublishBatch + 1 TransactWriteItems: 23, about 0.23 a job.
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from typing import Any

from botocore.exceptions import ClientError

from asyncinfer.core import lifecycle
from asyncinfer.core.chunks import chunked
from asyncinfer.core.errors import InternalError
from asyncinfer.core.timeutil import parse
from asyncinfer.jobs.messages import MAX_MESSAGE_BYTES, JobMessage
from asyncinfer.jobs.record import JobRecord, event_key
from asyncinfer.jobs.service import JobService, Prepared
from asyncinfer.scaling.wake import wake_on_submit

log = logging.getLogger("asyncinfer.jobs.bulk")

#: SendMessageBatch: at most 10 entries and 256 KiB of bodies a call (SQS API Reference,
#: "SendMessageBatch"); calls are cut a little below.
SEND_BATCH_MAX = 10
SEND_BATCH_BYTES = MAX_MESSAGE_BYTES - 2_048
#: Tries of a message entry SQS failed (the first send and one more).
SEND_ROUNDS = 2
#: Attributes of a found record that decide whether its message is sent again.
_STATE = ("status", "attempts", "submitting_until")
#: The outbox key of a new job's ``job.queued``.
QUEUED_KEY = event_key(lifecycle.QUEUED, 0)


class BulkSubmitter:
    """Submits many prepared jobs with the clients of ``service`` (see the module docstring)."""

    def __init__(self, service: JobService, *, lease_seconds: int | None = None) -> None:
        """``lease_seconds``: how long a new record may wait unconfirmed (its message maybe not
        sent) before the expiry sweeper ends it, seconds; default the plain submit's
        ``submit_lease_seconds``. A caller whose failed run is run again only later (the batch
        expander: when its queue message comes back) passes a lease that outlasts that wait,
        else the sweeper expires the jobs the re-run would send."""
        self.service = service
        self.store = service.store
        self.sqs = service.sqs
        self.lease_seconds = lease_seconds or service.settings.submit_lease_seconds

    def submit(self, jobs: list[Prepared]) -> None:
        """Make sure every job of ``jobs`` (distinct derived ids) exists, has its message sent
        and its ``job.queued`` published, writing only what an earlier run did not.

        Raises:
            InternalError: some messages could not be sent (what was sent is confirmed; a run
                made again sends the rest).
            ClientError: a read or write failed (a run made again goes on from what is there).
        """
        if not jobs:
            return
        ids = [p.record["job_id"] for p in jobs]
        found = self.store.get_many(ids, _STATE, consistent=True)
        new = [p for p in jobs if p.record["job_id"] not in found]
        lease_end = int(time.time()) + self.lease_seconds
        for p in new:
            if p.body is not None and p.record.get("input_ref"):
                self.service.payloads.put_input(p.record["tenant"], p.record["job_id"], p.body)
        raced = self.store.create_many(
            [
                {
                    **p.record,
                    "submitting_until": lease_end,
                    "expires_epoch": min(p.record["expires_epoch"], lease_end),
                }
                for p in new
            ]
        )
        if raced:  # made meanwhile by another run (or by this one, its answer lost)
            found.update(self.store.get_many(raced, _STATE, consistent=True))
        made = {p.record["job_id"] for p in new} - raced
        stale = [j for j, rec in found.items() if _unconfirmed(rec)]
        stored = self.store.get_many(stale, consistent=True) if stale else {}
        to_send = [
            p if p.record["job_id"] in made else _as_stored(p, stored[p.record["job_id"]])
            for p in jobs
            if p.record["job_id"] in made or p.record["job_id"] in stored
        ]
        # job.queued first: the fewer requests between a job's message and its confirm, the
        # fewer confirms a worker that already started the job refuses (each then costs three
        # lone writes instead of a share of one transaction).
        published = self._publish([p.record for p in to_send])
        sent, failed = self._send(to_send)
        self.store.confirm_many(
            [
                (p.record["job_id"], _expires_epoch(p.record), QUEUED_KEY if published else None)
                for p in sent
            ]
        )
        for model in sorted({p.record["model"] for p in sent}):
            wake_on_submit(self.service.settings.scaling, model)  # cached, never raises
        if failed:
            raise InternalError(
                f"{len(failed)} of {len(to_send)} job messages could not be sent; run it again"
            )

    def _send(self, jobs: list[Prepared]) -> tuple[list[Prepared], list[Prepared]]:
        """Send the messages of ``jobs`` (SendMessageBatch per queue); returns ``(sent, failed)``
        after :data:`SEND_ROUNDS` tries of the failed entries."""
        sent: list[Prepared] = []
        todo = jobs
        for _ in range(SEND_ROUNDS):
            failed: list[Prepared] = []
            by_queue: dict[str, list[Prepared]] = defaultdict(list)
            for p in todo:
                by_queue[p.queue_url].append(p)
            for url, group in by_queue.items():
                sizes = [JobMessage.size(p.text) + 200 for p in group]
                for call in chunked(
                    group, sizes, max_items=SEND_BATCH_MAX, max_bytes=SEND_BATCH_BYTES
                ):
                    ok, bad = self._send_batch(url, call)
                    sent.extend(ok)
                    failed.extend(bad)
            if not failed:
                return sent, []
            todo = failed
        return sent, todo

    def _send_batch(self, url: str, call: list[Prepared]) -> tuple[list[Prepared], list[Prepared]]:
        entries = [
            {"Id": str(n), "MessageBody": p.text, "MessageGroupId": p.group}
            for n, p in enumerate(call)
        ]
        try:
            resp = self.sqs.send_message_batch(QueueUrl=url, Entries=entries)
        except ClientError as exc:
            log.warning("SendMessageBatch of %d failed (%s); tried again", len(call), exc)
            return [], call
        bad = {f["Id"] for f in resp.get("Failed") or []}
        if bad:
            log.warning("SQS refused %d of %d messages: %s", len(bad), len(call), resp["Failed"])
        return (
            [p for n, p in enumerate(call) if str(n) not in bad],
            [p for n, p in enumerate(call) if str(n) in bad],
        )

    def _publish(self, records: list[JobRecord]) -> bool:
        """Publish ``job.queued`` of ``records`` without clearing their outboxes (the confirm
        does); returns whether every event went out (else the keys stay for the sweeper)."""
        if not records:
            return True
        try:
            self.service.events.publish_many(records, clear=False)
        except Exception:
            log.exception("job.queued of %d jobs not all published; left in outboxes", len(records))
            return False
        return True


def _unconfirmed(record: JobRecord | None) -> bool:
    """Whether a found record is a submit that did not finish and still needs its message:
    ``submitting_until`` set, ``queued`` at attempt 0."""
    return (
        record is not None
        and record.get("submitting_until") is not None
        and record.get("status") == lifecycle.QUEUED
        and not record.get("attempts")
    )


def _as_stored(p: Prepared, record: JobRecord) -> Prepared:
    """``p`` as the record an earlier run stored shows it: that record (its times, not this
    run's) and a message built from it, with ``p``'s input."""
    data = {**JobMessage.model_validate_json(p.text).model_dump(), **_message_fields(record)}
    return Prepared(record, p.body, JobMessage(**data).dumps(), p.queue_url, p.group)


def _message_fields(record: JobRecord) -> dict[str, Any]:
    return {
        "expires_at": record["expires_at"],
        "created_at": record.get("created_at"),
        "metadata": record.get("metadata"),
        "webhook": record.get("webhook"),
    }


def _expires_epoch(record: JobRecord) -> int:
    """The job's TTL end (epoch seconds) from its ``expires_at``, as the submit set it."""
    return int(parse(record["expires_at"]).timestamp())
