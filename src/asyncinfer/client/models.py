"""Typed views of the API's objects (spec, "Endpoints"). Unknown fields are kept (``extra``), so
a newer server does not break an older client."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

JobStatus = Literal["queued", "running", "succeeded", "failed", "cancelled", "expired"]
#: Statuses a job never leaves.
TERMINAL_STATUSES: frozenset[str] = frozenset({"succeeded", "failed", "cancelled", "expired"})


class _Model(BaseModel):
    model_config = ConfigDict(extra="allow", protected_namespaces=())


class JobErrorInfo(_Model):
    """``error`` of a failed, expired or cancelled job: ``code`` is one of ``invalid_input``,
    ``timeout``, ``max_attempts``, ``out_of_memory``, ``model_error``, ``expired``,
    ``cancelled``."""

    code: str
    message: str = ""


class WebhookStatus(_Model):
    """``webhook`` of a job: where its events go and how delivery went."""

    url: str
    events: list[str] | None = None
    status: str | None = None
    attempts: int = 0


class Job(_Model):
    """The job object (spec, "GET /v1/jobs/{id}"). Times are UTC datetimes; ``metrics`` values
    are seconds (``queue_seconds``, ``run_seconds``)."""

    id: str
    status: JobStatus
    model: str
    priority: str = "normal"
    attempts: int = 0
    created_at: datetime | None = None
    started_at: datetime | None = None
    completed_at: datetime | None = None
    expires_at: datetime | None = None
    output: Any = None
    output_url: str | None = None
    error: JobErrorInfo | None = None
    progress: dict[str, Any] | None = None
    metrics: dict[str, float | None] = Field(default_factory=dict)
    webhook: WebhookStatus | None = None
    metadata: dict[str, str] | None = None
    urls: dict[str, str] = Field(default_factory=dict)

    @property
    def is_terminal(self) -> bool:
        """True when the job is succeeded, failed, cancelled or expired (it never changes
        again)."""
        return self.status in TERMINAL_STATUSES

    @property
    def succeeded(self) -> bool:
        """True when the job succeeded."""
        return self.status == "succeeded"


class JobPage(_Model):
    """One page of ``GET /v1/jobs``: jobs newest first, and the cursor of the next page (``None``
    on the last page)."""

    jobs: list[Job]
    next_cursor: str | None = None


class ModelInfo(_Model):
    """One entry of ``GET /v1/models``."""

    id: str
    task: str | None = None
    kind: str | None = None  # the catalogue kind (models.md): causal-lm, embeddings, python, ...
    description: str | None = None
    input_schema: dict[str, Any] | None = None
    max_batch_size: int | None = None


class UploadForm(_Model):
    """A presigned S3 POST: ``fields`` then the file, as multipart/form-data, to ``url``."""

    url: str
    fields: dict[str, str]


class Upload(_Model):
    """``POST /v1/uploads``: upload the input before ``expires_at`` (POST ``upload_form``, whose
    policy caps it at ``max_bytes``, or PUT ``upload_url``), then submit with ``input_url``."""

    upload_url: str
    input_url: str
    expires_at: datetime | None = None
    max_bytes: int | None = None
    upload_form: UploadForm | None = None


class WebhookSecret(_Model):
    """``GET /v1/webhooks/secret``: the API key's ``whsec_`` signing secret and, for a while
    after a rotation, the previous one (deliveries are signed with both meanwhile)."""

    secret: str
    created_at: datetime | None = None
    previous_secret: str | None = None
    previous_expires_at: datetime | None = None

    @property
    def valid_secrets(self) -> list[str]:
        """The secrets a receiver should accept: the current one, then the previous one."""
        return [self.secret] + ([self.previous_secret] if self.previous_secret else [])


class WebhookEvent(_Model):
    """A webhook (or SNS) event: ``{"type": "job.succeeded", "timestamp": ..., "data": job}``."""

    type: str
    timestamp: datetime | None = None
    data: Job
