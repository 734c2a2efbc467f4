"""``asyncinfer preflight``: what a first ``cdk deploy`` needs from the account, checked with the
deployer's credentials (boto3) before anything is created, each with what to do about it.

Checks (each :class:`Check` is ``ok``, ``warn`` or ``fail``):

* Instance quotas (Service Quotas), summed over the catalogue's deployed entries as the CDK app
  resolves them (:func:`infra.model_compute.resolve`: each entry's ``compute:``, an explicit
  ``-c`` key overriding every entry): ECS mode, per EC2 quota ("Running On-Demand G and VT
  instances", "... P instances", "... Standard (A, C, D, H, I, M, R, T, Z) instances"), the sum
  of ``max_workers`` x the type's vCPUs of every entry whose family that quota covers; SageMaker
  mode, per instance type, "<ml type> for endpoint usage" >= the sum of the entries'
  ``max_workers`` (endpoint instances). One check per quota. New accounts have 0 for GPUs.
* Service-linked roles: ECS mode ``AWSServiceRoleForECS`` (CreateCluster fails without it in a
  fresh account), Auto Scaling and Application Auto Scaling's ECS role; SageMaker mode
  Application Auto Scaling's SageMaker endpoint role (the stack's scalable targets name it).
* Lambda concurrency: the account's limit must leave 100 unreserved executions after the
  functions' reserved concurrency (Lambda quotas; new accounts may have a limit of 10).
* The CDK bootstrap stack ``CDKToolkit`` and its version parameter (bootstrap version >= 6).
* Docker: the worker image is built locally at ``cdk deploy``.

Nothing is created or changed. :func:`run_checks` takes injected clients so tests use moto and
botocore's Stubber; it never needs AWS itself.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: EC2 On-Demand vCPU quota per instance family letter group (Service Quotas, service ``ec2``).
EC2_VCPU_QUOTAS: dict[str, tuple[str, str]] = {
    "g": ("L-DB2E81BA", "Running On-Demand G and VT instances"),
    "vt": ("L-DB2E81BA", "Running On-Demand G and VT instances"),
    "p": ("L-417A185B", "Running On-Demand P instances"),
    "standard": ("L-1216C47A", "Running On-Demand Standard (A, C, D, H, I, M, R, T, Z) instances"),
}
STANDARD_FAMILIES = tuple("acdhimrtz")
#: Lambda keeps at least this many executions unreserved (Lambda developer guide, "Reserved
#: concurrency").
UNRESERVED_MINIMUM = 100
#: The lowest bootstrap version current CDK CLIs deploy with (``cdk bootstrap`` template).
MIN_BOOTSTRAP_VERSION = 6
BOOTSTRAP_STACK = "CDKToolkit"
BOOTSTRAP_VERSION_PARAMETER = "/cdk-bootstrap/hnb659fds/version"


@dataclass(frozen=True)
class Check:
    """One finding: ``status`` ``ok`` | ``warn`` | ``fail``, what was found, and what to do."""

    name: str
    status: str
    detail: str
    fix: str = ""


@dataclass(frozen=True, kw_only=True)
class Plan:
    """What the deployment needs: compute mode, the stack-wide instance type (without ``ml.``)
    and workers per model, number of models, the total reserved Lambda concurrency, and
    ``workers``: each deployed model's resolved ``(model, instance_type, max_workers)`` (empty:
    every model on ``instance_type`` with ``max_workers``)."""

    compute: str
    instance_type: str
    max_workers: int
    models: int
    reserved_concurrency: int
    workers: tuple[tuple[str, str, int], ...] = ()

    def demand(self) -> tuple[tuple[str, str, int], ...]:
        """``(model, instance type without ml., max workers)`` per deployed model."""
        if self.workers:
            return self.workers
        return tuple(
            (f"model {i + 1}", self.instance_type, self.max_workers) for i in range(self.models)
        )


def service_linked_roles(compute: str) -> dict[str, str]:
    """Role name -> AWS service name of the service-linked roles mode ``compute`` needs."""
    if compute == "ecs":
        return {
            "AWSServiceRoleForECS": "ecs.amazonaws.com",
            "AWSServiceRoleForAutoScaling": "autoscaling.amazonaws.com",
            "AWSServiceRoleForApplicationAutoScaling_ECSService": (
                "ecs.application-autoscaling.amazonaws.com"
            ),
        }
    return {
        "AWSServiceRoleForApplicationAutoScaling_SageMakerEndpoint": (
            "sagemaker.application-autoscaling.amazonaws.com"
        )
    }


def _quota_value(quotas: Any, service: str, code: str) -> float | None:
    try:
        return float(
            quotas.get_service_quota(ServiceCode=service, QuotaCode=code)["Quota"]["Value"]
        )
    except quotas.exceptions.NoSuchResourceException:
        return None


def _ec2_quota_group(instance_type: str) -> str:
    """The :data:`EC2_VCPU_QUOTAS` key of an instance type's family, or ``""`` if unknown."""
    family = instance_type.split(".")[0]
    if family.startswith("vt"):
        return "vt"
    if family[:1] in ("g", "p"):
        return family[0]
    return "standard" if family[:1] in STANDARD_FAMILIES else ""


def _vcpus(ec2: Any | None, types: Sequence[str]) -> dict[str, int]:
    """vCPUs per instance type (``DescribeInstanceTypes``; 4 each without an EC2 client)."""
    if ec2 is None:
        return dict.fromkeys(types, 4)
    info = ec2.describe_instance_types(InstanceTypes=list(types))["InstanceTypes"]
    return {i["InstanceType"]: int(i["VCpuInfo"]["DefaultVCpus"]) for i in info}


def _sagemaker_quotas(plan: Plan, quotas: Any) -> list[Check]:
    name = "GPU quota"
    need: dict[str, int] = {}
    users: dict[str, list[str]] = {}
    for model, itype, workers in plan.demand():
        need[f"ml.{itype}"] = need.get(f"ml.{itype}", 0) + workers
        users.setdefault(f"ml.{itype}", []).append(f"{model} {workers}")
    found: dict[str, dict[str, Any]] = {}
    wanted = {f"{t} for endpoint usage": t for t in need}
    for page in quotas.get_paginator("list_service_quotas").paginate(ServiceCode="sagemaker"):
        for q in page["Quotas"]:
            if q["QuotaName"] in wanted:
                found[wanted[q["QuotaName"]]] = q
    out = []
    for itype, n in need.items():
        title = f"{itype} for endpoint usage"
        q = found.get(itype)
        if q is None:
            out.append(Check(name, "warn", f"no SageMaker quota '{title}' found", "check the type"))
            continue
        have = float(q["Value"])
        fix = (
            f"request {n:g} or more for '{title}' in Service Quotas (service SageMaker, quota "
            f"{q['QuotaCode']})"
        )
        detail = f"'{title}' is {have:g}, need {n} ({', '.join(users[itype])})"
        out.append(Check(name, "ok" if have >= n else "fail", detail, fix))
    return out


def check_gpu_quota(plan: Plan, *, quotas: Any, ec2: Any | None = None) -> list[Check]:
    """One check per quota that caps the deployment's workers (see the module docstring):
    per EC2 vCPU quota in ECS mode, in the order the catalogue first uses it; per ``ml.`` type
    in SageMaker mode. ``ec2`` gives the types' vCPUs (4 each without it)."""
    if plan.compute == "sagemaker":
        return _sagemaker_quotas(plan, quotas)
    demand = plan.demand()
    vcpus = _vcpus(ec2, sorted({itype for _, itype, _ in demand}))
    groups: dict[str, list[tuple[str, str, int]]] = {}
    out: list[Check] = []
    for model, itype, workers in demand:
        group = _ec2_quota_group(itype)
        if not group:
            family = itype.split(".")[0]
            out.append(
                Check(
                    "GPU quota",
                    "warn",
                    f"{model}: no known vCPU quota for family {family!r}",
                    "check by hand",
                )
            )
            continue
        groups.setdefault(EC2_VCPU_QUOTAS[group][0], []).append((model, itype, workers))
    titles = {code: title for code, title in EC2_VCPU_QUOTAS.values()}
    for code, rows in groups.items():
        title = titles[code]
        name = "CPU quota" if code == EC2_VCPU_QUOTAS["standard"][0] else "GPU quota"
        need = sum(workers * vcpus[itype] for _, itype, workers in rows)
        quota = _quota_value(quotas, "ec2", code)
        if quota is None:
            out.append(
                Check(name, "warn", f"quota {code} ({title}) not found", "check Service Quotas")
            )
            continue
        fix = f"request {need} vCPUs or more for '{title}' in Service Quotas (service EC2, {code})"
        parts = ", ".join(
            f"{workers} workers x {vcpus[itype]} vCPUs of {itype} ({model})"
            for model, itype, workers in rows
        )
        if not plan.workers:
            parts = (
                f"{plan.max_workers} workers x {plan.models} models x "
                f"{vcpus[plan.instance_type]} vCPUs of {plan.instance_type}"
            )
        detail = f"'{title}' is {quota:g} vCPUs, need {need} ({parts})"
        out.append(Check(name, "ok" if quota >= need else "fail", detail, fix))
    return out


def check_service_linked_roles(compute: str, *, iam: Any) -> list[Check]:
    """One check per service-linked role the mode needs."""
    out = []
    for role, service in service_linked_roles(compute).items():
        try:
            iam.get_role(RoleName=role)
            out.append(Check(f"role {role}", "ok", "exists"))
        except iam.exceptions.NoSuchEntityException:
            out.append(
                Check(
                    f"role {role}",
                    "fail" if role == "AWSServiceRoleForECS" else "warn",
                    "missing (a fresh account has none until the service is first used)",
                    f"aws iam create-service-linked-role --aws-service-name {service}",
                )
            )
    return out


def check_lambda_concurrency(reserved: int, *, lambda_: Any) -> Check:
    """The account's concurrency limit leaves :data:`UNRESERVED_MINIMUM` after ``reserved``."""
    limit = int(lambda_.get_account_settings()["AccountLimit"]["ConcurrentExecutions"])
    need = reserved + UNRESERVED_MINIMUM
    return Check(
        "Lambda concurrency",
        "ok" if limit >= need else "fail",
        f"account limit {limit}, need {need} "
        f"({reserved} reserved + {UNRESERVED_MINIMUM} unreserved)",
        "request a higher 'Concurrent executions' quota (service Lambda, L-B99A9384), or set the "
        "*_reserved_concurrency settings to 0",
    )


def check_bootstrap(*, cloudformation: Any, ssm: Any) -> Check:
    """``CDKToolkit`` exists and its bootstrap version is recent enough."""
    fix = "npx cdk bootstrap aws://ACCOUNT/REGION"
    try:
        stack = cloudformation.describe_stacks(StackName=BOOTSTRAP_STACK)["Stacks"][0]
    except cloudformation.exceptions.ClientError:
        return Check("CDK bootstrap", "fail", f"no {BOOTSTRAP_STACK} stack in this region", fix)
    if not stack["StackStatus"].endswith("_COMPLETE") or "ROLLBACK" in stack["StackStatus"]:
        return Check("CDK bootstrap", "fail", f"{BOOTSTRAP_STACK} is {stack['StackStatus']}", fix)
    try:
        version = int(ssm.get_parameter(Name=BOOTSTRAP_VERSION_PARAMETER)["Parameter"]["Value"])
    except ssm.exceptions.ParameterNotFound:
        return Check("CDK bootstrap", "fail", f"no {BOOTSTRAP_VERSION_PARAMETER}", fix)
    if version < MIN_BOOTSTRAP_VERSION:
        return Check("CDK bootstrap", "fail", f"bootstrap version {version} is too old", fix)
    return Check("CDK bootstrap", "ok", f"{BOOTSTRAP_STACK} version {version}")


Runner = Callable[[Sequence[str]], "subprocess.CompletedProcess[str]"]


def _run(cmd: Sequence[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(cmd), capture_output=True, text=True, timeout=30, check=False)


def check_docker(*, which: Callable[[str], str | None] = shutil.which, run: Runner = _run) -> Check:
    """A Docker CLI whose daemon answers (``docker info``)."""
    fix = "install Docker (or a compatible builder) and start it; cdk deploy builds the image"
    if not which("docker"):
        return Check("Docker", "fail", "no docker command on PATH", fix)
    try:
        proc = run(["docker", "info", "--format", "{{.ServerVersion}}"])
    except (OSError, subprocess.TimeoutExpired) as exc:
        return Check("Docker", "fail", f"docker info failed: {exc}", fix)
    if proc.returncode != 0:
        return Check("Docker", "fail", (proc.stderr or "daemon not reachable").strip()[:200], fix)
    return Check("Docker", "ok", f"server {proc.stdout.strip()}")


def run_checks(
    plan: Plan, clients: Mapping[str, Any], *, docker: Callable[[], Check] = check_docker
) -> list[Check]:
    """Every check, in order. ``clients``: boto3 clients ``service-quotas``, ``ec2``, ``iam``,
    ``lambda``, ``cloudformation``, ``ssm``. A check whose API call is refused reports
    ``warn`` with the error instead of stopping the others."""
    steps: list[tuple[str, Callable[[], Check | list[Check]]]] = [
        (
            "GPU quota",
            lambda: check_gpu_quota(plan, quotas=clients["service-quotas"], ec2=clients.get("ec2")),
        ),
        (
            "service-linked roles",
            lambda: check_service_linked_roles(plan.compute, iam=clients["iam"]),
        ),
        (
            "Lambda concurrency",
            lambda: check_lambda_concurrency(plan.reserved_concurrency, lambda_=clients["lambda"]),
        ),
        (
            "CDK bootstrap",
            lambda: check_bootstrap(cloudformation=clients["cloudformation"], ssm=clients["ssm"]),
        ),
        ("Docker", docker),
    ]
    out: list[Check] = []
    for name, step in steps:
        try:
            result = step()
        except Exception as exc:  # an API refused (permissions, region): report, go on
            result = Check(name, "warn", f"could not check: {exc}", "check by hand")
        out.extend(result if isinstance(result, list) else [result])
    return out


def render(checks: Sequence[Check]) -> str:
    """The checks as text lines: ``[ok]``/``[warn]``/``[FAIL]``, name, detail, then the fix."""
    lines = []
    for c in checks:
        mark = {"ok": "[ok]  ", "warn": "[warn]", "fail": "[FAIL]"}[c.status]
        lines.append(f"{mark} {c.name}: {c.detail}")
        if c.status != "ok" and c.fix:
            lines.append(f"       -> {c.fix}")
    return "\n".join(lines)


def plan_from_context(pairs: Sequence[str], root: Path) -> Plan:
    """The :class:`Plan` of the deployment that ``cdk deploy`` with the same ``-c key=value``
    ``pairs`` would make, from the checkout at ``root`` (``cdk.json`` context, then the pairs,
    validated by ``infra.config`` exactly as at synth; ``workers`` from the per-model compute
    that ``infra.config.load_config`` resolves from the catalogue). Raises ``ValueError`` for a
    malformed pair and ``infra.config.DeployConfigError`` for invalid settings."""
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))
    from infra.config import load_config

    context: dict[str, Any] = {}
    cdk_json = root / "cdk.json"
    if cdk_json.is_file():
        context = {
            k: v
            for k, v in json.loads(cdk_json.read_text()).get("context", {}).items()
            if not k.startswith("@")
        }
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep:
            raise ValueError(f"-c {pair!r}: expected key=value")
        context[key.strip()] = value
    context.pop("stack_name", None)
    context.pop("nag", None)
    cfg = load_config(context)
    return Plan(
        compute=cfg.compute,
        instance_type=cfg.ec2_instance_type,
        max_workers=cfg.max_workers,
        models=len(cfg.models),
        reserved_concurrency=cfg.total_reserved_concurrency,
        workers=tuple(
            (model, c.instance_type, c.max_workers) for model, c in cfg.model_compute.items()
        ),
    )


def main(pairs: Sequence[str], *, region: str | None = None, root: Path | None = None) -> int:
    """``asyncinfer preflight``: print every check; exit status 1 if any failed, else 0."""
    import boto3

    try:
        plan = plan_from_context(pairs, root or Path.cwd())
    except (ValueError, ImportError) as exc:
        print(f"preflight: {exc}", file=sys.stderr)
        return 2
    session = boto3.Session(region_name=region)
    names = ("service-quotas", "ec2", "iam", "lambda", "cloudformation", "ssm")
    clients = {n: session.client(n) for n in names}  # type: ignore[call-overload]
    workers = ", ".join(f"{m}: {n} x {t}" for m, t, n in plan.demand())
    print(f"preflight for compute={plan.compute} in {session.region_name} ({workers}):")
    checks = run_checks(plan, clients)
    print(render(checks))
    return 1 if any(c.status == "fail" for c in checks) else 0
