"""The one settings object. Every component reads the environment here and nowhere else.

Built on pydantic-settings: one field per variable, the variable's name its alias (the names
themselves live in :mod:`asyncinfer.core.envvars`, which the CDK app and the local stack use to
set them). A malformed value is a :class:`~asyncinfer.core.errors.ConfigError` naming the
variable. Each component takes the part it reads (:mod:`asyncinfer.core.settings_parts`:
``settings.api``, ``.worker``, ``.webhooks``, ``.sweeper``, ``.scaling``, ``.dlq``, ``.bridge``,
``.completion``, ``.openai``); reading the environment is :mod:`asyncinfer.core.settings_env`'s.
Booleans take ``1/0``, ``true/false``, ``yes/no``, ``on/off``.

Environment variables (all optional unless a component needs the resource):

==================================  ===========================================================
``ASYNCINFER_TABLE``                DynamoDB table of job records
``ASYNCINFER_BUCKET``               S3 bucket for large inputs and outputs
``ASYNCINFER_TOPIC_ARN``            SNS topic of job events
``ASYNCINFER_QUEUE_URLS``           JSON ``{model: url, "<model>#high": url, "<model>#low": url}``
                                    (the local stack); in AWS the naming rule below instead
``ASYNCINFER_RESOURCE_PREFIX``      the deployment's resource prefix (naming rule, core.naming):
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
``ASYNCINFER_OUTBOX_GRACE_SECONDS`` age, seconds, after which the sweeper republishes a pending
                                    event of the events outbox (30)
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
``ASYNCINFER_ENGINE_URL``           the engine of an ``openai-server`` entry run beside the worker
                                    (http://127.0.0.1:8000; an entry's ``engine.url`` wins)
``ASYNCINFER_WEIGHTS_CACHE``        where ``s3://`` weight sources are downloaded once and reused
                                    (default ``<ASYNCINFER_MODEL_CACHE>/weights``; on ECS the
                                    instance's ``/var/cache/asyncinfer``, shared by its tasks)
``ASYNCINFER_MAX_BATCH_SIZE``       most jobs a worker runs together (default: the model's)
``ASYNCINFER_MAX_WAIT_MS``          how long a worker gathers a batch once a job is in hand (50)
``ASYNCINFER_TOKEN_BUDGET``         generation: most KV cache entries of a batch, padding
                                    included: jobs x the largest prompt + max_new_tokens
                                    (32768); a job over it alone fails
``ASYNCINFER_ECHO_BATCHING``        ``0``: the echo model runs one job at a time (default ``1``:
                                    the items of a batch together)
``ASYNCINFER_BUSY_FILE``            the local stack: where a worker writes ``1``/``0`` (busy/idle)
                                    for the local autoscaler (scale-in protection's stand-in)
``ECS_AGENT_URI``                   set by ECS in a task: the agent endpoint of scale-in protection
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
``ASYNCINFER_BATCH_QUEUE_URL``     SQS queue of the OpenAI batch expander (expand, end, check)
``ASYNCINFER_BATCH_EVENTS_QUEUE_URL`` SQS queue subscribed to the topic that counts batch lines
``ASYNCINFER_BATCH_CHUNK``          lines the expander turns into jobs per chunk (500)
``ASYNCINFER_COMPUTE``              ``ecs`` or ``sagemaker`` in AWS (workers then emit EMF metrics)
``ASYNCINFER_ECS_CLUSTER``          ECS cluster of the worker services (wake on submit, backlog)
``ASYNCINFER_ECS_SERVICES``         JSON ``{model_id: ECS service name}`` (wake on submit, backlog;
                                    default with the prefix and ``compute=ecs``: the naming rule)
``ASYNCINFER_SAGEMAKER_ENDPOINTS``  JSON ``{model_id: endpoint name}`` (bridge, wake on submit;
                                    default with the prefix and ``compute=sagemaker``: the rule)
``ASYNCINFER_SAGEMAKER_ENGINES``    JSON ``{model_id: "chat" | "embeddings"}``: the models whose
                                    endpoint container is their ``engine.image`` (the bridge
                                    sends it the engine's request, the completion maps its
                                    answer; default none: every endpoint runs our worker image)
``ASYNCINFER_WAKE_CACHE_SECONDS``   how long wake-on-submit trusts "not at zero", seconds (30)
``AWS_ENDPOINT_URL``                AWS endpoint (the local stack's emulator); unset in AWS
``AWS_REGION``                      region, else ``AWS_DEFAULT_REGION`` (us-east-1)
==================================  ===========================================================
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from functools import lru_cache
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import AliasChoices, Field, ValidationError, field_validator
from pydantic_settings import (
    BaseSettings,
    NoDecode,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)

from asyncinfer.core import envvars as ev
from asyncinfer.core.errors import ConfigError
from asyncinfer.core.settings_env import derive, problems, read_env
from asyncinfer.core.settings_parts import (
    ApiSettings,
    BridgeSettings,
    CompletionSettings,
    DlqSettings,
    ModelSettings,
    OpenAISettings,
    ScalingSettings,
    SweeperSettings,
    WebhookSettings,
    WorkerSettings,
    priority_queues_of,
    queue_url_of,
)

#: The inline limit of outputs in the job object, bytes of JSON (spec: "at most 64 KB").
INLINE_OUTPUT_LIMIT_BYTES = 64 * 1024
#: A running job's default lease, in heartbeat intervals: a worker may miss two heartbeats (a
#: slow AWS call, a GC pause) before the sweeper takes its job back.
LEASE_HEARTBEATS = 3

#: A comma list in one variable (``a,b``), not JSON.
CommaList = Annotated[list[str], NoDecode]
#: A JSON object ``{model: name}`` in one variable.
NameMap = Annotated[dict[str, str], NoDecode]


class Settings(BaseSettings):
    """Runtime settings. Build with :meth:`from_env`; tests may build one directly with field
    names (``Settings(visibility_timeout_seconds=30)``), which reads no environment.

    Each field's ``validation_alias`` is its environment variable; fields without one
    (``receive_max_messages``) are set in code only. Limits in ``Field(...)`` come from the AWS
    quotas named in the table above (SQS: visibility timeout 0..43200 s, WaitTimeSeconds 0..20,
    maxReceiveCount 1..1000; webhook retry delay at most SQS's 12 h visibility).
    """

    model_config = SettingsConfigDict(
        populate_by_name=True,
        extra="ignore",
        case_sensitive=True,
        env_ignore_empty=True,
    )

    table_name: str = Field("", validation_alias=ev.TABLE)
    bucket: str = Field("", validation_alias=ev.BUCKET)
    topic_arn: str = Field("", validation_alias=ev.TOPIC_ARN)
    queue_urls: NameMap = Field(default_factory=dict, validation_alias=ev.QUEUE_URLS)
    resource_prefix: str = Field("", validation_alias=ev.RESOURCE_PREFIX)
    queue_url_base: str = Field("", validation_alias=ev.QUEUE_URL_BASE)
    models: CommaList = Field(default_factory=list, validation_alias=ev.MODELS)
    models_file: Path | None = Field(None, validation_alias=ev.MODELS_FILE)
    max_receive_count: int = Field(3, ge=1, le=1000, validation_alias=ev.MAX_RECEIVE_COUNT)
    visibility_timeout_seconds: int = Field(
        120, ge=0, le=43200, validation_alias=ev.VISIBILITY_TIMEOUT
    )
    heartbeat_seconds: float = Field(0.0, ge=0, validation_alias=ev.HEARTBEAT_SECONDS)
    lease_seconds: float = Field(0.0, ge=0, validation_alias=ev.LEASE_SECONDS)
    sweep_seconds: float = Field(5.0, gt=0, validation_alias=ev.SWEEP_SECONDS)
    #: A pending event older than this (seconds) is republished by the sweeper (events outbox,
    #: :mod:`asyncinfer.jobs.outbox`).
    outbox_grace_seconds: float = Field(30.0, gt=0, validation_alias=ev.OUTBOX_GRACE)
    receive_wait_seconds: int = Field(20, ge=0, le=20, validation_alias=ev.RECEIVE_WAIT)
    receive_max_messages: int = Field(10, ge=1, le=10)
    drain_seconds: float = Field(10.0, ge=0, validation_alias=ev.DRAIN_SECONDS)
    retry_delay_seconds: float = Field(2.0, ge=0, validation_alias=ev.RETRY_DELAY)
    inline_input_limit_bytes: int = Field(64 * 1024, ge=0, validation_alias=ev.INLINE_INPUT_BYTES)
    record_retention_seconds: int = Field(
        30 * 24 * 3600, gt=0, validation_alias=ev.RECORD_RETENTION
    )
    max_input_bytes: int = Field(64 * 1024 * 1024, gt=0, validation_alias=ev.MAX_INPUT_BYTES)
    input_locations: CommaList = Field(default_factory=list, validation_alias=ev.INPUT_LOCATIONS)
    submit_lease_seconds: int = Field(120, gt=0, validation_alias=ev.SUBMIT_LEASE)
    max_waits_per_tenant: int = Field(10, ge=0, validation_alias=ev.MAX_WAITS_PER_TENANT)
    model_cache_dir: Path = Field(
        default_factory=lambda: Path.home() / ".cache" / "asyncinfer",
        validation_alias=ev.MODEL_CACHE,
    )
    weights_cache_dir: Path | None = Field(None, validation_alias=ev.WEIGHTS_CACHE)
    #: The engine an ``openai-server`` worker feeds when its entry has ``engine.image`` (the
    #: engine container of the same task). An entry's ``engine.url`` wins.
    engine_url: str = Field("http://127.0.0.1:8000", validation_alias=ev.ENGINE_URL)
    max_batch_size: int = Field(0, ge=0, validation_alias=ev.MAX_BATCH_SIZE)
    max_wait_ms: float = Field(50.0, ge=0, validation_alias=ev.MAX_WAIT_MS)
    token_budget: int = Field(32768, ge=0, validation_alias=ev.TOKEN_BUDGET)
    echo_batching: bool = Field(True, validation_alias=ev.ECHO_BATCHING)
    #: Where a worker writes ``1``/``0`` (busy/idle) for the local autoscaler; unset in AWS.
    busy_file: str = Field("", validation_alias=ev.BUSY_FILE)
    #: ECS's task agent endpoint (set by ECS in the task); scale-in protection goes there.
    ecs_agent_uri: str = Field("", validation_alias=ev.ECS_AGENT_URI)
    local_mode: bool = Field(False, validation_alias=ev.LOCAL)
    #: Test-only: the local stack's emulator answers injected SNS/S3 faults
    #: (asyncinfer.local.faults; ``ASYNCINFER_EMULATOR_FAULTS=1``). Off by default.
    local_emulator_faults: bool = Field(False, validation_alias=ev.EMULATOR_FAULTS)
    webhook_queue_url: str = Field("", validation_alias=ev.WEBHOOK_QUEUE_URL)
    webhook_dlq_url: str = Field("", validation_alias=ev.WEBHOOK_DLQ_URL)
    webhook_secrets_key: str = Field("", validation_alias=ev.WEBHOOK_SECRETS_KEY)
    webhook_retry_base_seconds: float = Field(5.0, gt=0, validation_alias=ev.WEBHOOK_RETRY_BASE)
    webhook_retry_max_delay_seconds: float = Field(
        3600.0, gt=0, le=43200, validation_alias=ev.WEBHOOK_RETRY_MAX
    )
    webhook_retry_window_seconds: float = Field(
        24 * 3600.0, gt=0, validation_alias=ev.WEBHOOK_RETRY_WINDOW
    )
    batch_queue_url: str = Field("", validation_alias=ev.BATCH_QUEUE_URL)
    batch_events_queue_url: str = Field("", validation_alias=ev.BATCH_EVENTS_QUEUE_URL)
    batch_chunk_lines: int = Field(500, gt=0, le=10000, validation_alias=ev.BATCH_CHUNK)
    compute: Literal["", "ecs", "sagemaker"] = Field("", validation_alias=ev.COMPUTE)
    ecs_cluster: str = Field("", validation_alias=ev.ECS_CLUSTER)
    ecs_services: NameMap = Field(default_factory=dict, validation_alias=ev.ECS_SERVICES)
    sagemaker_endpoints: NameMap = Field(
        default_factory=dict, validation_alias=ev.SAGEMAKER_ENDPOINTS
    )
    #: Models whose SageMaker endpoint runs the entry's engine image, and the engine's API.
    sagemaker_engines: NameMap = Field(default_factory=dict, validation_alias=ev.SAGEMAKER_ENGINES)
    wake_cache_seconds: float = Field(30.0, ge=0, validation_alias=ev.WAKE_CACHE_SECONDS)
    endpoint_url: str | None = Field(None, validation_alias=ev.AWS_ENDPOINT_URL)
    region: str = Field(
        "us-east-1", validation_alias=AliasChoices(ev.AWS_REGION, ev.AWS_DEFAULT_REGION)
    )

    @field_validator("models", "input_locations", mode="before")
    @classmethod
    def _comma_list(cls, value: Any) -> Any:
        """``a, b,,c`` -> ``["a", "b", "c"]`` (a list is taken as it is)."""
        if isinstance(value, str):
            return [x.strip() for x in value.split(",") if x.strip()]
        return value

    @field_validator(
        "queue_urls", "ecs_services", "sagemaker_endpoints", "sagemaker_engines", mode="before"
    )
    @classmethod
    def _json_object(cls, value: Any) -> Any:
        """A JSON object (or a mapping) ``{model: name}``, keys and values as strings."""
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except ValueError:
                raise ValueError("is not a JSON object {model: name}") from None
        if not isinstance(value, Mapping):
            raise ValueError("is not a JSON object {model: name}")
        return {str(k): str(v) for k, v in value.items()}

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        """Constructor arguments only: the environment is read by :meth:`from_env`, from the
        mapping it is given, so a directly built object never picks up the process's
        variables (tests, the local stack's in-process settings)."""
        return (init_settings,)

    @property
    def heartbeat_interval(self) -> float:
        """Seconds between visibility extensions: the set value, else a third of the timeout."""
        return self.heartbeat_seconds or self.visibility_timeout_seconds / 3

    @property
    def lease_interval(self) -> int:
        """Seconds a running job's lease lasts from its start or last renewal: the set value,
        else :data:`LEASE_HEARTBEATS` heartbeat intervals, rounded up (at least 1)."""
        return max(1, math.ceil(self.lease_seconds or LEASE_HEARTBEATS * self.heartbeat_interval))

    # The parts (asyncinfer.core.settings_parts): what each component receives.
    @property
    def api(self) -> ApiSettings:
        """The part the API's ``/v1`` reads."""
        return ApiSettings.of(self)

    @property
    def worker(self) -> WorkerSettings:
        """The part a worker reads."""
        return WorkerSettings.of(self)

    @property
    def model_settings(self) -> ModelSettings:
        """The part the model handlers read (held by :attr:`worker`)."""
        return ModelSettings.of(self)

    @property
    def webhooks(self) -> WebhookSettings:
        """The part the webhook dispatcher reads."""
        return WebhookSettings.of(self)

    @property
    def sweeper(self) -> SweeperSettings:
        """The part the sweeper reads."""
        return SweeperSettings.of(self)

    @property
    def scaling(self) -> ScalingSettings:
        """The part wake-on-submit and the backlog metric read."""
        return ScalingSettings.of(self)

    @property
    def dlq(self) -> DlqSettings:
        """The part the DLQ handler reads."""
        return DlqSettings.of(self)

    @property
    def bridge(self) -> BridgeSettings:
        """The part the SageMaker bridge reads."""
        return BridgeSettings.of(self)

    @property
    def completion(self) -> CompletionSettings:
        """The part the SageMaker completion Lambda reads."""
        return CompletionSettings.of(self)

    @property
    def openai(self) -> OpenAISettings:
        """The part the OpenAI surface, the batch expander and the batch-line counter read."""
        return OpenAISettings.of(self)

    def queue_url(self, model: str, priority: str = "normal") -> str:
        """The SQS queue URL of ``model`` for a priority class
        (:func:`~asyncinfer.core.settings_parts.queue_url_of`; :class:`ConfigError` if the model
        has no queue at all)."""
        return queue_url_of(self.queue_urls, model, priority)

    def priority_queues(self, model: str) -> dict[str, str]:
        """``{priority: queue URL}`` of the classes of ``model`` that have their own queue
        (always ``normal``), highest class first."""
        return priority_queues_of(self.queue_urls, model)

    @classmethod
    def env_name(cls, field: str) -> str | None:
        """The environment variable of ``field`` (the first, where it has several), or ``None``
        for a field set in code only. Raises ``KeyError`` for an unknown field."""
        alias = cls.model_fields[field].validation_alias
        if isinstance(alias, AliasChoices):
            first = alias.choices[0]
            return first if isinstance(first, str) else None
        return alias if isinstance(alias, str) else None

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        """Read settings from ``env`` (default ``os.environ``); an empty variable is unset.

        Raises:
            ConfigError: listing every malformed variable at once, each by its name (the
                pydantic ``ValidationError`` it wraps is its ``__cause__``).
        """
        env = os.environ if env is None else env
        raw = read_env(cls, env)
        try:
            settings = cls(**raw)
        except ValidationError as exc:
            raise ConfigError("; ".join(problems(exc))) from exc
        return derive(settings, models_given=ev.MODELS in raw)


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """The process-wide settings, read once from the environment."""
    return Settings.from_env()
