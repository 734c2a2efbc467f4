"""What the parts of :class:`infra.stack.AsyncInferStack` share (:class:`StackParts`), and the
helpers that turn the topology's function specs (:mod:`asyncinfer.core.topology`) into CDK
props: timeouts, schedules, SQS triggers, log retention, the catalogue's path in the image."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from aws_cdk import Duration
from aws_cdk import aws_events as events
from aws_cdk import aws_events_targets as targets
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_logs as logs
from aws_cdk import aws_sqs as sqs
from constructs import Construct

from asyncinfer.core import topology
from infra.components.messaging import EncryptedTopics
from infra.components.model_scopes import ModelScopes
from infra.config import LOG_RETENTION_DAYS, REPO_ROOT, DeployConfig

#: The worker image's working directory (``container/Dockerfile``: ``WORKDIR``; it copies the
#: repository's ``models.yaml`` there).
IMAGE_ROOT = "/opt/asyncinfer"


@dataclass(frozen=True)
class StackParts:
    """Values every part of the stack builds with.

    Attributes:
        cfg: the validated settings.
        models: the deployed model ids, in catalogue order.
        prefix: the resource prefix (:mod:`asyncinfer.core.naming`).
        env: the common Lambda environment (``ASYNCINFER_*`` name -> value).
        fn_common: :class:`~infra.components.function.PythonFunction` keyword arguments every
            function takes (catalogue, layer, log retention, removal policy).
        reserved: function (``dlq``, ``webhooks``, ...) -> reserved concurrency (0: none).
        retention: the log groups' retention.
        scopes: where each model's resources go (:class:`ModelScopes`).
        topics: the stack's encrypted topics (new topics come from here).
    """

    cfg: DeployConfig
    models: list[str]
    prefix: str
    env: dict[str, str]
    fn_common: dict[str, Any]
    reserved: dict[str, int]
    retention: logs.RetentionDays
    scopes: ModelScopes
    topics: EncryptedTopics


def worker_models_file(cfg: DeployConfig) -> str:
    """The catalogue's path inside the worker image: ``/opt/asyncinfer/`` + its path relative to
    the repository (the image builds from the repository root; ``container/Dockerfile`` copies
    ``models.yaml``, a custom ``worker_dockerfile`` copies the deployer's folder), or
    ``/opt/asyncinfer/catalogue/<name>`` for a file outside the repository (the deployer's
    Dockerfile copies its folder there; ``docs/deploy.md``)."""
    path = cfg.models_path
    try:
        return f"{IMAGE_ROOT}/{path.relative_to(REPO_ROOT.resolve()).as_posix()}"
    except ValueError:
        return f"{IMAGE_ROOT}/catalogue/{path.name}"


def timeout(code: str) -> Duration:
    """The topology's timeout of function ``code`` (:mod:`asyncinfer.core.topology`)."""
    return Duration.seconds(topology.FUNCTIONS[code].timeout_seconds)


def schedule(code: str, fn: lambda_.IFunction) -> dict[str, Any]:
    """``events.Rule`` arguments of function ``code``'s topology schedule (rate, minutes; retry
    attempts of the target)."""
    spec = topology.FUNCTIONS[code].schedule()
    assert spec is not None, code
    return {
        "schedule": events.Schedule.rate(Duration.minutes(spec.rate_minutes)),
        "targets": [targets.LambdaFunction(fn, retry_attempts=spec.retry_attempts)],
    }


def sqs_trigger(
    scope: Construct, id: str, fn: lambda_.IFunction, queue: sqs.IQueue, code: str
) -> None:
    """The SQS event source mapping of function ``code`` (batch size, window and partial batch
    failures from the topology) in ``scope`` (the queue's model scope, so a large catalogue's
    mappings do not fill the parent stack). The function's rights on the queues are granted
    once, by name pattern."""
    trigger = topology.FUNCTIONS[code].sqs_trigger()
    window = trigger.max_batching_window_seconds
    lambda_.EventSourceMapping(
        scope,
        id,
        target=fn,
        event_source_arn=queue.queue_arn,
        batch_size=trigger.batch_size,
        max_batching_window=Duration.seconds(window) if window else None,
        report_batch_item_failures=trigger.report_batch_item_failures,
    )


def retention(days: int) -> logs.RetentionDays:
    """The ``RetentionDays`` member whose value is ``days`` (validated by the config)."""
    members = [m for m in logs.RetentionDays if m is not logs.RetentionDays.INFINITE]
    return dict(zip(LOG_RETENTION_DAYS, members, strict=True))[days]
