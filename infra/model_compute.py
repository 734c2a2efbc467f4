"""Per-model compute of a deployment: the catalogue entry's ``compute:`` block (spec
``shared/spec/models.md``) merged with the stack-wide CDK context.

Precedence, per field: a context key given explicitly (``cdk.json`` or ``-c key=value``:
``compute``, ``instance_type``, ``gpu``, ``min_workers``, ``max_workers``,
``backlog_per_worker``) applies to every entry, overriding the catalogue (a deploy-time
override, e.g. ``-c compute=sagemaker`` to try the default catalogue on SageMaker); otherwise
the entry's own value; otherwise the context default (:data:`infra.config.DEFAULTS`).

One stack runs one backend: the API's wake-on-submit, the sweeper and the workers' names are
per deployment (``ASYNCINFER_COMPUTE``). Entries whose backends differ are a configuration
problem (deploy one stack per backend with ``-c models=...``).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from aws_cdk import Aws
from aws_cdk import aws_iam as iam

from asyncinfer.models.catalogue import Catalogue, Engine, ModelEntry

#: The context keys that override every entry's ``compute:`` when given explicitly.
OVERRIDE_KEYS = (
    "compute",
    "instance_type",
    "gpu",
    "min_workers",
    "max_workers",
    "backlog_per_worker",
)
_S3 = re.compile(r"^s3://([^/]+)/?(.*)$")


@dataclass(frozen=True, kw_only=True)
class ModelCompute:
    """Where one model's workers run.

    Attributes:
        backend: ``ecs`` or ``sagemaker``.
        instance_type: EC2 instance type without SageMaker's ``ml.`` prefix.
        gpus: GPUs reserved per worker task (0: a CPU worker on CPU instances).
        min_workers / max_workers: scaling bounds, workers (tasks or endpoint instances).
        backlog_per_worker: target of the backlog-per-worker scaling policy, jobs.
        weight_prefixes: ``(bucket, key prefix)`` of each ``s3://`` source of the entry.
        warm_pool: stopped instances kept in the capacity's warm pool (ECS only; 0: none).
        engine: an ``openai-server`` entry's ``engine`` block when it has an ``image`` (the
            CDK app runs that engine beside the worker, :mod:`infra.components.engine`, or as
            the SageMaker endpoint's container, :mod:`infra.components.sagemaker_engine`).
        source: the entry's ``source`` (for such an engine: its weights).
    """

    backend: str
    instance_type: str
    gpus: int
    min_workers: int
    max_workers: int
    backlog_per_worker: float
    weight_prefixes: tuple[tuple[str, str], ...] = ()
    warm_pool: int = 0
    engine: Engine | None = None
    source: str | None = None

    @property
    def sagemaker_instance_type(self) -> str:
        """The instance type with SageMaker's ``ml.`` prefix."""
        return f"ml.{self.instance_type}"


#: GPUs of the NVIDIA instance types of the supported families (EC2 "Accelerated computing
#: instance specifications"); sizes not listed have one GPU. A type not here is not checked.
_MULTI_GPU_SIZES: dict[str, dict[str, int]] = {
    "g4dn": {"12xlarge": 4, "metal": 8},
    "g5": {"12xlarge": 4, "24xlarge": 4, "48xlarge": 8},
    "g6": {"12xlarge": 4, "24xlarge": 4, "48xlarge": 8},
    "g6e": {"12xlarge": 4, "24xlarge": 4, "48xlarge": 8},
    "gr6": {},
    "p3": {"8xlarge": 4, "16xlarge": 8},
    "p3dn": {"24xlarge": 8},
    "p4d": {"24xlarge": 8},
    "p4de": {"24xlarge": 8},
    "p5": {"48xlarge": 8},
    "p5e": {"48xlarge": 8},
}


def instance_gpus(instance_type: str) -> int | None:
    """GPUs of an EC2 instance type (without ``ml.``), or ``None`` for a type this table does
    not know (a CPU family, or a GPU family added after it)."""
    family, _, size = instance_type.partition(".")
    sizes = _MULTI_GPU_SIZES.get(family)
    if sizes is None:
        return None
    return sizes.get(size, 1)


def weight_prefixes(entry: ModelEntry) -> tuple[tuple[str, str], ...]:
    """``(bucket, prefix)`` of the entry's ``s3://`` source (a folder: the prefix ends with
    ``/`` unless empty), or ``()`` for other sources."""
    m = _S3.match(entry.source or "")
    if not m:
        return ()
    bucket, key = m.group(1), m.group(2)
    if key and not key.endswith("/"):
        key += "/"
    return ((bucket, key),)


def resolve(
    catalogue: Catalogue,
    models: Iterable[str],
    values: Mapping[str, Any],
    explicit: set[str],
) -> dict[str, ModelCompute]:
    """Each deployed model's :class:`ModelCompute` (see the module docstring for precedence).

    Args:
        catalogue: the loaded catalogue.
        models: the ids to deploy (all in the catalogue).
        values: the converted context values (``compute``, ``instance_type``, ``gpu``, ...).
        explicit: the context keys the deployer gave.
    """
    out: dict[str, ModelCompute] = {}
    for model in models:
        entry = catalogue.get(model)
        if entry is None:
            continue
        c = entry.compute

        def pick(key: str, own: Any, default: Any) -> Any:
            if key in explicit:
                return values[key]
            return own if own is not None else default

        gpus = (max(c.gpus, 1) if values["gpu"] else 0) if "gpu" in explicit else c.gpus
        out[model] = ModelCompute(
            backend=pick("compute", c.backend, values["compute"]),
            instance_type=str(pick("instance_type", c.instance_type, values["instance_type"]))
            .strip()
            .removeprefix("ml."),
            gpus=gpus,
            min_workers=pick("min_workers", c.min_workers, values["min_workers"]),
            max_workers=pick("max_workers", c.max_workers, values["max_workers"]),
            backlog_per_worker=pick(
                "backlog_per_worker",
                c.backlog_per_worker if "backlog_per_worker" in c.model_fields_set else None,
                values["backlog_per_worker"],
            ),
            weight_prefixes=weight_prefixes(entry),
            # A deploy-time -c compute=sagemaker leaves the entry's ECS warm pool out.
            warm_pool=c.warm_pool if pick("compute", c.backend, values["compute"]) == "ecs" else 0,
            engine=entry.engine
            if entry.kind == "openai-server" and entry.engine and entry.engine.image
            else None,
            source=entry.source,
        )
    return out


def problems(computes: Mapping[str, ModelCompute], gpu_families: tuple[str, ...]) -> list[str]:
    """Every rule the resolved per-model compute breaks (one backend per stack, instance types,
    GPU families, scaling bounds), each naming the model."""
    p: list[str] = []
    backends: dict[str, list[str]] = {}
    for model, c in computes.items():
        backends.setdefault(c.backend, []).append(model)
        if not re.fullmatch(r"[a-z][a-z0-9-]*\.[a-z0-9]+", c.instance_type):
            p.append(f"{model}: instance_type {c.instance_type!r} is not like g6.xlarge")
        elif c.gpus and c.instance_type.split(".")[0] not in gpu_families:
            p.append(
                f"{model}: instance_type {c.instance_type!r} has no NVIDIA GPU supported by the "
                f"ECS GPU AMI (families {', '.join(gpu_families)}) but gpus={c.gpus}; set "
                "compute.gpus: 0 for a CPU worker"
            )
        elif c.gpus and (have := instance_gpus(c.instance_type)) is not None and c.gpus > have:
            p.append(
                f"{model}: gpus={c.gpus} but instance_type {c.instance_type!r} has {have} "
                f"GPU{'s' * (have != 1)}; no instance could take a worker (choose a larger "
                "instance type or fewer gpus)"
            )
        if c.engine is not None:
            from infra.components.sagemaker_engine import engine_problems

            p.extend(engine_problems(model, c))
        if c.max_workers < max(c.min_workers, 1):
            p.append(f"{model}: max_workers={c.max_workers} is below min_workers={c.min_workers}")
    if len(backends) > 1:
        listed = "; ".join(f"{b}: {', '.join(ms)}" for b, ms in sorted(backends.items()))
        p.append(
            f"models: the deployed entries use more than one compute.backend ({listed}); one "
            "stack runs one backend: deploy one stack per backend (-c models=... -c "
            "stack_name=...) or set -c compute=ecs|sagemaker for all"
        )
    return p


def grant_weight_read(grantee: iam.IGrantable, compute: ModelCompute) -> None:
    """Allow ``grantee`` to read exactly the model's ``s3://`` weight prefixes:
    ``s3:GetObject`` on ``arn:aws:s3:::BUCKET/PREFIX*`` and ``s3:ListBucket`` on the bucket
    with an ``s3:prefix`` condition (S3 user guide, "Policy examples: ListBucket with a prefix").
    Nothing when the entry has no ``s3://`` source."""
    for bucket, prefix in compute.weight_prefixes:
        partition = Aws.PARTITION
        iam.Grant.add_to_principal(
            grantee=grantee,
            actions=["s3:GetObject"],
            resource_arns=[f"arn:{partition}:s3:::{bucket}/{prefix}*"],
        )
        grantee.grant_principal.add_to_principal_policy(
            iam.PolicyStatement(
                actions=["s3:ListBucket"],
                resources=[f"arn:{partition}:s3:::{bucket}"],
                conditions={"StringLike": {"s3:prefix": [f"{prefix}*"]}},
            )
        )
