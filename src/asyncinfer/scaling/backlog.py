"""Backlog-per-task metrics for scaling ECS worker services on SQS (``compute=ecs``).

AWS's guidance for scaling on SQS ("Scaling policy based on Amazon SQS", EC2 Auto Scaling user
guide) tracks *backlog per instance* = messages / running capacity, published by a small job each
minute. Here the backlog counts visible **and in-flight** messages (a job being run holds an
in-flight message), so a service never scales in under a running job, and a second metric flags
"backlog but no task" so that a step policy can take the service from 0 to 1 (target tracking
multiplies the current capacity and cannot leave 0).

Metrics (namespace ``asyncinfer``, dimension ``Model``, 1-minute resolution, written as
CloudWatch Embedded Metric Format lines on stdout, so the Lambda needs no PutMetricData right):

* ``Backlog`` (Count): ApproximateNumberOfMessages + ApproximateNumberOfMessagesNotVisible;
* ``BacklogPerTask`` (Count): Backlog / tasks, where tasks = max(desired, running); Backlog when
  there are no tasks;
* ``BacklogWithoutCapacity`` (Count): 1 when Backlog > 0 and tasks == 0, else 0;
* ``RunningTasks`` (Count): the service's runningCount.

Environment (read by :mod:`asyncinfer.core.settings`): the queue URLs (``ASYNCINFER_QUEUE_URLS``, or
``ASYNCINFER_RESOURCE_PREFIX`` with ``ASYNCINFER_QUEUE_URL_BASE`` and ``ASYNCINFER_MODELS``),
``ASYNCINFER_ECS_CLUSTER``, the service names (``ASYNCINFER_ECS_SERVICES``, or the naming rule
with ``ASYNCINFER_COMPUTE=ecs``), ``AWS_REGION``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from asyncinfer.scaling import policy

NAMESPACE = "asyncinfer"
#: DescribeServices takes at most 10 services per call (ECS API reference).
DESCRIBE_SERVICES_MAX = 10


@dataclass(frozen=True, kw_only=True)
class BacklogConfig:
    """What the backlog job measures: queue URLs and ECS service names per model."""

    queue_urls: dict[str, str]
    cluster: str
    services: dict[str, str] = field(default_factory=dict)
    region: str | None = None

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> BacklogConfig:
        """Read the configuration through :class:`asyncinfer.core.settings.Settings` (queue URLs
        and service names from the explicit maps or the naming rule; see the module
        docstring). Raises :class:`ConfigError` for malformed settings."""
        from asyncinfer.core.settings import Settings

        part = Settings.from_env(env).scaling
        return cls(
            queue_urls=dict(part.queue_urls),
            cluster=part.ecs_cluster,
            services=dict(part.ecs_services),
            region=part.region,
        )


def backlog_point(
    *, visible: int, in_flight: int, running: int, desired: int
) -> dict[str, int | float]:
    """The metric values of one model from its queue counts and service counts."""
    # The scaling policy's definitions (asyncinfer.scaling.policy): one source for AWS and local.
    backlog = policy.backlog(visible, in_flight)
    tasks = max(running, desired)
    return {
        "Backlog": backlog,
        "BacklogPerTask": policy.backlog_per_worker(visible, in_flight, tasks),
        "BacklogWithoutCapacity": policy.backlog_without_capacity(visible, in_flight, tasks),
        "RunningTasks": running,
    }


def emf_document(model: str, point: Mapping[str, int | float], timestamp_ms: int) -> dict[str, Any]:
    """A CloudWatch Embedded Metric Format document for ``model``'s ``point``."""
    return {
        "_aws": {
            "Timestamp": timestamp_ms,
            "CloudWatchMetrics": [
                {
                    "Namespace": NAMESPACE,
                    "Dimensions": [["Model"]],
                    "Metrics": [{"Name": name, "Unit": "Count"} for name in point],
                }
            ],
        },
        "Model": model,
        **point,
    }


def _service_counts(
    ecs: Any, cluster: str, services: Mapping[str, str]
) -> dict[str, tuple[int, int]]:
    """model -> (runningCount, desiredCount); a missing service counts as (0, 0)."""
    by_name: dict[str, tuple[int, int]] = {}
    names = list(services.values())
    for i in range(0, len(names), DESCRIBE_SERVICES_MAX):
        resp = ecs.describe_services(cluster=cluster, services=names[i : i + DESCRIBE_SERVICES_MAX])
        for svc in resp.get("services", []):
            counts = (int(svc.get("runningCount", 0)), int(svc.get("desiredCount", 0)))
            by_name[svc["serviceName"]] = counts
            by_name[svc["serviceArn"]] = counts
    return {
        m: by_name.get(name, by_name.get(name.rsplit("/", 1)[-1], (0, 0)))
        for m, name in services.items()
    }


def measure(config: BacklogConfig, *, sqs: Any, ecs: Any) -> dict[str, dict[str, int | float]]:
    """model -> metric values, from GetQueueAttributes and DescribeServices. A model's priority
    class queues (``<model>#high``, ``<model>#low`` keys) add up into its backlog."""
    counts = _service_counts(ecs, config.cluster, config.services) if config.services else {}
    totals: dict[str, list[int]] = {}
    for key, url in config.queue_urls.items():
        attrs = sqs.get_queue_attributes(
            QueueUrl=url,
            AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"],
        )["Attributes"]
        t = totals.setdefault(key.split("#", 1)[0], [0, 0])
        t[0] += int(attrs.get("ApproximateNumberOfMessages", 0))
        t[1] += int(attrs.get("ApproximateNumberOfMessagesNotVisible", 0))
    out: dict[str, dict[str, int | float]] = {}
    for model, (visible, in_flight) in totals.items():
        running, desired = counts.get(model, (0, 0))
        out[model] = backlog_point(
            visible=visible, in_flight=in_flight, running=running, desired=desired
        )
    return out


def publish_backlog_metrics(
    config: BacklogConfig,
    *,
    sqs: Any = None,
    ecs: Any = None,
    write: Callable[[str], None] = print,
    clock: Callable[[], float] = time.time,
) -> dict[str, dict[str, int | float]]:
    """Measure every model and write one EMF line per model with ``write``; returns the values."""
    if sqs is None or ecs is None:
        import boto3

        sqs = sqs or boto3.client("sqs", region_name=config.region)
        ecs = ecs or boto3.client("ecs", region_name=config.region)
    points = measure(config, sqs=sqs, ecs=ecs)
    ts = int(clock() * 1000)
    for model, point in points.items():
        write(json.dumps(emf_document(model, point, ts), separators=(",", ":")))
    return points
