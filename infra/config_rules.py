"""The rules deployment settings must keep (:func:`conflicts`), each naming the setting and the
limit it breaks; :func:`infra.config.load_config` reports every broken one at once."""

from __future__ import annotations

import re
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
from infra.config_values import REPO_ROOT, RESERVED_CONCURRENCY_KEYS


def conflicts(v: dict[str, Any], known: list[str]) -> list[str]:
    """Every rule the converted values ``v`` (setting -> value) break, one line each
    (``known``: the catalogue's ids); empty when they are consistent."""
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
