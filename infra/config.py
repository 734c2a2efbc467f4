"""Deployment settings, read from CDK context (``cdk.json`` or ``-c key=value``) and validated
at synth time. Every conflict found is reported together in one :class:`DeployConfigError`.

Context keys and their defaults are listed in :data:`DEFAULTS` (``docs/deploy.md`` documents
each). Values given on the command line arrive as strings; :func:`load_config` converts them.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent

try:  # the model catalogue (models.yaml) is the source of truth for model ids
    from asyncinfer.models.catalogue import Catalogue, load_catalogue
except ImportError:  # running from a checkout without `pip install -e .`
    sys.path.insert(0, str(REPO_ROOT / "src"))
    from asyncinfer.models.catalogue import Catalogue, load_catalogue

from infra.model_compute import ModelCompute  # noqa: E402
from infra.model_compute import problems as compute_problems  # noqa: E402
from infra.model_compute import resolve as resolve_compute  # noqa: E402

#: Default value of every context key (the ``asyncinfer:`` prefix is optional on the CLI).
DEFAULTS: dict[str, Any] = {
    "compute": "ecs",
    "instance_type": "g5.xlarge",
    "gpu": True,
    "min_workers": 0,
    "max_workers": 2,
    "models": "all",
    "models_file": "models.yaml",
    "visibility_timeout": 120,
    "heartbeat_seconds": 0,
    "max_receive_count": 3,
    "throttle_rate": 50,
    "throttle_burst": 100,
    "quota_limit": 100_000,
    "quota_period": "DAY",
    "waf_max_body_kb": 0,
    "backlog_per_worker": 20,
    "stop_timeout": 120,
    "drain_seconds": 100,
    "sagemaker_max_concurrent_invocations": 4,
    "bridge_timeout": 20,
    "dlq_handler_timeout": 30,
    "object_expiry_days": 7,
    "record_retention_days": 30,
    "log_retention_days": 30,
    "oldest_message_alarm_seconds": 900,
    "failure_rate_alarm_percent": 10,
    "alarm_email": "",
    "retain_data": True,
    "lambda_body_guard": True,
    "powertools_layer_version": 0,
    "worker_dockerfile": "container/Dockerfile",
    "input_locations": "",
    "resource_prefix": "",
    "container_insights": False,
    "dashboard": True,
    "trace_scheduled_functions": True,
    "instance_ssm_access": False,
    "waf_rate_limit": 2000,
    "dlq_reserved_concurrency": 5,
    "webhooks_reserved_concurrency": 10,
    "sweeper_reserved_concurrency": 1,
    "bridge_reserved_concurrency": 10,
    "completion_reserved_concurrency": 10,
}

#: The internal functions whose reserved concurrency is a setting (issue 14, behaviour 7): a
#: burst of API long polls cannot take the account's concurrency away from them.
RESERVED_CONCURRENCY_KEYS = (
    "dlq_reserved_concurrency",
    "webhooks_reserved_concurrency",
    "sweeper_reserved_concurrency",
    "bridge_reserved_concurrency",
    "completion_reserved_concurrency",
)
#: AWS WAF rate-based rule limits, requests per 5-minute window per IP (RateBasedStatement).
WAF_RATE_MIN, WAF_RATE_MAX = 10, 2_000_000_000

#: ECS task stopTimeout maximum, seconds (ECS task definition parameters, "stopTimeout").
ECS_MAX_STOP_TIMEOUT = 120
#: SQS visibility timeout range, seconds (SQS API reference, SetQueueAttributes).
SQS_MAX_VISIBILITY = 43_200
#: SQS maxReceiveCount range (SQS developer guide, "dead-letter queues").
SQS_MAX_RECEIVE_COUNT = 1000
#: Lambda guidance: a source queue's visibility timeout should be at least six times the function
#: timeout (Lambda developer guide, "Using Lambda with Amazon SQS").
SQS_LAMBDA_VISIBILITY_FACTOR = 6
#: SQS event source ScalingConfig MaximumConcurrency range is 2..1000 (Lambda API reference).
SQS_MAX_CONCURRENCY = 1000
#: SageMaker async MaxConcurrentInvocationsPerInstance range (API reference,
#: AsyncInferenceClientConfig: 1..1000).
SAGEMAKER_MAX_CONCURRENCY = 1000
#: Instance families with NVIDIA GPUs that the ECS GPU-optimised AMI (x86_64) supports.
GPU_FAMILIES = ("g4dn", "g5", "g6", "g6e", "gr6", "p3", "p3dn", "p4d", "p4de", "p5", "p5e")
#: API Gateway quota periods (UsagePlan QuotaSettings.Period).
QUOTA_PERIODS = ("DAY", "WEEK", "MONTH")
#: CloudWatch Logs retention values, days (PutRetentionPolicy).
LOG_RETENTION_DAYS = (
    1,
    3,
    5,
    7,
    14,
    30,
    60,
    90,
    120,
    150,
    180,
    365,
    400,
    545,
    731,
    1096,
    1827,
    2192,
    2557,
    2922,
    3288,
    3653,
)


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


def _to_bool(v: Any) -> bool:
    if isinstance(v, bool):
        return v
    s = str(v).strip().lower()
    if s in ("1", "true", "yes", "on"):
        return True
    if s in ("0", "false", "no", "off", ""):
        return False
    raise ValueError(f"{v!r} is not a boolean")


def _to_int(v: Any) -> int:
    if isinstance(v, bool):
        raise ValueError(f"{v!r} is not an integer")
    if isinstance(v, float) and not v.is_integer():
        raise ValueError(f"{v!r} is not an integer")
    return int(v)


def _to_models(v: Any) -> tuple[str, ...]:
    if isinstance(v, list | tuple):
        items = [str(x).strip() for x in v]
    else:
        s = str(v).strip()
        if s.startswith("["):
            items = [str(x).strip() for x in json.loads(s)]
        else:
            items = [x.strip() for x in s.split(",")]
    items = [x for x in items if x]
    return tuple(dict.fromkeys(items))  # ("all",) is resolved against the catalogue


#: An ``input_locations`` entry: an S3 bucket name (S3 naming rules), optionally ``/prefix``.
_LOCATION_RE = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9](/[^*?\s,]*)?$")


def _to_locations(v: Any) -> tuple[str, ...]:
    items = [str(x).strip() for x in v] if isinstance(v, list | tuple) else str(v).split(",")
    out = tuple(dict.fromkeys(x.strip().strip("/") for x in items if x.strip()))
    bad = [x for x in out if not _LOCATION_RE.match(x)]
    if bad:
        raise ValueError(f"not bucket or bucket/prefix: {bad}")
    return out


_CONVERTERS: dict[str, Callable[[Any], Any]] = {
    "input_locations": _to_locations,
    "compute": lambda v: str(v).strip().lower(),
    "instance_type": lambda v: str(v).strip(),
    "gpu": _to_bool,
    "models": _to_models,
    "models_file": lambda v: str(v).strip(),
    "heartbeat_seconds": float,
    "throttle_rate": float,
    "quota_period": lambda v: str(v).strip().upper(),
    "failure_rate_alarm_percent": float,
    "alarm_email": lambda v: str(v).strip(),
    "retain_data": _to_bool,
    "lambda_body_guard": _to_bool,
    "resource_prefix": lambda v: str(v).strip(),
    "container_insights": _to_bool,
    "dashboard": _to_bool,
    "trace_scheduled_functions": _to_bool,
    "instance_ssm_access": _to_bool,
}


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
        conv = _CONVERTERS.get(name) or (_to_int if isinstance(default, int) else str)
        try:
            values[name] = conv(raw[name])
        except (TypeError, ValueError) as exc:
            problems.append(f"{name}={raw[name]!r} is not valid: {exc}")
            values[name] = conv(default)
    catalogue = load_catalogue(REPO_ROOT / values["models_file"])
    if values["models"] == ("all",):
        values["models"] = tuple(catalogue.ids)
    computes = resolve_compute(catalogue, values["models"], values, explicit)
    backends = {c.backend for c in computes.values()}
    if "compute" not in explicit and len(backends) == 1:
        values["compute"] = backends.pop()
    problems.extend(_conflicts(values, catalogue.ids))
    problems.extend(compute_problems(computes, GPU_FAMILIES))
    if problems:
        raise DeployConfigError(problems)
    return DeployConfig(**values, catalogue=catalogue, model_compute=computes)


def _conflicts(v: dict[str, Any], known: list[str]) -> list[str]:
    """Every rule the values break (``known``: the catalogue's ids); empty when they are
    consistent."""
    p: list[str] = []
    if v["compute"] not in ("ecs", "sagemaker"):
        p.append(f"compute={v['compute']!r} must be 'ecs' or 'sagemaker'")
    unknown = [m for m in v["models"] if m not in known]
    if unknown:
        p.append(f"models: unknown model id(s) {unknown}; known: {sorted(known)}")
    if not v["models"]:
        p.append("models: at least one model must be deployed")
    itype = v["instance_type"].removeprefix("ml.")
    if not re.fullmatch(r"[a-z][a-z0-9-]*\.[a-z0-9]+", itype):
        p.append(f"instance_type={v['instance_type']!r} is not an instance type like g5.xlarge")
    elif v["gpu"] and itype.split(".")[0] not in GPU_FAMILIES:
        p.append(
            f"instance_type={v['instance_type']!r} has no NVIDIA GPU supported by the ECS GPU AMI "
            f"(families {', '.join(GPU_FAMILIES)}); set gpu=false for a CPU-only deployment"
        )
    if v["min_workers"] < 0:
        p.append(f"min_workers={v['min_workers']} must be >= 0")
    if v["max_workers"] < 1:
        p.append(f"max_workers={v['max_workers']} must be >= 1")
    if v["max_workers"] < v["min_workers"]:
        p.append(f"max_workers={v['max_workers']} is below min_workers={v['min_workers']}")
    vis = v["visibility_timeout"]
    if not 0 < vis <= SQS_MAX_VISIBILITY:
        p.append(f"visibility_timeout={vis} must be in 1..{SQS_MAX_VISIBILITY} seconds")
    hb = v["heartbeat_seconds"] or vis / 3
    if hb <= 0:
        p.append(f"heartbeat_seconds={v['heartbeat_seconds']} must be > 0")
    elif vis < 3 * hb:
        p.append(
            f"visibility_timeout={vis} is shorter than three heartbeat intervals "
            f"(3 x heartbeat_seconds={hb:g} = {3 * hb:g}); a missed heartbeat would redeliver "
            "a running job"
        )
    if not 1 <= v["max_receive_count"] <= SQS_MAX_RECEIVE_COUNT:
        p.append(
            f"max_receive_count={v['max_receive_count']} must be in 1..{SQS_MAX_RECEIVE_COUNT}"
        )
    if v["throttle_rate"] <= 0:
        p.append(f"throttle_rate={v['throttle_rate']} must be > 0 requests/s")
    if v["throttle_burst"] < 1:
        p.append(f"throttle_burst={v['throttle_burst']} must be >= 1")
    if v["quota_limit"] < 1:
        p.append(f"quota_limit={v['quota_limit']} must be >= 1")
    if v["quota_period"] not in QUOTA_PERIODS:
        p.append(f"quota_period={v['quota_period']!r} must be one of {QUOTA_PERIODS}")
    if not 0 <= v["waf_max_body_kb"] <= 64:
        # AWS WAF inspects at most 64 KB of a regional API Gateway body (AssociationConfig).
        p.append(f"waf_max_body_kb={v['waf_max_body_kb']} must be 0 (no WAF) or 1..64")
    if v["backlog_per_worker"] < 1:
        p.append(f"backlog_per_worker={v['backlog_per_worker']} must be >= 1")
    if not 2 <= v["stop_timeout"] <= ECS_MAX_STOP_TIMEOUT:
        p.append(f"stop_timeout={v['stop_timeout']} must be in 2..{ECS_MAX_STOP_TIMEOUT} seconds")
    if v["drain_seconds"] < 0:
        p.append(f"drain_seconds={v['drain_seconds']} must be >= 0")
    elif v["drain_seconds"] >= v["stop_timeout"]:
        p.append(
            f"drain_seconds={v['drain_seconds']} must be below stop_timeout={v['stop_timeout']} "
            "(ECS kills the container at stop_timeout)"
        )
    if not 1 <= v["sagemaker_max_concurrent_invocations"] <= SAGEMAKER_MAX_CONCURRENCY:
        p.append(
            f"sagemaker_max_concurrent_invocations={v['sagemaker_max_concurrent_invocations']} "
            f"must be in 1..{SAGEMAKER_MAX_CONCURRENCY}"
        )
    for name in ("bridge_timeout", "dlq_handler_timeout"):
        if not 1 <= v[name] <= 900:
            p.append(f"{name}={v[name]} must be in 1..900 seconds (Lambda maximum)")
    if v["compute"] == "sagemaker" and vis < SQS_LAMBDA_VISIBILITY_FACTOR * v["bridge_timeout"]:
        p.append(
            f"visibility_timeout={vis} is less than six times bridge_timeout="
            f"{v['bridge_timeout']} (the SQS-triggered bridge Lambda needs >= "
            f"{SQS_LAMBDA_VISIBILITY_FACTOR * v['bridge_timeout']})"
        )
    if v["dlq_handler_timeout"] * SQS_LAMBDA_VISIBILITY_FACTOR > SQS_MAX_VISIBILITY:
        p.append("dlq_handler_timeout is too long for a dead-letter queue visibility timeout")
    for name in ("object_expiry_days", "record_retention_days"):
        if v[name] < 1:
            p.append(f"{name}={v[name]} must be >= 1 day")
    if v["log_retention_days"] not in LOG_RETENTION_DAYS:
        p.append(
            f"log_retention_days={v['log_retention_days']} must be one of {LOG_RETENTION_DAYS}"
        )
    if v["oldest_message_alarm_seconds"] < 60:
        p.append(f"oldest_message_alarm_seconds={v['oldest_message_alarm_seconds']} must be >= 60")
    if not 0 < v["failure_rate_alarm_percent"] <= 100:
        p.append(
            f"failure_rate_alarm_percent={v['failure_rate_alarm_percent']} must be in (0, 100]"
        )
    if v["alarm_email"] and not re.fullmatch(r"[^@\s]+@[^@\s]+\.[^@\s]+", v["alarm_email"]):
        p.append(f"alarm_email={v['alarm_email']!r} is not an e-mail address")
    dockerfile = REPO_ROOT / v["worker_dockerfile"]
    if not dockerfile.is_file() or REPO_ROOT not in dockerfile.resolve().parents:
        p.append(
            f"worker_dockerfile={v['worker_dockerfile']!r}: no such file inside the repository "
            "(the worker image builds from the repository root with this Dockerfile)"
        )
    wrc = v["webhooks_reserved_concurrency"]
    if wrc != 0 and not 2 <= wrc <= SQS_MAX_CONCURRENCY:
        # The dispatcher's SQS event source takes the same number as its maximum concurrency.
        p.append(
            f"webhooks_reserved_concurrency={wrc} must be 0 (none) or in "
            f"2..{SQS_MAX_CONCURRENCY} (SQS event source MaximumConcurrency)"
        )
    if v["powertools_layer_version"] < 0:
        p.append(
            f"powertools_layer_version={v['powertools_layer_version']} must be >= 1, or 0 for the "
            "layer of the installed Powertools version (Powertools' public SSM parameter)"
        )
    if v["waf_rate_limit"] and not WAF_RATE_MIN <= v["waf_rate_limit"] <= WAF_RATE_MAX:
        p.append(
            f"waf_rate_limit={v['waf_rate_limit']} must be 0 (no rate rule) or "
            f"{WAF_RATE_MIN}..{WAF_RATE_MAX} requests per 5 minutes per IP"
        )
    for name in RESERVED_CONCURRENCY_KEYS:
        if not 0 <= v[name] <= 1000:
            p.append(f"{name}={v[name]} must be in 0..1000 (0: none reserved)")
    if v["resource_prefix"] and not re.fullmatch(
        r"[A-Za-z0-9][A-Za-z0-9_-]*", v["resource_prefix"]
    ):
        p.append(f"resource_prefix={v['resource_prefix']!r} must be letters, digits, '-' or '_'")
    return p
