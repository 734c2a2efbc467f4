"""Deployment settings, read from CDK context (``cdk.json`` or ``-c key=value``) and validated
at synth time. Every conflict found is reported together in one :class:`DeployConfigError`.

Context keys and their defaults are listed in :data:`DEFAULTS` (``docs/deploy.md`` documents
each). Values given on the command line arrive as strings; :func:`load_config` converts them
(:mod:`infra.config_values`) and checks them (:mod:`infra.config_rules`, against the AWS limits
of :mod:`infra.config_limits`; this module re-exports those names).
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from infra.config_limits import (
    ECS_MAX_STOP_TIMEOUT,
    GPU_FAMILIES,
    LOG_RETENTION_DAYS,
    QUOTA_PERIODS,
    SAGEMAKER_MAX_CONCURRENCY,
    SQS_LAMBDA_VISIBILITY_FACTOR,
    SQS_MAX_CONCURRENCY,
    SQS_MAX_RECEIVE_COUNT,
    SQS_MAX_VISIBILITY,
    WAF_RATE_MAX,
    WAF_RATE_MIN,
)
from infra.config_rules import conflicts
from infra.config_values import DEFAULTS, REPO_ROOT, RESERVED_CONCURRENCY_KEYS, convert

try:  # the model catalogue (models.yaml) is the source of truth for model ids
    from asyncinfer.models.catalogue import Catalogue, load_catalogue
except ImportError:  # running from a checkout without `pip install -e .`
    sys.path.insert(0, str(REPO_ROOT / "src"))
    from asyncinfer.models.catalogue import Catalogue, load_catalogue

from infra.model_compute import ModelCompute
from infra.model_compute import problems as compute_problems
from infra.model_compute import resolve as resolve_compute

__all__ = [
    "DEFAULTS",
    "ECS_MAX_STOP_TIMEOUT",
    "GPU_FAMILIES",
    "LOG_RETENTION_DAYS",
    "QUOTA_PERIODS",
    "REPO_ROOT",
    "RESERVED_CONCURRENCY_KEYS",
    "SAGEMAKER_MAX_CONCURRENCY",
    "SQS_LAMBDA_VISIBILITY_FACTOR",
    "SQS_MAX_CONCURRENCY",
    "SQS_MAX_RECEIVE_COUNT",
    "SQS_MAX_VISIBILITY",
    "WAF_RATE_MAX",
    "WAF_RATE_MIN",
    "DeployConfig",
    "DeployConfigError",
    "load_config",
]


class DeployConfigError(ValueError):
    """Invalid deployment settings; ``problems`` lists every conflict found."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = problems
        super().__init__(
            "invalid asyncinfer context settings:\n" + "\n".join(f"  - {p}" for p in problems)
        )


@dataclass(frozen=True, kw_only=True)
class DeployConfig:
    """Validated deployment settings (durations in seconds unless the name says otherwise).

    Attributes mirror :data:`DEFAULTS`; ``models`` is the list of model ids to deploy,
    ``models_file`` the catalogue (relative to the repository root, or absolute), ``catalogue``
    the loaded catalogue and ``model_compute`` each deployed model's resolved compute
    (:mod:`infra.model_compute`: an explicit context key overrides the entry's value).
    ``compute`` is the stack's one backend.
    """

    compute: str
    instance_type: str
    gpu: bool
    min_workers: int
    max_workers: int
    models: tuple[str, ...]
    visibility_timeout: int
    heartbeat_seconds: float
    max_receive_count: int
    throttle_rate: float
    throttle_burst: int
    quota_limit: int
    quota_period: str
    waf_max_body_kb: int
    backlog_per_worker: int
    stop_timeout: int
    drain_seconds: int
    sagemaker_max_concurrent_invocations: int
    bridge_timeout: int
    dlq_handler_timeout: int
    object_expiry_days: int
    record_retention_days: int
    log_retention_days: int
    oldest_message_alarm_seconds: int
    failure_rate_alarm_percent: float
    alarm_email: str
    retain_data: bool
    lambda_body_guard: bool
    powertools_layer_version: int
    worker_dockerfile: str
    #: ``bucket`` or ``bucket/prefix`` entries jobs may name as ``input_url`` (read access is
    #: granted to the workers; ``ASYNCINFER_INPUT_LOCATIONS``).
    input_locations: tuple[str, ...]
    resource_prefix: str
    container_insights: bool
    dashboard: bool
    trace_scheduled_functions: bool
    instance_ssm_access: bool
    waf_rate_limit: int
    dlq_reserved_concurrency: int
    webhooks_reserved_concurrency: int
    sweeper_reserved_concurrency: int
    bridge_reserved_concurrency: int
    completion_reserved_concurrency: int
    models_file: str
    catalogue: Catalogue
    model_compute: dict[str, ModelCompute]

    @property
    def models_path(self) -> Path:
        """The catalogue file, absolute."""
        return (REPO_ROOT / self.models_file).resolve()

    def prefix_for(self, stack_name: str) -> str:
        """The resource prefix (:mod:`asyncinfer.core.naming`): the set one, else
        ``<stack name>-``."""
        return self.resource_prefix or f"{stack_name}-"

    @property
    def total_reserved_concurrency(self) -> int:
        """Executions the deployment's functions reserve in all (the SageMaker bridge and
        completion only in SageMaker mode)."""
        sm_only = ("bridge", "completion")
        return sum(
            n
            for k, n in self.reserved_concurrency().items()
            if self.compute == "sagemaker" or k not in sm_only
        )

    def reserved_concurrency(self) -> dict[str, int]:
        """Function (``dlq``, ``webhooks``, ...) -> reserved concurrency; 0 = none reserved."""
        return {
            k.removesuffix("_reserved_concurrency"): getattr(self, k)
            for k in RESERVED_CONCURRENCY_KEYS
        }

    @property
    def sagemaker_instance_type(self) -> str:
        """The instance type with SageMaker's ``ml.`` prefix."""
        t = self.instance_type
        return t if t.startswith("ml.") else f"ml.{t}"

    @property
    def ec2_instance_type(self) -> str:
        """The instance type without SageMaker's ``ml.`` prefix."""
        return self.instance_type.removeprefix("ml.")

    @property
    def effective_heartbeat(self) -> float:
        """Heartbeat interval, seconds: the set value, else a third of the visibility timeout
        (the same rule as :attr:`asyncinfer.core.settings.Settings.heartbeat_interval`)."""
        return self.heartbeat_seconds or self.visibility_timeout / 3


def load_config(context: Mapping[str, Any]) -> DeployConfig:
    """Build and validate a :class:`DeployConfig` from CDK context values.

    Args:
        context: key -> value; keys may carry an ``asyncinfer:`` prefix. Unknown keys starting
            with ``asyncinfer:`` are reported as conflicts (typos); other keys are ignored.

    The catalogue named by ``models_file`` is loaded first; each deployed entry's compute is
    resolved from it and the context (:func:`infra.model_compute.resolve`).

    Raises:
        CatalogueError: the catalogue is invalid (its one error, listing every problem).
        DeployConfigError: listing every malformed value and every conflict between values.
    """
    problems: list[str] = []
    raw: dict[str, Any] = dict(DEFAULTS)
    explicit: set[str] = set()
    for key, value in context.items():
        name = key.removeprefix("asyncinfer:")
        if name in DEFAULTS:
            raw[name] = value
            explicit.add(name)
        elif key.startswith("asyncinfer:"):
            problems.append(f"unknown setting {key!r} (known: {', '.join(sorted(DEFAULTS))})")
    values: dict[str, Any] = {}
    for name, default in DEFAULTS.items():
        try:
            values[name] = convert(name, raw[name])
        except (TypeError, ValueError) as exc:
            problems.append(f"{name}={raw[name]!r} is not valid: {exc}")
            values[name] = convert(name, default)
    catalogue = load_catalogue(REPO_ROOT / values["models_file"])
    if values["models"] == ("all",):
        values["models"] = tuple(catalogue.ids)
    computes = resolve_compute(catalogue, values["models"], values, explicit)
    backends = {c.backend for c in computes.values()}
    if "compute" not in explicit and len(backends) == 1:
        values["compute"] = backends.pop()
    problems.extend(conflicts(values, catalogue.ids))
    problems.extend(compute_problems(computes, GPU_FAMILIES))
    if problems:
        raise DeployConfigError(problems)
    return DeployConfig(**values, catalogue=catalogue, model_compute=computes)
