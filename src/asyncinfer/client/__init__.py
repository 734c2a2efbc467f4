"""Python client of the asyncinfer API.

::

    from asyncinfer.client import Client

    with Client() as client:  # ASYNCINFER_URL / ASYNCINFER_API_KEY, or .asyncinfer/local.json
        job = client.submit("echo", {"hello": "world"})
        job = client.wait(job.id, timeout=60)
        print(job.status, job.output)

:class:`Client` (sync) and :class:`AsyncClient` share one implementation of the protocol; only
the transport differs. See ``docs/client.md``.
"""

from asyncinfer.client._async import AsyncClient
from asyncinfer.client._protocol import Config, RetryPolicy, resolve_config
from asyncinfer.client._sync import Client
from asyncinfer.client.batch import BatchFileError, BatchSummary, read_batch, run_batch
from asyncinfer.client.errors import (
    APIConnectionError,
    APIError,
    AuthenticationError,
    ClientError,
    ConfigurationError,
    ConflictError,
    InternalServerError,
    InvalidJSONError,
    InvalidRequestError,
    NotFoundError,
    PayloadTooLargeError,
    RateLimitedError,
    WaitTimeout,
    WebhookVerificationError,
)
from asyncinfer.client.models import (
    TERMINAL_STATUSES,
    Job,
    JobErrorInfo,
    JobPage,
    JobStatus,
    ModelInfo,
    Upload,
    WebhookEvent,
    WebhookSecret,
    WebhookStatus,
)
from asyncinfer.client.webhooks import sign_webhook, verify_webhook, verify_webhook_payload

__all__ = [
    "TERMINAL_STATUSES",
    "APIConnectionError",
    "APIError",
    "AsyncClient",
    "AuthenticationError",
    "BatchFileError",
    "BatchSummary",
    "Client",
    "ClientError",
    "Config",
    "ConfigurationError",
    "ConflictError",
    "InternalServerError",
    "InvalidJSONError",
    "InvalidRequestError",
    "Job",
    "JobErrorInfo",
    "JobPage",
    "JobStatus",
    "ModelInfo",
    "NotFoundError",
    "PayloadTooLargeError",
    "RateLimitedError",
    "RetryPolicy",
    "Upload",
    "WaitTimeout",
    "WebhookEvent",
    "WebhookSecret",
    "WebhookStatus",
    "WebhookVerificationError",
    "read_batch",
    "resolve_config",
    "run_batch",
    "sign_webhook",
    "verify_webhook",
    "verify_webhook_payload",
]
