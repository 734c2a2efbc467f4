"""The parts of :class:`~asyncinfer.core.settings.Settings` each component reads.

A part is a frozen pydantic model whose fields carry the names of the
:class:`~asyncinfer.core.settings.Settings` fields (or properties, such as ``lease_interval``)
it copies; nothing is declared twice with a default, so the defaults stay in one place. Build
one with ``settings.api`` / ``.worker`` / ``.webhooks`` / ``.sweeper`` / ``.scaling``
(or :meth:`SettingsPart.of`). :meth:`SettingsPart.env_names` lists the environment variables a
part depends on: what the CDK app and the local stack must set for that component
(:mod:`asyncinfer.topology` names each function's part).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Self

from pydantic import BaseModel, ConfigDict

if TYPE_CHECKING:
    from asyncinfer.core.settings import Settings


class SettingsPart(BaseModel):
    """Base of the parts: frozen, built from a :class:`Settings`."""

    model_config = ConfigDict(frozen=True)

    @classmethod
    def of(cls, settings: Settings) -> Self:
        """This part of ``settings`` (each field copied from the attribute of the same name)."""
        return cls.model_validate({name: getattr(settings, name) for name in cls.model_fields})

    @classmethod
    def source_fields(cls) -> list[str]:
        """The :class:`Settings` fields this part depends on (derived ones expanded)."""
        out: list[str] = []
        for name in cls.model_fields:
            for source in DERIVED_FROM.get(name, (name,)):
                if source not in out:
                    out.append(source)
        return out

    @classmethod
    def env_names(cls) -> list[str]:
        """The environment variables this part reads (fields set in code only left out)."""
        from asyncinfer.core.settings import Settings

        names = (Settings.env_name(f) for f in cls.source_fields())
        return [n for n in names if n]


_NAMING = ("resource_prefix", "models")
#: Values computed from other settings (properties, or the naming rule of ``from_env``) and the
#: :class:`Settings` fields they come from.
DERIVED_FROM: dict[str, tuple[str, ...]] = {
    "heartbeat_interval": ("heartbeat_seconds", "visibility_timeout_seconds"),
    "lease_interval": ("lease_seconds", "heartbeat_seconds", "visibility_timeout_seconds"),
    "queue_urls": ("queue_urls", *_NAMING, "queue_url_base"),
    "ecs_services": ("ecs_services", *_NAMING, "compute"),
    "sagemaker_endpoints": ("sagemaker_endpoints", *_NAMING, "compute"),
}


class AwsPart(SettingsPart):
    """Where the AWS clients connect: every part has these (``clients.client`` reads them)."""

    endpoint_url: str | None
    region: str


class ApiSettings(AwsPart):
    """The API Lambda: submit, read, list, cancel, uploads, waits."""

    table_name: str
    bucket: str
    topic_arn: str
    queue_urls: dict[str, str]
    models: list[str]
    models_file: Path | None
    inline_input_limit_bytes: int
    record_retention_seconds: int
    max_input_bytes: int
    input_locations: list[str]
    submit_lease_seconds: int
    max_waits_per_tenant: int
    webhook_secrets_key: str
    local_mode: bool
    lease_interval: int


class WorkerSettings(AwsPart):
    """A GPU worker (ECS task or SageMaker container): intake, held messages, the watcher."""

    table_name: str
    bucket: str
    topic_arn: str
    queue_urls: dict[str, str]
    models_file: Path | None
    max_receive_count: int
    visibility_timeout_seconds: int
    heartbeat_interval: float
    lease_interval: int
    receive_wait_seconds: int
    receive_max_messages: int
    drain_seconds: float
    retry_delay_seconds: float
    max_input_bytes: int
    model_cache_dir: Path
    weights_cache_dir: Path | None
    max_batch_size: int
    max_wait_ms: float
    token_budget: int
    echo_batching: bool
    busy_file: str
    ecs_agent_uri: str
    compute: str


class WebhookSettings(AwsPart):
    """The webhook dispatcher (and the API's secret store)."""

    table_name: str
    webhook_queue_url: str
    webhook_dlq_url: str
    webhook_secrets_key: str
    webhook_retry_base_seconds: float
    webhook_retry_max_delay_seconds: float
    webhook_retry_window_seconds: float
    local_mode: bool


class SweeperSettings(AwsPart):
    """The sweeper: expiry of queued jobs and takeover of lapsed leases."""

    table_name: str
    topic_arn: str
    queue_urls: dict[str, str]
    max_receive_count: int
    sweep_seconds: float
    lease_interval: int


class ScalingSettings(AwsPart):
    """Wake on submit and the backlog metric: what runs where and how to reach it."""

    queue_urls: dict[str, str]
    models: list[str]
    compute: str
    ecs_cluster: str
    ecs_services: dict[str, str]
    sagemaker_endpoints: dict[str, str]
    wake_cache_seconds: float
