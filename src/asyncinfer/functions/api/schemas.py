"""Request bodies and response shapes of the API (spec, "POST /v1/jobs"), as pydantic models.
They validate requests and generate the OpenAPI document (``GET /v1/openapi.json``): every
constraint a request model enforces is in its JSON Schema, so a schema-valid request is accepted
(issue 17). The few rules JSON Schema cannot state (the 2 KB metadata total; which ``input_url``
and webhook hosts a caller may use) are written in the field descriptions."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StringConstraints,
    field_validator,
    model_validator,
)

from asyncinfer.core.ids import JOB_ID_RE

EventType = Literal[
    "job.queued", "job.started", "job.succeeded", "job.failed", "job.cancelled", "job.expired"
]
TERMINAL_EVENTS: list[EventType] = ["job.succeeded", "job.failed", "job.cancelled", "job.expired"]
JobStatus = Literal["queued", "running", "succeeded", "failed", "cancelled", "expired"]

#: Shape of a job id (spec, "Conventions": ``job_`` + a ULID in Crockford base32).
JOB_ID_PATTERN = JOB_ID_RE.pattern
#: ``Idempotency-Key`` length, characters (spec, "POST /v1/jobs": 1..255).
IDEMPOTENCY_KEY_MAX = 255

#: Limits of ``metadata`` (spec: "a flat object of at most 16 string values, 2 KB in all").
METADATA_MAX_KEYS = 16
METADATA_MAX_BYTES = 2048
METADATA_KEY_MAX = 128
MetadataKey = Annotated[str, StringConstraints(min_length=1, max_length=METADATA_KEY_MAX)]
#: A value alone can never be longer than the total less a one-byte key.
MetadataValue = Annotated[str, StringConstraints(max_length=METADATA_MAX_BYTES - 1)]


def _integral(value: Any) -> Any:
    """JSON Schema counts ``355.0`` as an integer: take it as ``355``. Strings, booleans and
    fractions stay refused (the fields are strict)."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


#: A whole number of seconds, as JSON Schema's ``integer`` means it.
Seconds = Annotated[int, BeforeValidator(_integral)]


def _deployment() -> tuple[list[str], bool] | None:
    """``(deployed model ids, local mode)`` of this process's settings, for the parts of the
    document that depend on the deployment; ``None`` where no settings can be read (a schema
    generated outside a configured service)."""
    from asyncinfer.core.settings import get_settings  # late: settings import nothing of the API

    try:
        s = get_settings().api
    except Exception:
        return None
    return list(s.models), s.local_mode


def _webhook_schema(schema: dict[str, Any]) -> None:
    deployment = _deployment()
    local = deployment is not None and deployment[1]
    schema["properties"]["url"]["pattern"] = "^(https|http)://" if local else "^https://"


class WebhookRequest(BaseModel):
    """``webhook``: where to POST signed job events. The URL rules (https, no private addresses)
    are checked by :mod:`asyncinfer.webhooks.urls` when the job is submitted."""

    model_config = ConfigDict(extra="forbid", json_schema_extra=_webhook_schema)

    url: str = Field(
        min_length=1,
        max_length=2048,
        description=(
            "https URL (http too on the local stack) whose host is not, and does not resolve "
            "to, a loopback, private, link-local, multicast, unspecified or metadata address "
            "(the local stack accepts loopback); no credentials, no whitespace"
        ),
    )
    events: list[EventType] = Field(default_factory=lambda: list(TERMINAL_EVENTS), min_length=1)


def _job_request_schema(schema: dict[str, Any]) -> None:
    """Deployment-dependent parts of ``JobRequest``'s schema: ``model`` is one of the models
    deployed here (the service answers 422 for any other), and exactly one of ``input`` /
    ``input_url`` is given (a ``null`` counts as absent)."""
    deployment = _deployment()
    if deployment is not None and deployment[0]:
        schema["properties"]["model"]["enum"] = deployment[0]
    schema["oneOf"] = [
        {"required": ["input"], "properties": {"input": {"type": "object"}}},
        {"required": ["input_url"], "properties": {"input_url": {"type": "string"}}},
    ]


class JobRequest(BaseModel):
    """Body of ``POST /v1/jobs``. Exactly one of ``input`` or ``input_url``."""

    model_config = ConfigDict(extra="forbid", json_schema_extra=_job_request_schema)

    model: str = Field(
        min_length=1, max_length=128, description="A model id of GET /v1/models (deployed here)"
    )
    input: dict[str, Any] | None = Field(
        default=None,
        description="Inline input: a JSON object valid for the model's input_schema "
        "(GET /v1/models); exactly one of input and input_url",
    )
    input_url: str | None = Field(
        default=None,
        max_length=2048,
        pattern="^s3://",
        description="s3:// location of the input: the input_url of one of your own "
        "POST /v1/uploads; exactly one of input and input_url",
    )
    priority: Literal["high", "normal", "low"] = "normal"
    ttl_seconds: Seconds = Field(
        default=21600, ge=10, le=259200, strict=True, description="Max seconds queued"
    )
    timeout_seconds: Seconds = Field(
        default=900, ge=1, le=3600, strict=True, description="Max run seconds"
    )
    webhook: WebhookRequest | None = None
    metadata: dict[MetadataKey, MetadataValue] = Field(
        default_factory=dict,
        max_length=METADATA_MAX_KEYS,
        description=f"Flat object of at most {METADATA_MAX_KEYS} string values; keys and values "
        f"together at most {METADATA_MAX_BYTES} bytes of UTF-8. Echoed back.",
    )

    @field_validator("metadata")
    @classmethod
    def _metadata_limits(cls, v: dict[str, str]) -> dict[str, str]:
        if len(v) > METADATA_MAX_KEYS:
            raise ValueError(f"at most {METADATA_MAX_KEYS} keys")
        size = sum(len(k.encode()) + len(x.encode()) for k, x in v.items())
        if size > METADATA_MAX_BYTES:
            raise ValueError(f"keys and values must total at most {METADATA_MAX_BYTES} bytes")
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

    id: str = Field(pattern=JOB_ID_PATTERN)
    status: JobStatus
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


class HealthView(BaseModel):
    """``GET /v1/health``."""

    status: Literal["ok"]


class ModelInfo(BaseModel):
    """One entry of ``GET /v1/models``."""

    id: str
    task: str
    description: str | None = None
    input_schema: dict[str, Any] = Field(description="JSON Schema of the model's job input")
    max_batch_size: int


class ModelList(BaseModel):
    """``GET /v1/models``: the models deployed here."""

    models: list[ModelInfo]


class UploadView(BaseModel):
    """``POST /v1/uploads``: upload the input JSON (``upload_form``, capped at ``max_bytes``
    by S3, or a PUT to ``upload_url``), then submit ``input_url``."""

    upload_url: str
    input_url: str
    expires_at: str
    max_bytes: int
    upload_form: UploadForm


ErrorCode = Literal[
    "invalid_json",
    "forbidden",
    "invalid_request",
    "not_found",
    "method_not_allowed",
    "conflict",
    "payload_too_large",
    "rate_limited",
    "internal",
]


class ErrorInfo(BaseModel):
    """``error`` of an error response (spec, "Errors"). ``details`` of a validation error name
    fields: ``{"field": "input.max_new_tokens", "message": "...", "type": "..."}``."""

    code: ErrorCode
    message: str
    details: list[dict[str, Any]]


class ErrorBody(BaseModel):
    """Every error response: ``{"error": {"code", "message", "details"}}``."""

    error: ErrorInfo
