"""The one settings object. Every component reads the environment here and nowhere else.

Environment variables (all optional unless a component needs the resource):

==================================  ===========================================================
``ASYNCINFER_TABLE``                DynamoDB table of job records
``ASYNCINFER_BUCKET``               S3 bucket for large inputs and outputs
``ASYNCINFER_TOPIC_ARN``            SNS topic of job events
``ASYNCINFER_QUEUE_URLS``           JSON ``{model: url, "<model>#high": url, "<model>#low": url}``
                                    (the local stack); in AWS the naming rule below instead
``ASYNCINFER_RESOURCE_PREFIX``      the deployment's resource prefix (:mod:`asyncinfer.naming`):
                                    queue URLs, ECS service and SageMaker endpoint names of
                                    every model are derived from it, so the environment's size
                                    does not grow with the catalogue
``ASYNCINFER_QUEUE_URL_BASE``       ``https://sqs.<region>.<suffix>/<account>/`` (with the above)
``ASYNCINFER_MODELS``               comma list of deployed model ids (default: keys of the above)
``ASYNCINFER_MODELS_FILE``          the model catalogue, ``models.yaml`` (spec ``models.md``);
                                    default: the project's (packaged with asyncinfer)
``ASYNCINFER_MAX_RECEIVE_COUNT``    SQS maxReceiveCount of every queue's redrive policy (3)
``ASYNCINFER_VISIBILITY_TIMEOUT``   visibility timeout, seconds, the worker keeps extending (120)
``ASYNCINFER_HEARTBEAT_SECONDS``    heartbeat interval, seconds (default visibility timeout / 3)
``ASYNCINFER_LEASE_SECONDS``        lease of a running job, seconds, renewed each heartbeat; a job
                                    whose lease lapsed is taken back by the sweeper (default 3
                                    heartbeat intervals)
``ASYNCINFER_SWEEP_SECONDS``        how often the local stack's sweeper runs, seconds (5; in AWS
                                    a scheduled Lambda every minute)
``ASYNCINFER_RECEIVE_WAIT``         ReceiveMessage WaitTimeSeconds, 0..20 (20)
``ASYNCINFER_DRAIN_SECONDS``        after SIGTERM, how long running jobs may go on (10)
``ASYNCINFER_RETRY_DELAY``          base delay, seconds, before a retryable failure is retried (2)
``ASYNCINFER_INLINE_INPUT_BYTES``   inputs larger than this travel through S3 (65536)
``ASYNCINFER_RECORD_RETENTION``     seconds a job record lives after creation (TTL; 30 days)
``ASYNCINFER_MAX_INPUT_BYTES``      largest input a job may have, bytes: the cap of upload
                                    forms and of what a worker reads (67108864 = 64 MiB)
``ASYNCINFER_INPUT_LOCATIONS``      comma list of ``bucket`` or ``bucket/prefix`` that
                                    ``input_url`` may name besides the tenant's own uploads
``ASYNCINFER_SUBMIT_LEASE``         seconds a submit in progress holds its idempotency key and
                                    its record waits for its message (120: ~4 API timeouts)
``ASYNCINFER_MAX_WAITS_PER_TENANT`` most concurrent ``GET /v1/jobs/{id}?wait=`` long polls of
                                    one tenant, across every API Lambda (10; 0: no bound);
                                    one more is 429 ``rate_limited``
``ASYNCINFER_MODEL_CACHE``          where converted checkpoints are cached (~/.cache/asyncinfer)
``ASYNCINFER_MAX_BATCH_SIZE``       most jobs a worker runs together (default: the model's)
``ASYNCINFER_MAX_WAIT_MS``          how long a worker gathers a batch once a job is in hand (50)
``ASYNCINFER_TOKEN_BUDGET``         generation: most KV cache entries of a batch, padding
                                    included: jobs x the largest prompt + max_new_tokens
                                    (32768); a job over it alone fails
``ASYNCINFER_ECHO_BATCHING``       ``0``: the echo model runs one job at a time (default ``1``:
                                    the items of a batch together)
``ASYNCINFER_LOCAL``                ``1`` on the local stack: webhooks may use http and loopback
``ASYNCINFER_EMULATOR_FAULTS``      tests only: ``1``, the local stack's emulator answers the
                                    injected SNS/S3 faults of its state directory's faults file
                                    (:mod:`asyncinfer.local.faults`; default off)
``ASYNCINFER_WEBHOOK_QUEUE_URL``    SQS queue of the webhook dispatcher (subscribed to the topic)
``ASYNCINFER_WEBHOOK_DLQ_URL``      where webhook events go after the retry window
``ASYNCINFER_WEBHOOK_SECRETS_KEY``  KMS key (id, ARN or alias) that encrypts tenants' webhook
                                    signing secrets (the API and the webhook dispatcher)
``ASYNCINFER_WEBHOOK_RETRY_BASE``   first webhook retry delay, seconds; doubles per attempt (5)
``ASYNCINFER_WEBHOOK_RETRY_MAX``    largest webhook retry delay, seconds, at most 43200 (3600)
``ASYNCINFER_WEBHOOK_RETRY_WINDOW`` seconds a webhook event is retried before its DLQ (86400)
``ASYNCINFER_COMPUTE``              ``ecs`` or ``sagemaker`` in AWS (workers then emit EMF metrics)
``ASYNCINFER_ECS_CLUSTER``          ECS cluster of the worker services (wake on submit, backlog)
``ASYNCINFER_ECS_SERVICES``         JSON ``{model_id: ECS service name}`` (wake on submit, backlog;
                                    default with the prefix and ``compute=ecs``: the naming rule)
``ASYNCINFER_SAGEMAKER_ENDPOINTS``  JSON ``{model_id: endpoint name}`` (bridge, wake on submit;
                                    default with the prefix and ``compute=sagemaker``: the rule)
``ASYNCINFER_WAKE_CACHE_SECONDS``   how long wake-on-submit trusts "not at zero", seconds (30)
``AWS_ENDPOINT_URL``                AWS endpoint (the local stack's emulator); unset in AWS
``AWS_REGION``                      region (us-east-1)
==================================  ===========================================================
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from functools import lru_cache
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from asyncinfer import naming
from asyncinfer.errors import ConfigError

#: The inline limit of outputs in the job object, bytes of JSON (spec: "at most 64 KB").
INLINE_OUTPUT_LIMIT_BYTES = 64 * 1024
#: A running job's default lease, in heartbeat intervals: a worker may miss two heartbeats (a
#: slow AWS call, a GC pause) before the sweeper takes its job back.
LEASE_HEARTBEATS = 3


class Settings(BaseModel):
    """Runtime settings. Build with :meth:`from_env`; tests may build one directly."""

    table_name: str = ""
    bucket: str = ""
    topic_arn: str = ""
    queue_urls: dict[str, str] = Field(default_factory=dict)
    resource_prefix: str = ""
    queue_url_base: str = ""
    models: list[str] = Field(default_factory=list)
    models_file: Path | None = None
    max_receive_count: int = 3
    visibility_timeout_seconds: int = 120
    heartbeat_seconds: float = 0.0
    lease_seconds: float = 0.0
    sweep_seconds: float = 5.0
    receive_wait_seconds: int = 20
    receive_max_messages: int = 10
    drain_seconds: float = 10.0
    retry_delay_seconds: float = 2.0
    inline_input_limit_bytes: int = 64 * 1024
    record_retention_seconds: int = 30 * 24 * 3600
    max_input_bytes: int = 64 * 1024 * 1024
    input_locations: list[str] = Field(default_factory=list)
    submit_lease_seconds: int = 120
    max_waits_per_tenant: int = 10
    model_cache_dir: Path = Field(default_factory=lambda: Path.home() / ".cache" / "asyncinfer")
    max_batch_size: int = 0
    max_wait_ms: float = 50.0
    token_budget: int = 32768
    #: The engine an ``openai-server`` worker feeds when its entry has ``engine.image`` (the
    #: engine container of the same task; ``ASYNCINFER_ENGINE_URL``). An ``engine.url`` wins.
    engine_url: str = "http://127.0.0.1:8000"
    echo_batching: bool = True
    local_mode: bool = False
    #: Test-only: the local stack's emulator answers injected SNS/S3 faults
    #: (asyncinfer.local.faults; ``ASYNCINFER_EMULATOR_FAULTS=1``). Off by default.
    local_emulator_faults: bool = False
    webhook_queue_url: str = ""
    webhook_dlq_url: str = ""
    webhook_secrets_key: str = ""
    webhook_retry_base_seconds: float = 5.0
    webhook_retry_max_delay_seconds: float = 3600.0
    webhook_retry_window_seconds: float = 24 * 3600.0
    compute: str = ""
    ecs_cluster: str = ""
    ecs_services: dict[str, str] = Field(default_factory=dict)
    sagemaker_endpoints: dict[str, str] = Field(default_factory=dict)
    wake_cache_seconds: float = 30.0
    endpoint_url: str | None = None
    region: str = "us-east-1"

    @property
    def heartbeat_interval(self) -> float:
        """Seconds between visibility extensions: the set value, else a third of the timeout."""
        return self.heartbeat_seconds or self.visibility_timeout_seconds / 3

    @property
    def lease_interval(self) -> int:
        """Seconds a running job's lease lasts from its start or last renewal: the set value,
        else :data:`LEASE_HEARTBEATS` heartbeat intervals, rounded up (at least 1)."""
        return max(1, math.ceil(self.lease_seconds or LEASE_HEARTBEATS * self.heartbeat_interval))

    def queue_url(self, model: str, priority: str = "normal") -> str:
        """The SQS queue URL of ``model`` for a priority class.

        ``queue_urls`` keys are model ids (the ``normal`` queue) and ``<model>#high`` /
        ``<model>#low`` for the other classes; a class without its own queue shares the normal
        one. Raises :class:`ConfigError` if the model has no queue at all.
        """
        if priority != "normal" and f"{model}#{priority}" in self.queue_urls:
            return self.queue_urls[f"{model}#{priority}"]
        try:
            return self.queue_urls[model]
        except KeyError:
            raise ConfigError(f"no queue configured for model {model!r}") from None

    def priority_queues(self, model: str) -> dict[str, str]:
        """``{priority: queue URL}`` of the classes of ``model`` that have their own queue
        (always ``normal``), highest class first."""
        out = {"high": self.queue_urls.get(f"{model}#high"), "normal": self.queue_url(model)}
        out["low"] = self.queue_urls.get(f"{model}#low")
        return {k: v for k, v in out.items() if v}

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        """Read settings from ``env`` (default ``os.environ``). Raises :class:`ConfigError`
        listing every malformed variable at once."""
        env = os.environ if env is None else env
        values: dict[str, object] = {}
        problems: list[str] = []

        def take(var: str, field: str, conv: type = str) -> None:
            raw = env.get(var)
            if raw is None or raw == "":
                return
            try:
                values[field] = conv(raw)
            except (TypeError, ValueError):
                problems.append(f"{var}={raw!r} is not a valid {conv.__name__}")

        take("ASYNCINFER_TABLE", "table_name")
        take("ASYNCINFER_BUCKET", "bucket")
        take("ASYNCINFER_TOPIC_ARN", "topic_arn")
        take("ASYNCINFER_RESOURCE_PREFIX", "resource_prefix")
        take("ASYNCINFER_QUEUE_URL_BASE", "queue_url_base")
        take("ASYNCINFER_MAX_RECEIVE_COUNT", "max_receive_count", int)
        take("ASYNCINFER_VISIBILITY_TIMEOUT", "visibility_timeout_seconds", int)
        take("ASYNCINFER_HEARTBEAT_SECONDS", "heartbeat_seconds", float)
        take("ASYNCINFER_LEASE_SECONDS", "lease_seconds", float)
        take("ASYNCINFER_SWEEP_SECONDS", "sweep_seconds", float)
        take("ASYNCINFER_RECEIVE_WAIT", "receive_wait_seconds", int)
        take("ASYNCINFER_DRAIN_SECONDS", "drain_seconds", float)
        take("ASYNCINFER_RETRY_DELAY", "retry_delay_seconds", float)
        take("ASYNCINFER_INLINE_INPUT_BYTES", "inline_input_limit_bytes", int)
        take("ASYNCINFER_RECORD_RETENTION", "record_retention_seconds", int)
        take("ASYNCINFER_MAX_INPUT_BYTES", "max_input_bytes", int)
        take("ASYNCINFER_SUBMIT_LEASE", "submit_lease_seconds", int)
        take("ASYNCINFER_MAX_WAITS_PER_TENANT", "max_waits_per_tenant", int)
        raw_locations = env.get("ASYNCINFER_INPUT_LOCATIONS")
        if raw_locations:
            values["input_locations"] = [x.strip() for x in raw_locations.split(",") if x.strip()]
        take("ASYNCINFER_MODEL_CACHE", "model_cache_dir", Path)
        take("ASYNCINFER_MODELS_FILE", "models_file", Path)
        take("ASYNCINFER_MAX_BATCH_SIZE", "max_batch_size", int)
        take("ASYNCINFER_MAX_WAIT_MS", "max_wait_ms", float)
        take("ASYNCINFER_TOKEN_BUDGET", "token_budget", int)
        take("ASYNCINFER_ENGINE_URL", "engine_url")
        take("ASYNCINFER_WEBHOOK_QUEUE_URL", "webhook_queue_url")
        take("ASYNCINFER_WEBHOOK_DLQ_URL", "webhook_dlq_url")
        take("ASYNCINFER_WEBHOOK_SECRETS_KEY", "webhook_secrets_key")
        take("ASYNCINFER_WEBHOOK_RETRY_BASE", "webhook_retry_base_seconds", float)
        take("ASYNCINFER_WEBHOOK_RETRY_MAX", "webhook_retry_max_delay_seconds", float)
        take("ASYNCINFER_WEBHOOK_RETRY_WINDOW", "webhook_retry_window_seconds", float)
        take("AWS_ENDPOINT_URL", "endpoint_url")
        take("ASYNCINFER_COMPUTE", "compute")
        take("ASYNCINFER_ECS_CLUSTER", "ecs_cluster")
        take("ASYNCINFER_WAKE_CACHE_SECONDS", "wake_cache_seconds", float)
        for var, name in (
            ("ASYNCINFER_ECS_SERVICES", "ecs_services"),
            ("ASYNCINFER_SAGEMAKER_ENDPOINTS", "sagemaker_endpoints"),
        ):
            try:
                mapping = json.loads(env.get(var) or "{}")
                if not isinstance(mapping, dict):
                    raise ValueError
                values[name] = {str(k): str(v) for k, v in mapping.items()}
            except ValueError:
                problems.append(f"{var} is not a JSON object {{model: name}}")
        region = env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION")
        if region:
            values["region"] = region
        values["local_mode"] = env.get("ASYNCINFER_LOCAL", "") in ("1", "true", "yes")
        values["local_emulator_faults"] = env.get("ASYNCINFER_EMULATOR_FAULTS", "") in (
            "1",
            "true",
            "yes",
        )
        if env.get("ASYNCINFER_ECHO_BATCHING"):
            values["echo_batching"] = env["ASYNCINFER_ECHO_BATCHING"] not in ("0", "false", "no")
        raw_queues = env.get("ASYNCINFER_QUEUE_URLS")
        if raw_queues:
            try:
                queues = json.loads(raw_queues)
                if not isinstance(queues, dict):
                    raise ValueError
                values["queue_urls"] = {str(k): str(v) for k, v in queues.items()}
            except ValueError:
                problems.append("ASYNCINFER_QUEUE_URLS is not a JSON object {model: url}")
        raw_models = env.get("ASYNCINFER_MODELS")
        if raw_models:
            values["models"] = [m.strip() for m in raw_models.split(",") if m.strip()]
        else:
            urls: Any = values.get("queue_urls", {})
            values["models"] = [m for m in urls if "#" not in m]
        prefix = str(values.get("resource_prefix", ""))
        if prefix:
            _derive_names(values, prefix, problems)
        if problems:
            raise ConfigError("; ".join(problems))
        return cls.model_validate(values)


def _derive_names(values: dict[str, Any], prefix: str, problems: list[str]) -> None:
    """Fill the queue URLs, ECS service and SageMaker endpoint names that the environment does
    not give explicitly from the naming rule (:mod:`asyncinfer.naming`)."""
    models: list[str] = list(values.get("models") or [])
    if not models:
        problems.append("ASYNCINFER_RESOURCE_PREFIX needs ASYNCINFER_MODELS")
        return
    base = str(values.get("queue_url_base", ""))
    if not values.get("queue_urls"):
        if not base.endswith("/"):
            problems.append(
                "ASYNCINFER_RESOURCE_PREFIX needs ASYNCINFER_QUEUE_URL_BASE ending in '/'"
            )
        else:
            values["queue_urls"] = naming.queue_urls(base, prefix, models)
    compute = values.get("compute")
    if compute == "ecs" and not values.get("ecs_services"):
        values["ecs_services"] = {m: naming.ecs_service_name(prefix, m) for m in models}
    if compute == "sagemaker" and not values.get("sagemaker_endpoints"):
        values["sagemaker_endpoints"] = {m: naming.endpoint_name(prefix, m) for m in models}


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """The process-wide settings, read once from the environment."""
    return Settings.from_env()
