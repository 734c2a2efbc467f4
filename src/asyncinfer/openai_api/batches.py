"""The batch service behind ``/openai/v1/batches`` (spec openai.md, "Batches"): create, read,
list and cancel a tenant's batches, and render them as OpenAI's Batch object (the ``openai``
SDK's ``openai.types.Batch`` parses it).

A create writes the batch (``validating``) and enqueues ``{"op": "expand"}`` on the batch queue
(with the first ``{"op": "check"}``, delayed);
the expander (:mod:`.expansion`) validates the file, expands it into jobs and keeps the batch's
progress. A cancel moves it to ``cancelling`` and enqueues ``{"op": "end"}``, which cancels the
lines not finished; the last terminal line then finalizes it (:mod:`.finalize`).
"""

from __future__ import annotations

import json
import logging
import re
import time
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from asyncinfer.aws import clients
from asyncinfer.core.errors import (
    Conflict,
    InternalError,
    InvalidRequest,
    NotFound,
    TransitionRefused,
)
from asyncinfer.core.ids import new_job_id
from asyncinfer.core.settings_parts import OpenAISettings
from asyncinfer.models.registry import validation_details
from asyncinfer.openai_api import batch_store as bs
from asyncinfer.openai_api.batch_store import BatchStore, batches_partition
from asyncinfer.openai_api.files import FileStore
from asyncinfer.webhooks.urls import check_url

log = logging.getLogger("asyncinfer.openai.batches")

#: ``completion_window``: ``24h`` (OpenAI's), or (an extension) ``<N>m`` / ``<N>h``.
WINDOW_RE = re.compile(r"^([1-9][0-9]{0,4})([mh])$")
MIN_WINDOW_SECONDS, MAX_WINDOW_SECONDS = 60, 72 * 3600
#: ``batch_`` + a ULID (:func:`new_batch_id`). Ids from a URL are checked against it before any
#: read: DynamoDB refuses a key over 2048 bytes (a sort key condition over 1024) with an error.
BATCH_ID_RE = re.compile(r"^batch_[0-9A-HJKMNP-TV-Z]{26}$")
#: OpenAI's metadata rule: 16 keys of at most 64 characters, values of at most 512.
METADATA_KEYS, METADATA_KEY_CHARS, METADATA_VALUE_CHARS = 16, 64, 512


def window_seconds(window: str) -> int:
    """Seconds of a ``completion_window`` (``24h``, ``90m``, ``72h``).

    Raises:
        ValueError: not ``<N>m`` / ``<N>h``, or outside 1 minute .. 72 hours.
    """
    m = WINDOW_RE.match(window)
    if not m:
        raise ValueError("completion_window must be '24h' or '<N>m' / '<N>h'")
    seconds = int(m.group(1)) * (60 if m.group(2) == "m" else 3600)
    if not MIN_WINDOW_SECONDS <= seconds <= MAX_WINDOW_SECONDS:
        raise ValueError("completion_window must be from 1 minute to 72 hours")
    return seconds


class BatchWebhook(BaseModel):
    """The ``webhook`` extension: where the batch's end event is delivered."""

    model_config = ConfigDict(extra="forbid")
    url: str = Field(min_length=1, max_length=2048)


class BatchRequest(BaseModel):
    """Body of ``POST /batches``: OpenAI's fields and the ``webhook``/``priority`` extensions."""

    model_config = ConfigDict(extra="forbid")

    input_file_id: str = Field(min_length=1, max_length=64)
    endpoint: Literal["/v1/chat/completions", "/v1/embeddings", "/v1/completions"]
    completion_window: str = "24h"
    metadata: dict[str, str] | None = None
    webhook: BatchWebhook | None = None
    priority: Literal["high", "normal", "low"] = "low"
    #: Accepted as OpenAI's SDK may send it; output files live as long as the bucket keeps them.
    output_expires_after: dict[str, Any] | None = None

    @field_validator("completion_window")
    @classmethod
    def _window(cls, v: str) -> str:
        window_seconds(v)
        return v

    @field_validator("metadata")
    @classmethod
    def _metadata(cls, v: dict[str, str] | None) -> dict[str, str] | None:
        if v is None:
            return v
        if len(v) > METADATA_KEYS:
            raise ValueError(f"at most {METADATA_KEYS} keys")
        for k, x in v.items():
            if len(k) > METADATA_KEY_CHARS or len(x) > METADATA_VALUE_CHARS:
                raise ValueError(
                    f"keys at most {METADATA_KEY_CHARS} characters, values at most "
                    f"{METADATA_VALUE_CHARS}"
                )
        return v


def parse_request(body: Any) -> BatchRequest:
    """The :class:`BatchRequest` of a JSON body. Raises :class:`InvalidRequest` naming fields."""
    try:
        return BatchRequest.model_validate(body)
    except ValidationError as exc:
        details = validation_details(exc)
        fields = ", ".join(d["field"] or "body" for d in details)
        raise InvalidRequest(f"invalid request: {fields}", details) from None


def new_batch_id() -> str:
    """``batch_`` + a ULID (sorts by creation time)."""
    return "batch_" + new_job_id().removeprefix("job_")


def is_batch_id(value: str) -> bool:
    """Whether ``value`` has the shape of a batch id (:data:`BATCH_ID_RE`)."""
    return bool(BATCH_ID_RE.match(value))


def render_batch(record: dict[str, Any]) -> dict[str, Any]:
    """OpenAI's Batch object of a batch record (epoch seconds; ``request_counts`` as the
    counters stand now)."""
    errors = json.loads(record["errors"]) if record.get("errors") else None
    return {
        "id": record["job_id"],
        "object": "batch",
        "endpoint": record["endpoint"],
        "model": record.get("model"),
        "errors": {"object": "list", "data": errors} if errors else None,
        "input_file_id": record["input_file_id"],
        "completion_window": record["completion_window"],
        "status": record["status"],
        "output_file_id": record.get("output_file_id"),
        "error_file_id": record.get("error_file_id"),
        "created_at": record["created_at"],
        **{
            f"{s}_at": record.get(f"{s}_at")
            for s in (
                "in_progress",
                "expires",
                "finalizing",
                "completed",
                "failed",
                "expired",
                "cancelling",
                "cancelled",
            )
        },
        "request_counts": {
            "total": int(record.get("total", 0)),
            "completed": int(record.get("completed", 0)),
            "failed": int(record.get("failed", 0)),
        },
        "metadata": json.loads(record["metadata"]) if record.get("metadata") else None,
    }


def _op(op: str, batch_id: str) -> str:
    return json.dumps({"op": op, "batch_id": batch_id}, separators=(",", ":"))


def enqueue(sqs: Any, settings: OpenAISettings, body: dict[str, Any], delay: int = 0) -> None:
    """Send one batch-queue message (``delay`` seconds, SQS's 0..900)."""
    sqs.send_message(
        QueueUrl=settings.batch_queue_url,
        MessageBody=json.dumps(body, separators=(",", ":")),
        DelaySeconds=max(0, min(900, int(delay))),
    )


class BatchService:
    """Batch operations of the API; every method takes the caller's ``tenant``."""

    def __init__(self, settings: OpenAISettings) -> None:
        self.settings = settings
        self.store = BatchStore(settings)
        self.files = FileStore(clients.client("s3", settings), settings.bucket)
        self.sqs = clients.client("sqs", settings)

    def create(self, tenant: str, req: BatchRequest) -> dict[str, Any]:
        """Create a batch (``validating``) and enqueue its expansion; returns the Batch object.

        Raises:
            InvalidRequest: no such input file of the tenant (``input_file_id``), a file not of
                purpose ``batch``, a webhook URL that breaks api.md's rules (``webhook.url``).
            InternalError: the expansion could not be enqueued (nothing was kept).
        """
        try:
            meta = self.files.get(tenant, req.input_file_id)
        except NotFound:
            raise InvalidRequest(
                f"no such file: {req.input_file_id}",
                [{"field": "input_file_id", "message": "not a file of this API key"}],
            ) from None
        if meta["purpose"] != "batch":
            raise InvalidRequest(
                f"file {req.input_file_id} has purpose {meta['purpose']!r}, not 'batch'",
                [{"field": "input_file_id", "message": "purpose must be batch"}],
            )
        if req.webhook is not None:
            try:
                check_url(req.webhook.url, local_mode=self.settings.local_mode)
            except InvalidRequest as exc:
                raise InvalidRequest(
                    exc.message, [{"field": "webhook.url", "message": exc.message}]
                ) from None
        created = int(time.time())
        batch_id = new_batch_id()
        record: dict[str, Any] = {
            "job_id": batch_id,
            "tenant": batches_partition(tenant),
            "owner": tenant,
            "status": bs.VALIDATING,
            "endpoint": req.endpoint,
            "input_file_id": req.input_file_id,
            "completion_window": req.completion_window,
            "created_at": created,
            "expires_at": created + window_seconds(req.completion_window),
            "metadata": json.dumps(req.metadata) if req.metadata else None,
            "webhook": json.dumps(req.webhook.model_dump()) if req.webhook else None,
            "priority": req.priority,
            "total": 0,
            "completed": 0,
            "failed": 0,
            "next_line": 0,
            "ttl": created + self.settings.record_retention_seconds,
        }
        self.store.create(record)
        # The expansion, and the first of the batch's checks (expiry, missed events), together.
        first_check = min(900, window_seconds(req.completion_window))
        try:
            resp = self.sqs.send_message_batch(
                QueueUrl=self.settings.batch_queue_url,
                Entries=[
                    {"Id": "expand", "MessageBody": _op("expand", batch_id)},
                    {
                        "Id": "check",
                        "MessageBody": _op("check", batch_id),
                        "DelaySeconds": first_check,
                    },
                ],
            )
            if resp.get("Failed"):
                raise RuntimeError(f"SQS refused {resp['Failed']}")
        except Exception as exc:
            self.store.ddb.delete_item(TableName=self.store.table, Key={"job_id": {"S": batch_id}})
            raise InternalError("could not start the batch; nothing was kept, retry") from exc
        return render_batch(record)

    def record(self, tenant: str, batch_id: str) -> dict[str, Any]:
        """The tenant's batch record. Raises :class:`NotFound` (another tenant's too)."""
        record = self.store.get(batch_id) if is_batch_id(batch_id) else None
        if record is None or record.get("owner") != tenant:
            raise NotFound(f"No batch found with id '{batch_id}'.")
        return record

    def get(self, tenant: str, batch_id: str) -> dict[str, Any]:
        """The Batch object. Raises :class:`NotFound`."""
        return render_batch(self.record(tenant, batch_id))

    def list(self, tenant: str, *, limit: int, after: str | None) -> dict[str, Any]:
        """OpenAI's list page ``{"object": "list", "data", "first_id", "last_id", "has_more"}``
        of the tenant's batches, newest first, after the batch id ``after``.

        Raises:
            InvalidRequest: ``after`` is not a batch id (``param: after``).
        """
        if after is not None and not is_batch_id(after):
            raise InvalidRequest(
                "after must be a batch id (the last_id of a page)",
                [{"field": "after", "message": "a batch id"}],
            )
        records, more = self.store.list(tenant, limit=limit, after=after)
        data = [render_batch(r) for r in records]
        return {
            "object": "list",
            "data": data,
            "first_id": data[0]["id"] if data else None,
            "last_id": data[-1]["id"] if data else None,
            "has_more": more,
        }

    def cancel(self, tenant: str, batch_id: str) -> dict[str, Any]:
        """Cancel the batch: ``cancelling`` now, ``cancelled`` once its unfinished lines are
        cancelled. Idempotent: a batch already cancelling or cancelled is returned as it is.

        Raises:
            NotFound: no such batch of the tenant.
            Conflict: the batch already ended otherwise (completed, failed, expired) or is
                finalizing.
        """
        record = self.record(tenant, batch_id)
        for _ in range(3):
            status = record["status"]
            if status in (bs.CANCELLING, bs.CANCELLED):
                return render_batch(record)
            if status not in (bs.VALIDATING, bs.IN_PROGRESS):
                raise Conflict(f"Cannot cancel a batch with status {status}.")
            try:
                record = self.store.transition(
                    batch_id,
                    from_status=status,
                    to_status=bs.CANCELLING,
                    set_fields={"ending": bs.CANCELLED},
                )
            except TransitionRefused as exc:
                record = exc.current or self.record(tenant, batch_id)
                continue
            enqueue(self.sqs, self.settings, {"op": "end", "batch_id": batch_id})
            return render_batch(record)
        raise Conflict(f"batch {batch_id} changed while it was being cancelled; try again")
