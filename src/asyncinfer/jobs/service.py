"""The job service: submit, read, wait for, cancel and list jobs. The API handlers call this
module; it owns the order of writes (record, message, event) and the lifecycle rules on the
request path. Tenant isolation lives here: every read filters by tenant and answers
:class:`~asyncinfer.core.errors.NotFound` for another tenant's job."""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from asyncinfer.aws import clients
from asyncinfer.aws.payloads import PayloadStore, split_uri
from asyncinfer.core import lifecycle
from asyncinfer.core.errors import (
    Conflict,
    InternalError,
    InvalidRequest,
    NotFound,
    TransitionRefused,
)
from asyncinfer.core.ids import is_job_id, new_job_id
from asyncinfer.core.settings_parts import ApiSettings
from asyncinfer.core.timeutil import iso, now, parse
from asyncinfer.functions.api.schemas import JobRequest
from asyncinfer.jobs import transitions
from asyncinfer.jobs.events import EventPublisher
from asyncinfer.jobs.idempotency import IDEMPOTENCY_SECONDS, IdempotencyKeys, body_hash
from asyncinfer.jobs.inputs import check_inline_input, check_input_url
from asyncinfer.jobs.messages import MAX_MESSAGE_BYTES, JobMessage
from asyncinfer.jobs.record import (
    OUTBOX_FIELD,
    OUTBOX_MARK,
    OUTBOX_MARK_FIELD,
    OUTBOX_SINCE_FIELD,
    QUEUED_MARK,
    JobRecord,
    event_key,
    refused_record,
)
from asyncinfer.jobs.store import JobStore
from asyncinfer.jobs.view import render_job
from asyncinfer.jobs.waits import WaitSlots
from asyncinfer.models.registry import MODELS, get_spec, validate_input
from asyncinfer.scaling.wake import wake_on_submit
from asyncinfer.webhooks.urls import check_url

__all__ = ["IDEMPOTENCY_SECONDS", "JobService", "Prepared"]

log = logging.getLogger("asyncinfer.jobs")


@dataclass
class Prepared:
    """A job checked and built, not yet written (:meth:`JobService.prepare`): its ``record``,
    its inline input serialized (``body``, bytes; ``None`` without an inline input; stored in S3
    when ``record`` has an ``input_ref`` of this service's bucket), its SQS message body
    ``text``, the ``queue_url`` and the tenant's message ``group``."""

    record: JobRecord
    body: bytes | None
    text: str
    queue_url: str
    group: str


class JobService:
    """Job operations for the API. All methods take the caller's ``tenant`` (API key id).

    ``settings``: the API's part (``Settings.api``): the job table, bucket, topic and queues,
    the submit limits, the webhook secrets key and, for wake on submit, the scaling part.
    """

    def __init__(self, settings: ApiSettings) -> None:
        self.settings = settings
        self.store = JobStore(settings)
        self.payloads = PayloadStore(settings)
        self.events = EventPublisher(settings, self.payloads)
        self.sqs = clients.client("sqs", settings)
        self.keys = IdempotencyKeys(self.store, settings.submit_lease_seconds)
        self.waits = WaitSlots(self.store.ddb, self.store.table, settings.max_waits_per_tenant)

    # ------------------------------------------------------------------ models
    def deployed_models(self) -> list[dict[str, Any]]:
        """``GET /v1/models`` entries of the models deployed here."""
        return [MODELS[m].describe() for m in self.settings.models if m in MODELS]

    # ------------------------------------------------------------------ submit
    def submit(
        self, tenant: str, req: JobRequest, *, idempotency_key: str | None = None
    ) -> tuple[dict[str, Any], bool]:
        """Create a job: validate, build its message, store the record, enqueue the message,
        publish ``job.queued``.

        Everything that can refuse the request is checked before anything is written, and the
        message body is built (and sized) before the record. A submit that fails after that
        leaves nothing behind: the record is deleted (a message sent after all then finds no
        record and the worker drops it), the S3 copy of the input too, and the idempotency key
        is given back. One that dies part way (a Lambda timeout) leaves at most a record whose
        ``expires_epoch`` is ``submit_lease_seconds`` away, which the expiry sweeper ends, and
        a key claim whose lease runs out (:mod:`asyncinfer.jobs.idempotency`).

        Returns ``(job object, created)``; ``created`` is False when an idempotency key returned
        an existing job.

        Raises:
            InvalidRequest: unknown or undeployed model, input invalid for the model or past the
                JSON limits, a webhook URL that breaks the rules, an input_url the tenant may
                not use.
            PayloadTooLarge: an inline input over ``max_input_bytes``.
            Conflict: the idempotency key was used with another body within 24 h, or a request
                with it is still in progress.
            InternalError: the record or the message could not be written (nothing was kept).
        """
        p = self.prepare(tenant, req)
        record, body, text, queue_url = p.record, p.body, p.text, p.queue_url
        job_id = record["job_id"]

        if idempotency_key is not None:
            digest = body_hash(req.model_dump(mode="json"))
            existing = self.keys.claim(tenant, idempotency_key, digest, job_id)
            if existing is not None:
                return render_job(existing, self.payloads), False
        try:
            self._write(record, body, text, queue_url, p.group)
        except BaseException:
            if idempotency_key is not None:
                self.keys.release(tenant, idempotency_key, job_id)
            raise
        # The job is accepted and will run: a failure from here on is logged, never a 500 (the
        # client would submit the job twice). A claim left undone still returns this job: its
        # record shows the submit finished (asyncinfer.jobs.idempotency).
        if idempotency_key is not None:
            try:
                self.keys.complete(tenant, idempotency_key, job_id)
            except Exception:
                log.exception("could not mark the idempotency key of %s done", job_id)
        self._publish(record)
        wake_on_submit(self.settings.scaling, req.model)  # 0 -> 1 at once; cached, never raises
        return render_job(record, self.payloads), True

    def prepare(self, tenant: str, req: JobRequest, job_id: str | None = None) -> Prepared:
        """Check ``req`` as :meth:`submit` does and build the job's record and message body,
        writing nothing (``job_id``: the id to give the job; default a new one). Shared by
        :meth:`submit` and the bulk submit of batch lines (:mod:`asyncinfer.jobs.bulk`).

        Raises:
            InvalidRequest: unknown or undeployed model, input invalid for the model or past the
                JSON limits, a webhook URL that breaks the rules, an input_url the tenant may
                not use.
            PayloadTooLarge: an inline input over ``max_input_bytes``.
        """
        spec = get_spec(req.model)
        if req.model not in self.settings.models:
            raise InvalidRequest(
                f"model {req.model!r} is not deployed here",
                [{"field": "model", "message": f"deployed: {self.settings.models}"}],
            )
        body: bytes | None = None
        if req.input is not None:
            body = check_inline_input(self.settings, req.input)
            validate_input(spec, req.input)
        if req.input_url is not None:
            check_input_url(self.settings, tenant, req.input_url)
        if req.webhook is not None:
            check_url(req.webhook.url, local_mode=self.settings.local_mode)
        queue_url = self.settings.queue_url(req.model, req.priority)

        job_id = job_id or new_job_id()
        record, message = self._build(tenant, req, job_id)
        if body is not None and len(body) <= self.settings.inline_input_limit_bytes:
            message.input = req.input
        text = message.dumps()
        if body is not None and (
            message.input is None or JobMessage.size(text) > MAX_MESSAGE_BYTES
        ):
            message.input = None
            record["input_ref"] = message.input_ref = self.payloads.input_uri(tenant, job_id)
            text = message.dumps()
        elif req.input_url is not None:
            record["input_ref"] = message.input_ref = req.input_url
            text = message.dumps()
        return Prepared(record, body, text, queue_url, message.group_id)

    def _publish(self, record: JobRecord) -> None:
        """Publish the event of a transition this service wrote. A failure is logged, never
        raised (the write is done; a 500 would make the client retry what succeeded): the event
        stays in the record's outbox and the sweeper publishes it
        (:mod:`asyncinfer.jobs.outbox`)."""
        try:
            self.events.publish(record)
        except Exception:
            log.exception(
                "%s of %s not published; left in its outbox",
                lifecycle.EVENT_FOR_STATUS[record["status"]],
                record["job_id"],
            )

    def _build(self, tenant: str, req: JobRequest, job_id: str) -> tuple[JobRecord, JobMessage]:
        """The new job's record and message (without its input)."""
        created = now()
        expires = created + timedelta(seconds=req.ttl_seconds)
        record: JobRecord = {
            "job_id": job_id,
            "tenant": tenant,
            "model": req.model,
            "status": lifecycle.QUEUED,
            "attempts": 0,
            "priority": req.priority,
            "created_at": iso(created),
            "expires_at": iso(expires),
            "timeout_seconds": req.timeout_seconds,
            "ttl": int(created.timestamp()) + self.settings.record_retention_seconds,
            "expires_epoch": int(expires.timestamp()),
            "queued_mark": QUEUED_MARK,
            # job.queued waits in the outbox until it is out (asyncinfer.jobs.outbox).
            OUTBOX_FIELD: {event_key(lifecycle.QUEUED, 0)},
            OUTBOX_MARK_FIELD: OUTBOX_MARK,
            OUTBOX_SINCE_FIELD: int(created.timestamp()),
        }
        if req.metadata:
            record["metadata"] = json.dumps(req.metadata)
        if req.webhook:
            record["webhook"] = json.dumps(req.webhook.model_dump(mode="json"))
        message = JobMessage(
            job_id=job_id,
            tenant=tenant,
            model=req.model,
            priority=req.priority,
            expires_at=record["expires_at"],
            timeout_seconds=req.timeout_seconds,
            created_at=record["created_at"],
            metadata=record.get("metadata"),
            webhook=record.get("webhook"),
        )
        return record, message

    def _write(
        self, record: JobRecord, body: bytes | None, text: str, queue_url: str, group: str
    ) -> None:
        """S3 copy of the input (if the message does not carry it), record, message (in the
        tenant's message group ``group``: fair queues, :mod:`asyncinfer.jobs.messages`), in that
        order; on any failure, what was written is taken back and :class:`InternalError`
        raised."""
        job_id, tenant = record["job_id"], record["tenant"]
        expires_epoch = record["expires_epoch"]
        lease_end = int(time.time()) + self.settings.submit_lease_seconds
        stored_input = record.get("input_ref") if body is not None else None
        created = False
        try:
            if stored_input is not None and body is not None:
                self.payloads.put_input(tenant, job_id, body)
            self.store.create(
                {
                    **record,
                    "submitting_until": lease_end,
                    "expires_epoch": min(expires_epoch, lease_end),
                }
            )
            created = True
            self.sqs.send_message(QueueUrl=queue_url, MessageBody=text, MessageGroupId=group)
            self.store.confirm_submitted(job_id, expires_epoch)
        except Exception as exc:
            if self._take_back(job_id, created, stored_input) is False:
                # The message went out and a worker started (or the client cancelled) the job
                # before the confirm failed: it is accepted; a 500 would have it submitted twice.
                log.warning("job %s: its submit failed after the job moved on; accepted", job_id)
                return
            raise InternalError("could not enqueue the job; nothing was kept, retry") from exc

    def _take_back(self, job_id: str, created: bool, stored_input: str | None) -> bool:
        """Undo a submit that failed part way; never raises (what stays behind is bounded: the
        record's short ``expires_epoch``, the bucket's lifecycle rule on ``inputs/``). Returns
        ``False`` when the record could not be taken back because the job is no longer queued
        for its first attempt (its message was sent and a worker started it, or it was
        cancelled): the job is then accepted and its input kept. When deleting the record
        itself fails, the input is kept too (a worker may yet read it) and ``True`` returned."""
        if created:
            try:
                if not self.store.discard_unsubmitted(job_id):
                    return False
            except Exception:
                log.exception("could not take back the record of the failed submit %s", job_id)
                return True
        if stored_input is not None:
            try:
                bucket, key = split_uri(stored_input)
                self.payloads.s3.delete_object(Bucket=bucket, Key=key)
            except Exception:
                log.exception("could not delete the input of the failed submit %s", job_id)
        return True

    # ------------------------------------------------------------------ read
    def _record(self, tenant: str, job_id: str) -> JobRecord:
        record = self.store.get(job_id) if is_job_id(job_id) else None
        if record is None or record.get("tenant") != tenant:
            raise NotFound(f"job {job_id} not found")
        return self._expire_if_due(record)

    def _expire_if_due(self, record: JobRecord) -> JobRecord:
        """A queued job past its ``expires_at`` becomes ``expired`` when it is read, so that it
        expires even while no worker runs (the worker expires it too when it dequeues it). A job
        handed back after it started (``attempts`` > 0) never expires (issue 14)."""
        if record["status"] != lifecycle.QUEUED or parse(record["expires_at"]) > now():
            return record
        if record.get("attempts"):
            return record
        expired = self.store.expire(record["job_id"])
        if expired is None:  # it moved on meanwhile: read it as it is now
            return self.store.get(record["job_id"]) or record
        self._publish(expired)
        return expired

    def get(self, tenant: str, job_id: str, *, wait: float = 0.0) -> dict[str, Any]:
        """The job object; with ``wait`` > 0 (seconds, at most 20), hold until the job is
        terminal or ``wait`` seconds pass. A wait on a job not yet terminal holds one of the
        tenant's wait slots (:mod:`asyncinfer.jobs.waits`) while it lasts.

        Raises:
            NotFound: no such job for this tenant (before any slot is taken).
            RateLimited: the tenant already holds ``max_waits_per_tenant`` waits.
        """
        deadline = time.monotonic() + wait
        record = self._record(tenant, job_id)
        if wait <= 0 or lifecycle.is_terminal(record["status"]):
            return render_job(record, self.payloads)
        with self.waits.held(tenant, wait):
            delay = 0.1
            while not lifecycle.is_terminal(record["status"]) and time.monotonic() < deadline:
                time.sleep(min(delay, max(0.0, deadline - time.monotonic())))
                delay = min(delay * 1.5, 1.0)
                record = self._record(tenant, job_id)
        return render_job(record, self.payloads)

    def list(
        self,
        tenant: str,
        *,
        limit: int,
        cursor: str | None,
        status: str | None,
        model: str | None,
    ) -> dict[str, Any]:
        """``{"jobs": [...], "next_cursor": ...}``: the tenant's jobs, newest first."""
        records, next_cursor = self.store.list_for_tenant(
            tenant, limit=limit, cursor=cursor, status=status, model=model
        )
        return {"jobs": [render_job(r, self.payloads) for r in records], "next_cursor": next_cursor}

    # ------------------------------------------------------------------ cancel
    def cancel(self, tenant: str, job_id: str) -> dict[str, Any]:
        """Cancel a job. Queued: cancelled at once (event ``job.cancelled``). Running: a cancel
        request is recorded and the worker stops the job at its next decoding step or batch
        boundary. Raises :class:`Conflict` for a terminal job, :class:`NotFound`."""
        record = self._record(tenant, job_id)
        for _ in range(3):
            status = record["status"]
            if lifecycle.is_terminal(status):
                raise Conflict(f"job {job_id} is already {status}")
            if status == lifecycle.QUEUED:
                try:
                    record = self.store.apply(transitions.cancel_queued(job_id))
                except TransitionRefused as exc:
                    record = refused_record(exc) or record
                    continue
                self._publish(record)
                return render_job(record, self.payloads)
            # running
            if self.store.update_fields(
                job_id,
                status=lifecycle.RUNNING,
                attempts=record.get("attempts"),
                set_fields={"cancel_requested": True},
            ):
                record["cancel_requested"] = True
                return render_job(record, self.payloads)
            record = self._record(tenant, job_id)
        raise Conflict(f"job {job_id} changed while it was being cancelled; try again")
