"""The parts of :class:`~asyncinfer.core.settings.Settings` each component reads.

A part is a frozen pydantic model whose fields carry the names of the
:class:`~asyncinfer.core.settings.Settings` fields (or properties, such as ``lease_interval``)
it copies; nothing is declared twice with a default, so the defaults stay in one place. A field
typed with another part (``ApiSettings.scaling``) holds that part: a component that drives
another's code (the API wakes workers, the batch expander submits through the job service) carries
the other's part, not its fields (the worker carries ``model_settings``, its handlers' part).
Build one with ``settings.api`` / ``.worker`` / ``.model_settings`` / ``.webhooks`` /
``.sweeper`` / ``.scaling`` / ``.dlq`` / ``.bridge`` / ``.completion`` / ``.openai`` (or
:meth:`SettingsPart.of`); each entry point (Lambda handler, worker main, local stack) builds its
part once from :func:`~asyncinfer.core.settings.get_settings` and hands it to the component.
:meth:`SettingsPart.env_names` lists the environment variables a part depends on: what the CDK
app and the local stack must set for that component (:mod:`asyncinfer.core.topology` names each
function's part). The shared layers are typed with :mod:`asyncinfer.core.settings_needs`, which
the parts satisfy.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Self

from pydantic import BaseModel, ConfigDict

from asyncinfer.core.errors import ConfigError

if TYPE_CHECKING:
    from asyncinfer.core.settings import Settings


class SettingsPart(BaseModel):
    """Base of the parts: frozen, built from a :class:`Settings`."""

    model_config = ConfigDict(frozen=True)

    @classmethod
    def of(cls, settings: Settings) -> Self:
        """This part of ``settings`` (each field copied from the attribute of the same name; a
        field typed with a part gets that part of ``settings``)."""
        return cls.model_validate({name: getattr(settings, name) for name in cls.model_fields})

    @classmethod
    def source_fields(cls) -> list[str]:
        """The :class:`Settings` fields this part depends on (derived ones and nested parts
        expanded)."""
        out: list[str] = []
        for name, info in cls.model_fields.items():
            nested = info.annotation
            if isinstance(nested, type) and issubclass(nested, SettingsPart):
                sources: tuple[str, ...] = tuple(nested.source_fields())
            else:
                sources = DERIVED_FROM.get(name, (name,))
            for source in sources:
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


def queue_url_of(queue_urls: dict[str, str], model: str, priority: str = "normal") -> str:
    """The SQS queue URL of ``model`` for a priority class.

    ``queue_urls`` keys are model ids (the ``normal`` queue) and ``<model>#high`` /
    ``<model>#low`` for the other classes (:func:`asyncinfer.core.naming.queue_key`); a class
    without its own queue shares the normal one. Raises :class:`ConfigError` if the model has no
    queue at all.
    """
    if priority != "normal" and f"{model}#{priority}" in queue_urls:
        return queue_urls[f"{model}#{priority}"]
    try:
        return queue_urls[model]
    except KeyError:
        raise ConfigError(f"no queue configured for model {model!r}") from None


def priority_queues_of(queue_urls: dict[str, str], model: str) -> dict[str, str]:
    """``{priority: queue URL}`` of the classes of ``model`` that have their own queue (always
    ``normal``; :class:`ConfigError` without it), highest class first."""
    out = {"high": queue_urls.get(f"{model}#high"), "normal": queue_url_of(queue_urls, model)}
    out["low"] = queue_urls.get(f"{model}#low")
    return {k: v for k, v in out.items() if v}


class AwsPart(SettingsPart):
    """Where the AWS clients connect: every part has these (``clients.client`` reads them)."""

    endpoint_url: str | None
    region: str


class QueuesPart(AwsPart):
    """A part that sends to or reads the job queues: their URLs and the lookups by class."""

    queue_urls: dict[str, str]

    def queue_url(self, model: str, priority: str = "normal") -> str:
        """See :func:`queue_url_of`."""
        return queue_url_of(self.queue_urls, model, priority)

    def priority_queues(self, model: str) -> dict[str, str]:
        """See :func:`priority_queues_of`."""
        return priority_queues_of(self.queue_urls, model)


class EventsPart(AwsPart):
    """A part that writes job records and publishes their events (the job store, the payload
    store and the event publisher: :class:`~asyncinfer.core.settings_needs.EventsConfig`)."""

    table_name: str
    lease_interval: int
    visibility_timeout_seconds: int  # a hand-back's requeue deadline (JobStore.requeue_deadline)
    bucket: str
    max_input_bytes: int
    topic_arn: str


class ScalingSettings(QueuesPart):
    """Wake on submit and the backlog metric: what runs where and how to reach it."""

    models: list[str]
    compute: str
    ecs_cluster: str
    ecs_services: dict[str, str]
    sagemaker_endpoints: dict[str, str]
    wake_cache_seconds: float


class ApiSettings(EventsPart, QueuesPart):
    """The API Lambda's ``/v1``: submit, read, list, cancel, uploads, waits, webhook secrets;
    ``scaling``: wake on submit."""

    models: list[str]
    models_file: Path | None
    inline_input_limit_bytes: int
    record_retention_seconds: int
    input_locations: list[str]
    submit_lease_seconds: int
    max_waits_per_tenant: int
    webhook_secrets_key: str
    local_mode: bool
    scaling: ScalingSettings


class ModelSettings(SettingsPart):
    """What the model layer reads (:mod:`asyncinfer.models`): the catalogue file, the model and
    weights caches, the causal-LM token budget (tokens; 0: the entry's or automatic), the echo
    model's batching and an ``engine.image`` entry's engine URL. The handlers
    (:class:`~asyncinfer.models.base.ModelHandler` ``settings=``) and
    :func:`asyncinfer.models.weights.default_cache_root` take it; the worker carries it
    (``WorkerSettings.model_settings``)."""

    models_file: Path | None
    model_cache_dir: Path
    weights_cache_dir: Path | None
    token_budget: int
    echo_batching: bool
    engine_url: str


class WorkerSettings(EventsPart, QueuesPart):
    """A GPU worker (ECS task or SageMaker container): intake, held messages, the watcher (and
    what its model handlers read: the catalogue, caches, batching limits; ``model_settings``:
    the part handed to the handlers)."""

    models_file: Path | None
    max_receive_count: int
    heartbeat_interval: float
    receive_wait_seconds: int
    receive_max_messages: int
    drain_seconds: float
    retry_delay_seconds: float
    model_cache_dir: Path
    weights_cache_dir: Path | None
    max_batch_size: int
    max_wait_ms: float
    token_budget: int
    echo_batching: bool
    busy_file: str
    ecs_agent_uri: str
    compute: str
    model_settings: ModelSettings


class WebhookSettings(AwsPart):
    """The webhook dispatcher: the job table (records and tenants' secrets), its queues, the
    retry schedule."""

    table_name: str
    lease_interval: int
    visibility_timeout_seconds: int  # the job store's requeue deadline (JobStore.requeue_deadline)
    webhook_queue_url: str
    webhook_dlq_url: str
    webhook_secrets_key: str
    webhook_retry_base_seconds: float
    webhook_retry_max_delay_seconds: float
    webhook_retry_window_seconds: float
    local_mode: bool


class SweeperSettings(EventsPart, QueuesPart):
    """The sweeper: expiry of queued jobs, takeover of lapsed leases, the events outbox."""

    max_receive_count: int
    sweep_seconds: float
    outbox_grace_seconds: float


class DlqSettings(EventsPart):
    """The DLQ handler: fails the jobs of dead-lettered messages and publishes their events."""


class BridgeSettings(EventsPart):
    """The SageMaker bridge: starts jobs on their model's endpoint; takes back an attempt it
    could not invoke."""

    max_receive_count: int
    sagemaker_endpoints: dict[str, str]
    sagemaker_engines: dict[str, str]  # engine entries: model id -> its engine's API


class CompletionSettings(EventsPart):
    """The SageMaker completion Lambda: finishes jobs from the endpoint's notifications (an
    engine entry's answers mapped to the job output; a retryable engine error retried while
    attempts are left)."""

    max_receive_count: int
    sagemaker_engines: dict[str, str]  # engine entries: model id -> its engine's API


class OpenAISettings(EventsPart):
    """The ``/openai/v1`` surface (Files, Batches), the batch expander and the batch-line
    counter; ``api``: the job service the expander submits lines through."""

    models: list[str]
    input_locations: list[str]
    local_mode: bool
    record_retention_seconds: int
    batch_queue_url: str
    batch_chunk_lines: int
    api: ApiSettings
