"""Request bodies of the API (spec, "POST /v1/jobs"), as pydantic models. They validate requests
and generate the OpenAPI document."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    field_validator,
    model_validator,
)

EventType = Literal[
    "job.queued", "job.started", "job.succeeded", "job.failed", "job.cancelled", "job.expired"
]
TERMINAL_EVENTS: list[EventType] = ["job.succeeded", "job.failed", "job.cancelled", "job.expired"]

#: Limits of ``metadata`` (spec: "a flat object of at most 16 string values, 2 KB in all").
METADATA_MAX_KEYS = 16
METADATA_MAX_BYTES = 2048
MetadataKey = Annotated[str, StringConstraints(min_length=1, max_length=128)]


class WebhookRequest(BaseModel):
    """``webhook``: where to POST signed job events. The URL rules (https, no private addresses)
    are checked by :mod:`asyncinfer.webhook_urls` when the job is submitted."""

    model_config = ConfigDict(extra="forbid")

    url: str = Field(min_length=1, max_length=2048)
    events: list[EventType] = Field(default_factory=lambda: list(TERMINAL_EVENTS), min_length=1)


class JobRequest(BaseModel):
    """Body of ``POST /v1/jobs``. Exactly one of ``input`` or ``input_url``."""

    model_config = ConfigDict(extra="forbid")

    model: str = Field(min_length=1, max_length=128, description="A model id of GET /v1/models")
    input: dict[str, Any] | None = Field(default=None, description="Inline input (JSON object)")
    input_url: str | None = Field(
        default=None,
        max_length=2048,
        description="s3:// location of the input, e.g. the input_url of POST /v1/uploads",
    )
    priority: Literal["high", "normal", "low"] = "normal"
    ttl_seconds: int = Field(
        default=21600, ge=10, le=259200, strict=True, description="Max seconds queued"
    )
    timeout_seconds: int = Field(
        default=900, ge=1, le=3600, strict=True, description="Max run seconds"
    )
    webhook: WebhookRequest | None = None
    metadata: dict[MetadataKey, str] = Field(default_factory=dict)

    @field_validator("metadata")
    @classmethod
    def _metadata_limits(cls, v: dict[str, str]) -> dict[str, str]:
        if len(v) > METADATA_MAX_KEYS:
            raise ValueError(f"at most {METADATA_MAX_KEYS} keys")
        size = sum(len(k.encode()) + len(x.encode()) for k, x in v.items())
        if size > METADATA_MAX_BYTES:
            raise ValueError(f"keys and values must total at most {METADATA_MAX_BYTES} bytes")
        return v

    @field_validator("input_url")
    @classmethod
    def _s3_only(cls, v: str | None) -> str | None:
        if v is not None and not v.startswith("s3://"):
            raise ValueError("must be an s3:// URL, such as the input_url of POST /v1/uploads")
        return v

    @model_validator(mode="after")
    def _one_input(self) -> JobRequest:
        if (self.input is None) == (self.input_url is None):
            raise ValueError("exactly one of 'input' or 'input_url' is required")
        return self


class JobError(BaseModel):
    """``error`` of a failed, expired or cancelled job."""

    code: str
    message: str


class WebhookState(BaseModel):
    """``webhook`` of a job: where events go and how delivery went."""

    url: str
    events: list[str] | None = None
    status: Literal["pending", "delivered", "failed"]
    attempts: int
    last_http_status: int | None = None


class JobView(BaseModel):
    """The job object (spec, "GET /v1/jobs/{id}"). Times are RFC 3339 UTC; seconds are floats."""

    id: str
    status: Literal["queued", "running", "succeeded", "failed", "cancelled", "expired"]
    model: str
    priority: str
    attempts: int
    created_at: str
    started_at: str | None
    completed_at: str | None
    expires_at: str
    output: dict[str, Any] | None
    output_url: str | None
    error: JobError | None
    progress: dict[str, int] | None
    metrics: dict[str, float | None]
    webhook: WebhookState | None
    metadata: dict[str, str]
    urls: dict[str, str]


class JobList(BaseModel):
    """``GET /v1/jobs``: a page of jobs, newest first."""

    jobs: list[JobView]
    next_cursor: str | None


class UploadForm(BaseModel):
    """A presigned S3 POST: send ``fields`` and then the file (field ``file``) as
    multipart/form-data to ``url``; its policy caps the size at ``max_bytes``."""

    url: str
    fields: dict[str, str]


class UploadView(BaseModel):
    """``POST /v1/uploads``: upload the input JSON (``upload_form``, capped at ``max_bytes``
    by S3, or a PUT to ``upload_url``), then submit ``input_url``."""

    upload_url: str
    input_url: str
    expires_at: str
    max_bytes: int
    upload_form: UploadForm


class ErrorBody(BaseModel):
    """Every error response: ``{"error": {"code", "message", "details"}}``."""

    error: dict[str, Any]
