"""Deployment settings, from CDK context (``cdk.json`` or ``-c key=value``), validated at synth
by one pydantic model, :class:`ContextSettings`: each setting a field with its default and limits
(the AWS document of each limit beside it; ``docs/deploy.md`` documents each). Command-line
strings are converted by pydantic's lax mode. Rules between settings are
:meth:`ContextSettings.conflicts`, those of each model's compute
:func:`infra.model_compute.problems`; :func:`load_config` reports all in one
:class:`DeployConfigError`.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, ValidationError

try:  # the model catalogue (models.yaml) is the source of truth for model ids
    from asyncinfer.models.catalogue import Catalogue, load_catalogue
except ImportError:  # running from a checkout without `pip install -e .`
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))
    from asyncinfer.models.catalogue import Catalogue, load_catalogue

from infra.model_compute import ModelCompute
from infra.model_compute import problems as compute_problems
from infra.model_compute import resolve as resolve_compute

#: The repository root: ``models_file`` and ``worker_dockerfile`` are relative to it.
REPO_ROOT = Path(__file__).resolve().parent.parent

#: SQS visibility timeout maximum, seconds (SQS API reference, SetQueueAttributes).
SQS_MAX_VISIBILITY = 43_200
#: Lambda guidance: a source queue's visibility timeout should be at least six times the function
#: timeout (Lambda developer guide, "Using Lambda with Amazon SQS").
SQS_LAMBDA_VISIBILITY_FACTOR = 6
#: Instance families with NVIDIA GPUs that the ECS GPU-optimised AMI (x86_64) supports.
GPU_FAMILIES = ("g4dn", "g5", "g6", "g6e", "gr6", "p3", "p3dn", "p4d", "p4de", "p5", "p5e")
#: CloudWatch Logs retention values, days (PutRetentionPolicy).
# fmt: off
LOG_RETENTION_DAYS = (1, 3, 5, 7, 14, 30, 60, 90, 120, 150, 180, 365, 400, 545, 731, 1096, 1827,
                      2192, 2557, 2922, 3288, 3653)
# fmt: on
#: AWS WAF rate-based rule limits, requests per 5-minute window per IP (RateBasedStatement).
WAF_RATE_MIN, WAF_RATE_MAX = 10, 2_000_000_000

#: An ``input_locations`` entry: an S3 bucket name (S3 naming rules), optionally ``/prefix``.
LOCATION_RE = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9](/[^*?\s,]*)?$")


def _items(v: Any) -> Any:
    """A list, a JSON list or a comma-separated string as stripped, non-empty, unique items."""
    if isinstance(v, str):
        s = v.strip()
        v = json.loads(s) if s.startswith("[") else s.split(",")
    if not isinstance(v, list | tuple):
        return v
    return tuple(dict.fromkeys(x for x in (str(i).strip().strip("/") for i in v) if x))


def _rule(ok: Callable[[Any], bool], message: str) -> AfterValidator:
    """A field check: ``ValueError(message)`` where ``ok(value)`` is false."""

    def check(v: Any) -> Any:
        if not ok(v):
            raise ValueError(message)
        return v

    return AfterValidator(check)


Str = Annotated[str, BeforeValidator(lambda v: str(v).strip())]
Bool = Annotated[bool, BeforeValidator(lambda v: v.strip() or False if isinstance(v, str) else v)]
Lower = BeforeValidator(lambda v: str(v).strip().lower())
Reserved = Annotated[int, Field(ge=0, le=1000)]


class ContextSettings(BaseModel):
    """The deployer's settings (durations in seconds unless the name says otherwise)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    compute: Annotated[Literal["ecs", "sagemaker"], Lower] = "ecs"
    instance_type: Str = "g5.xlarge"
    gpu: Bool = True
    min_workers: Annotated[int, Field(ge=0)] = 0
    max_workers: Annotated[int, Field(ge=1)] = 2
    #: Model ids to deploy; ``all`` is every catalogue entry.
    models: Annotated[tuple[str, ...], BeforeValidator(_items)] = ("all",)
    #: The catalogue, relative to the repository root (or absolute).
    models_file: Str = "models.yaml"
    visibility_timeout: Annotated[int, Field(ge=1, le=SQS_MAX_VISIBILITY)] = 120
    #: 0: a third of the visibility timeout (:attr:`effective_heartbeat`).
    heartbeat_seconds: Annotated[float, Field(ge=0)] = 0
    #: SQS maxReceiveCount range (SQS developer guide, "dead-letter queues").
    max_receive_count: Annotated[int, Field(ge=1, le=1000)] = 3
    throttle_rate: Annotated[float, Field(gt=0)] = 50
    throttle_burst: Annotated[int, Field(ge=1)] = 100
    quota_limit: Annotated[int, Field(ge=1)] = 100_000
    #: API Gateway quota periods (UsagePlan QuotaSettings.Period).
    quota_period: Annotated[
        Literal["DAY", "WEEK", "MONTH"], BeforeValidator(lambda v: str(v).strip().upper())
    ] = "DAY"
    #: AWS WAF inspects at most 64 KB of a regional API Gateway body (AssociationConfig); 0: none.
    waf_max_body_kb: Annotated[int, Field(ge=0, le=64)] = 0
    backlog_per_worker: Annotated[int, Field(ge=1)] = 20
    #: ECS task definition parameters, "stopTimeout": 2..120.
    stop_timeout: Annotated[int, Field(ge=2, le=120)] = 120
    drain_seconds: Annotated[int, Field(ge=0)] = 100
    #: AsyncInferenceClientConfig MaxConcurrentInvocationsPerInstance: 1..1000.
    sagemaker_max_concurrent_invocations: Annotated[int, Field(ge=1, le=1000)] = 4
    #: Lambda timeouts: 1..900 s (the Lambda maximum).
    bridge_timeout: Annotated[int, Field(ge=1, le=900)] = 20
    dlq_handler_timeout: Annotated[int, Field(ge=1, le=900)] = 30
    object_expiry_days: Annotated[int, Field(ge=1)] = 7
    record_retention_days: Annotated[int, Field(ge=1)] = 30
    log_retention_days: Annotated[
        int, _rule(lambda v: v in LOG_RETENTION_DAYS, f"must be one of {LOG_RETENTION_DAYS}")
    ] = 30
    oldest_message_alarm_seconds: Annotated[int, Field(ge=60)] = 900
    failure_rate_alarm_percent: Annotated[float, Field(gt=0, le=100)] = 10
    alarm_email: Annotated[Str, Field(pattern=r"^$|^[^@\s]+@[^@\s]+\.[^@\s]+$")] = ""
    retain_data: Bool = True
    lambda_body_guard: Bool = True
    #: 0: the layer of the installed Powertools version (Powertools' public SSM parameter).
    powertools_layer_version: Annotated[int, Field(ge=0)] = 0
    worker_dockerfile: Str = "container/Dockerfile"
    #: ``bucket`` or ``bucket/prefix`` entries jobs may name as ``input_url`` (read access is
    #: granted to the workers; ``ASYNCINFER_INPUT_LOCATIONS``).
    input_locations: Annotated[
        tuple[str, ...],
        BeforeValidator(_items),
        _rule(lambda v: all(map(LOCATION_RE.match, v)), "entries must be bucket or bucket/prefix"),
    ] = ()
    resource_prefix: Annotated[Str, Field(pattern=r"^([A-Za-z0-9][A-Za-z0-9_-]*)?$")] = ""
    container_insights: Bool = False
    dashboard: Bool = True
    trace_scheduled_functions: Bool = True
    instance_ssm_access: Bool = False
    waf_rate_limit: Annotated[
        int,
        _rule(
            lambda v: not v or WAF_RATE_MIN <= v <= WAF_RATE_MAX,
            f"must be 0 (no rate rule) or {WAF_RATE_MIN}..{WAF_RATE_MAX} requests per 5 min per IP",
        ),
    ] = 2000
    dlq_reserved_concurrency: Reserved = 5
    #: The dispatcher's SQS event source takes the same number as its MaximumConcurrency (2..1000).
    webhooks_reserved_concurrency: Annotated[
        Reserved, _rule(lambda v: v != 1, "must be 0 (none) or 2..1000 (MaximumConcurrency)")
    ] = 10
    sweeper_reserved_concurrency: Reserved = 1
    bridge_reserved_concurrency: Reserved = 10
    completion_reserved_concurrency: Reserved = 10

    def conflicts(self, known: list[str]) -> list[str]:
        """Every rule between settings that these values break, one line each (``known``: the
        catalogue's ids); empty when they are consistent."""
        vis, hb, itype = self.visibility_timeout, self.effective_heartbeat, self.ec2_instance_type
        unknown = [m for m in self.models if m not in known]
        typed = re.fullmatch(r"[a-z][a-z0-9-]*\.[a-z0-9]+", itype)
        dockerfile = REPO_ROOT / self.worker_dockerfile
        need = SQS_LAMBDA_VISIBILITY_FACTOR * self.bridge_timeout
        rules = [
            (unknown, f"models: unknown model id(s) {unknown}; known: {sorted(known)}"),
            (not self.models, "models: at least one model must be deployed"),
            (
                not typed,
                f"instance_type={self.instance_type!r} is not an instance type like g5.xlarge",
            ),
            (
                typed and self.gpu and itype.split(".")[0] not in GPU_FAMILIES,
                f"instance_type={self.instance_type!r} has no NVIDIA GPU supported by the ECS GPU "
                f"AMI (families {', '.join(GPU_FAMILIES)}); set gpu=false for CPU only",
            ),
            (
                self.max_workers < self.min_workers,
                f"max_workers={self.max_workers} is below min_workers={self.min_workers}",
            ),
            (
                vis < 3 * hb,
                f"visibility_timeout={vis} is shorter than three heartbeat intervals (3 x "
                f"heartbeat_seconds={hb:g} = {3 * hb:g}); a missed heartbeat would redeliver a job",
            ),
            (
                self.drain_seconds >= self.stop_timeout,
                f"drain_seconds={self.drain_seconds} must be below stop_timeout="
                f"{self.stop_timeout} (ECS kills the container at stop_timeout)",
            ),
            (
                self.compute == "sagemaker" and vis < need,
                f"visibility_timeout={vis} is less than six times bridge_timeout="
                f"{self.bridge_timeout} (the SQS-triggered bridge Lambda needs >= {need})",
            ),
            (
                not dockerfile.is_file() or REPO_ROOT not in dockerfile.resolve().parents,
                f"worker_dockerfile={self.worker_dockerfile!r}: no such file inside the repository "
                "(the worker image builds from the repository root with this Dockerfile)",
            ),
        ]
        return [message for broken, message in rules if broken]

    @property
    def models_path(self) -> Path:
        """The catalogue file, absolute."""
        return (REPO_ROOT / self.models_file).resolve()

    def prefix_for(self, stack_name: str) -> str:
        """The resource prefix (:mod:`asyncinfer.core.naming`): the set one, else
        ``<stack name>-``."""
        return self.resource_prefix or f"{stack_name}-"

    def reserved_concurrency(self) -> dict[str, int]:
        """Function (``dlq``, ``webhooks``, ...) -> reserved concurrency; 0 = none reserved."""
        return {
            k.removesuffix("_reserved_concurrency"): getattr(self, k)
            for k in RESERVED_CONCURRENCY_KEYS
        }

    @property
    def total_reserved_concurrency(self) -> int:
        """Executions the functions reserve in all (the bridge and completion: SageMaker only)."""
        sm = self.compute == "sagemaker"
        return sum(
            n
            for k, n in self.reserved_concurrency().items()
            if sm or k not in ("bridge", "completion")
        )

    @property
    def sagemaker_instance_type(self) -> str:
        """The instance type with SageMaker's ``ml.`` prefix."""
        return f"ml.{self.ec2_instance_type}"

    @property
    def ec2_instance_type(self) -> str:
        """The instance type without SageMaker's ``ml.`` prefix."""
        return self.instance_type.removeprefix("ml.")

    @property
    def effective_heartbeat(self) -> float:
        """Heartbeat interval, seconds: the set value, else a third of the visibility timeout
        (the same rule as :attr:`asyncinfer.core.settings.Settings.heartbeat_interval`)."""
        return self.heartbeat_seconds or self.visibility_timeout / 3


class DeployConfig(ContextSettings):
    """Validated settings with what they resolve to: ``catalogue``, the loaded ``models_file``,
    and ``model_compute``, each deployed model's compute (:mod:`infra.model_compute`: an
    explicit context key overrides the entry's value). ``compute`` is the stack's one backend."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    catalogue: Catalogue
    model_compute: dict[str, ModelCompute]


#: The internal functions whose reserved concurrency is a setting: a burst of API long polls
#: cannot take the account's concurrency away from them.
RESERVED_CONCURRENCY_KEYS = tuple(n for n in ContextSettings.model_fields if "_reserved_" in n)
#: Default value of every context key (the ``asyncinfer:`` prefix is optional on the CLI).
DEFAULTS: dict[str, Any] = {n: f.default for n, f in ContextSettings.model_fields.items()}


class DeployConfigError(ValueError):
    """Invalid deployment settings; ``problems`` lists every problem found."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = problems
        super().__init__(
            "invalid asyncinfer context settings:\n" + "\n".join(f"  - {p}" for p in problems)
        )


def load_config(context: Mapping[str, Any]) -> DeployConfig:
    """Build and validate a :class:`DeployConfig` from CDK context values.

    Args:
        context: key -> value; keys may carry an ``asyncinfer:`` prefix. Unknown keys starting
            with ``asyncinfer:`` are reported as problems (typos); other keys are ignored.

    A malformed value is reported and its default used for the rules between settings. Each
    deployed entry's compute is resolved from the catalogue (:func:`infra.model_compute.resolve`).

    Raises:
        CatalogueError: the catalogue is invalid (its one error, listing every problem).
        DeployConfigError: listing every malformed value and every conflict between values.
    """
    problems: list[str] = []
    given: dict[str, Any] = {}
    for key, value in context.items():
        name = key.removeprefix("asyncinfer:")
        if name in DEFAULTS:
            given[name] = value
        elif key.startswith("asyncinfer:"):
            problems.append(f"unknown setting {key!r} (known: {', '.join(sorted(DEFAULTS))})")
    try:
        settings = ContextSettings.model_validate(given)
    except ValidationError as exc:
        bad = {str(e["loc"][0]) for e in exc.errors()}
        problems += [f"{e['loc'][0]}={e['input']!r} is not valid: {e['msg']}" for e in exc.errors()]
        settings = ContextSettings.model_validate({k: v for k, v in given.items() if k not in bad})
    values = settings.model_dump()
    catalogue = load_catalogue(REPO_ROOT / settings.models_file)
    if settings.models == ("all",):
        values["models"] = tuple(catalogue.ids)
    computes = resolve_compute(catalogue, values["models"], values, set(given))
    backends = {c.backend for c in computes.values()}
    if "compute" not in given and len(backends) == 1:
        values["compute"] = backends.pop()
    settings = ContextSettings.model_validate(values)
    problems += settings.conflicts(catalogue.ids)
    problems += compute_problems(computes, GPU_FAMILIES)
    if problems:
        raise DeployConfigError(problems)
    return DeployConfig(**values, catalogue=catalogue, model_compute=computes)
