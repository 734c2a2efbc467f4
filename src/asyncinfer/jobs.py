"""The job service: submit, read, wait for, cancel and list jobs. The API handlers call this
module; it owns the order of writes (record, message, event) and the lifecycle rules on the
request path. Tenant isolation lives here: every read filters by tenant and answers
:class:`~asyncinfer.errors.NotFound` for another tenant's job."""

from __future__ import annotations

import hashlib
import json
import time
from datetime import timedelta
from typing import Any

from botocore.exceptions import ClientError

from asyncinfer import clients, lifecycle
from asyncinfer.api.schemas import JobRequest
from asyncinfer.errors import (
    Conflict,
    InternalError,
    InvalidRequest,
    NotFound,
    TransitionRefused,
)
from asyncinfer.events import EventPublisher
from asyncinfer.ids import is_job_id, new_job_id
from asyncinfer.jobview import render_job
from asyncinfer.messages import JobMessage
from asyncinfer.models.registry import MODELS, get_spec, validate_input
from asyncinfer.payloads import PayloadStore, dumps, split_uri
from asyncinfer.scaling.wake import wake_on_submit
from asyncinfer.settings import Settings
from asyncinfer.store import QUEUED_MARK, JobStore
from asyncinfer.timeutil import iso, now, parse
from asyncinfer.webhook_urls import check_url

#: How long an idempotency key maps to its job (spec: 24 h), seconds.
IDEMPOTENCY_SECONDS = 24 * 3600


class JobService:
    """Job operations for the API. All methods take the caller's ``tenant`` (API key id)."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.store = JobStore(settings)
        self.payloads = PayloadStore(settings)
        self.events = EventPublisher(settings, self.payloads)
        self.sqs = clients.client("sqs", settings)

    # ------------------------------------------------------------------ models
    def deployed_models(self) -> list[dict[str, Any]]:
        """``GET /v1/models`` entries of the models deployed here."""
        return [MODELS[m].describe() for m in self.settings.models if m in MODELS]

    # ------------------------------------------------------------------ submit
    def submit(
        self, tenant: str, req: JobRequest, *, idempotency_key: str | None = None
    ) -> tuple[dict[str, Any], bool]:
        """Create a job: validate, store the record, enqueue the message, publish ``job.queued``.

        Returns ``(job object, created)``; ``created`` is False when an idempotency key returned
        an existing job.

        Raises:
            InvalidRequest: unknown or undeployed model, input invalid for the model, a webhook
                URL that breaks the rules, an input_url the tenant may not read.
            Conflict: the idempotency key was used with another body within 24 h.
        """
        spec = get_spec(req.model)
        if req.model not in self.settings.models:
            raise InvalidRequest(
                f"model {req.model!r} is not deployed here",
                [{"field": "model", "message": f"deployed: {self.settings.models}"}],
            )
        if req.input is not None:
            validate_input(spec, req.input)
        if req.input_url is not None:
            self._check_input_url(tenant, req.input_url)
        if req.webhook is not None:
            check_url(req.webhook.url, local_mode=self.settings.local_mode)

        job_id = new_job_id()
        if idempotency_key is not None:
            existing = self._claim_idempotency_key(tenant, idempotency_key, req, job_id)
            if existing is not None:
                return existing, False

        created = now()
        expires = created + timedelta(seconds=req.ttl_seconds)
        record: dict[str, Any] = {
            "job_id": job_id,
            "tenant": tenant,
            "model": req.model,
            "status": lifecycle.QUEUED,
            "attempts": 0,
            "priority": req.priority,
            "created_at": iso(created),
            "expires_at": iso(expires),
            "timeout_seconds": req.timeout_seconds,
            "metadata": json.dumps(req.metadata) if req.metadata else None,
            "webhook": json.dumps(req.webhook.model_dump(mode="json")) if req.webhook else None,
            "ttl": int(created.timestamp()) + self.settings.record_retention_seconds,
            "expires_epoch": int(expires.timestamp()),
            "queued_mark": QUEUED_MARK,
        }
        message = JobMessage(
            job_id=job_id,
            tenant=tenant,
            model=req.model,
            priority=req.priority,
            expires_at=record["expires_at"],
            timeout_seconds=req.timeout_seconds,
            created_at=record["created_at"],
            metadata=record["metadata"],
            webhook=record["webhook"],
        )
        if req.input is not None:
            body = dumps(req.input)
            if len(body) > self.settings.inline_input_limit_bytes:
                record["input_ref"] = message.input_ref = self.payloads.put_input(
                    tenant, job_id, body
                )
            else:
                message.input = req.input
        else:
            record["input_ref"] = message.input_ref = req.input_url

        self.store.create(record)
        try:
            self.sqs.send_message(
                QueueUrl=self.settings.queue_url(req.model, req.priority),
                MessageBody=message.dumps(),
            )
        except ClientError as exc:
            # Without its message nobody would ever run the job: take the record back.
            self.store.ddb.delete_item(TableName=self.store.table, Key={"job_id": {"S": job_id}})
            raise InternalError("could not enqueue the job; nothing was stored") from exc
        self.events.publish(record)
        wake_on_submit(self.settings, req.model)  # 0 -> 1 at once; cached, never raises
        return render_job(record, self.payloads), True

    def _check_input_url(self, tenant: str, url: str) -> None:
        try:
            bucket, key = split_uri(url)
        except ValueError:
            raise InvalidRequest(
                "input_url is not an s3:// URL",
                [{"field": "input_url", "message": "must be s3://bucket/key"}],
            ) from None
        if bucket == self.settings.bucket and not key.startswith(f"uploads/{tenant}/"):
            # Other tenants' inputs and outputs live in this bucket: only the caller's uploads.
            raise InvalidRequest(
                "input_url points into the service bucket outside your uploads",
                [{"field": "input_url", "message": "use the input_url of POST /v1/uploads"}],
            )

    # ------------------------------------------------------------------ idempotency
    def _claim_idempotency_key(
        self, tenant: str, key: str, req: JobRequest, job_id: str
    ) -> dict[str, Any] | None:
        """Claim ``key`` for ``job_id`` with a conditional put; if another request claimed it
        first, return that job (same body) or raise :class:`Conflict` (another body)."""
        if not 1 <= len(key) <= 255:
            raise InvalidRequest(
                "Idempotency-Key must be 1..255 characters",
                [{"field": "Idempotency-Key", "message": "1..255 characters"}],
            )
        body_hash = hashlib.sha256(
            json.dumps(req.model_dump(mode="json"), sort_keys=True).encode()
        ).hexdigest()
        item_id = "idem#" + hashlib.sha256(f"{tenant}\0{key}".encode()).hexdigest()
        t = int(time.time())
        try:
            # No 'tenant' attribute: the item stays out of the tenant GSI (sparse index).
            self.store.ddb.put_item(
                TableName=self.store.table,
                Item={
                    "job_id": {"S": item_id},
                    "target": {"S": job_id},
                    "body_hash": {"S": body_hash},
                    "valid_until": {"N": str(t + IDEMPOTENCY_SECONDS)},
                    "ttl": {"N": str(t + IDEMPOTENCY_SECONDS)},
                },
                ConditionExpression="attribute_not_exists(job_id) OR valid_until < :t",
                ExpressionAttributeValues={":t": {"N": str(t)}},
            )
            return None
        except ClientError as exc:
            if exc.response["Error"]["Code"] != "ConditionalCheckFailedException":
                raise
        item = self.store.ddb.get_item(
            TableName=self.store.table, Key={"job_id": {"S": item_id}}, ConsistentRead=True
        ).get("Item")
        if item is None:  # expired and deleted in between: claim again
            return self._claim_idempotency_key(tenant, key, req, job_id)
        if item["body_hash"]["S"] != body_hash:
            raise Conflict(
                "Idempotency-Key was already used with a different request body",
                [{"field": "Idempotency-Key", "message": "reused with another body"}],
            )
        target = item["target"]["S"]
        for _ in range(20):  # the first request may still be writing its record
            record = self.store.get(target)
            if record is not None:
                return render_job(record, self.payloads)
            time.sleep(0.1)
        raise Conflict("a request with this Idempotency-Key is still being processed")

    # ------------------------------------------------------------------ read
    def _record(self, tenant: str, job_id: str) -> dict[str, Any]:
        record = self.store.get(job_id) if is_job_id(job_id) else None
        if record is None or record.get("tenant") != tenant:
            raise NotFound(f"job {job_id} not found")
        return self._expire_if_due(record)

    def _expire_if_due(self, record: dict[str, Any]) -> dict[str, Any]:
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
        self.events.publish(expired)
        return expired

    def get(self, tenant: str, job_id: str, *, wait: float = 0.0) -> dict[str, Any]:
        """The job object; with ``wait`` > 0 (seconds, at most 20), hold until the job is
        terminal or ``wait`` seconds pass. Raises :class:`NotFound`."""
        deadline = time.monotonic() + wait
        record = self._record(tenant, job_id)
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
                    record = self.store.transition(
                        job_id,
                        from_status=lifecycle.QUEUED,
                        to_status=lifecycle.CANCELLED,
                        set_fields={
                            "completed_at": iso(now()),
                            "error": {"code": "cancelled", "message": "cancelled by the client"},
                        },
                    )
                except TransitionRefused as exc:
                    record = exc.current or record
                    continue
                self.events.publish(record)
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
