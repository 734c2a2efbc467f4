"""The compute of :class:`infra.stack.AsyncInferStack`, one backend per stack:

* ``ecs``: :class:`~infra.components.ecs_workers.EcsWorkers`, the capacity-release function,
  the workers' grants, the backlog metric Lambda (every minute) and wake-on-submit;
* ``sagemaker``: :class:`~infra.components.sagemaker_endpoints.SageMakerEndpoints` with its
  notification topics, the SQS -> endpoint bridge and the completion Lambda.

Each returns the per-model "workers" metric the dashboard shows."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from aws_cdk import Duration, RemovalPolicy
from aws_cdk import aws_cloudwatch as cloudwatch
from aws_cdk import aws_ecr_assets as ecr_assets
from aws_cdk import aws_events as events
from aws_cdk import aws_sns_subscriptions as subs

from asyncinfer.core import envvars as ev
from infra.components.ecs_workers import EcsWorkers
from infra.components.function import METRICS_NAMESPACE, PythonFunction
from infra.components.inputs import grant_input_locations
from infra.components.messaging import CONSUME_ACTIONS
from infra.components.sagemaker_endpoints import SageMakerEndpoints, endpoint_metric
from infra.components.sagemaker_engine import sagemaker_engines
from infra.model_compute import grant_weight_read
from infra.stack_parts import StackParts, schedule, sqs_trigger, timeout, worker_models_file

if TYPE_CHECKING:
    from infra.stack import AsyncInferStack

#: Worker soft memory reservation, MiB (fits a 16 GiB g4dn/g5 xlarge next to the ECS agent).
WORKER_MEMORY_MIB = 8192


def add_ecs_compute(
    stack: AsyncInferStack, parts: StackParts, image: ecr_assets.DockerImageAsset
) -> dict[str, cloudwatch.IMetric]:
    """``compute=ecs`` in ``stack`` (``stack.ecs``, ``stack.backlog_fn``), after the intake:
    the API and the batch expander may wake a service. Returns model id -> its running tasks
    (the backlog Lambda's ``RunningTasks``, 1-minute maximum)."""
    cfg, env, fn_common, prefix = parts.cfg, parts.env, parts.fn_common, parts.prefix
    worker_env = {
        **env,
        ev.DRAIN_SECONDS: str(cfg.drain_seconds),
        ev.MODELS_FILE: worker_models_file(cfg),
    }
    release_fn = PythonFunction(
        stack,
        "CapacityReleaseFn",
        code="ecs_teardown",
        service="ecs-teardown",
        environment=env,
        timeout=timeout("ecs_teardown"),
        description="asyncinfer stack deletion: release the GPU group's instances",
        **fn_common,
    ).function
    stack.ecs = EcsWorkers(
        stack,
        "Ecs",
        image=image,
        queues=stack.queues.queues,
        prefix=prefix,
        environment=worker_env,
        computes=cfg.model_compute,
        stop_timeout=cfg.stop_timeout,
        memory_reservation_mib=WORKER_MEMORY_MIB,
        log_retention=parts.retention,
        removal_policy=RemovalPolicy.DESTROY,
        container_insights=cfg.container_insights,
        ssm_access=cfg.instance_ssm_access,
        scopes=parts.scopes,
        capacity_release=release_fn,
    )
    grant_input_locations(stack, stack.ecs.task_roles.values(), cfg.input_locations)
    for model, role in stack.ecs.task_roles.items():
        for q in stack.queues.queues_of(model):
            q.grant_consume_messages(role)
            q.grant_send_messages(role)
        stack.table.grant_read_write_data(role)
        # Workers read inputs and uploads and write outputs; they delete nothing
        # outside outputs/ (issue 14, least privilege).
        stack.bucket.grant_read(role)
        stack.bucket.grant_put(role, "outputs/*")
        stack.bucket.grant_delete(role, "outputs/*")
        stack.events_topic.grant_publish(role)
        grant_weight_read(role, cfg.model_compute[model])
    stack.backlog_fn = PythonFunction(
        stack,
        "BacklogFn",
        code="backlog_metric",
        service="backlog-metric",
        environment={
            ev.RESOURCE_PREFIX: prefix,
            ev.QUEUE_URL_BASE: stack.queues.url_base(),
            ev.MODELS: ",".join(parts.models),
            ev.COMPUTE: "ecs",
            ev.ECS_CLUSTER: stack.ecs.cluster.cluster_name,
        },
        timeout=timeout("backlog_metric"),
        description="asyncinfer backlog-per-task metric (every minute)",
        tracing=cfg.trace_scheduled_functions,
        **fn_common,
    ).function
    stack.queues.grant_job_queues(stack.backlog_fn, ["sqs:GetQueueAttributes"])
    stack.ecs.grant_describe_services(stack.backlog_fn)
    # Wake-on-submit: the API takes a service at zero to one task at once.
    stack.ecs.grant_wake(stack.api_fn)
    stack.api_fn.add_environment(ev.ECS_CLUSTER, stack.ecs.cluster.cluster_name)
    stack.ecs.grant_wake(stack.batches.expander)
    stack.batches.expander.add_environment(ev.ECS_CLUSTER, stack.ecs.cluster.cluster_name)
    events.Rule(
        stack,
        "BacklogSchedule",
        **schedule("backlog_metric", stack.backlog_fn),
    )
    return {
        m: cloudwatch.Metric(
            namespace=METRICS_NAMESPACE,
            metric_name="RunningTasks",
            dimensions_map={"Model": m},
            period=Duration.minutes(1),
            statistic="Maximum",
        )
        for m in parts.models
    }


def add_sagemaker_compute(
    stack: AsyncInferStack, parts: StackParts, image: ecr_assets.DockerImageAsset
) -> dict[str, cloudwatch.IMetric]:
    """``compute=sagemaker`` in ``stack`` (``stack.sagemaker``, ``stack.bridge_fn``,
    ``stack.completion_fn``), after the intake. Returns model id -> its endpoint's
    ``ApproximateBacklogSizePerInstance``."""
    cfg, env, fn_common, reserved = parts.cfg, parts.env, parts.fn_common, parts.reserved
    success = parts.topics.topic("SageMakerSuccess", display_name="asyncinfer SageMaker success")
    error = parts.topics.topic("SageMakerError", display_name="asyncinfer SageMaker errors")
    stack.sagemaker = SageMakerEndpoints(
        stack,
        "SageMaker",
        image=image,
        models=parts.models,
        prefix=parts.prefix,
        bucket=stack.bucket,
        success_topic=success,
        error_topic=error,
        environment={**env, ev.MODELS_FILE: worker_models_file(cfg)},
        computes=cfg.model_compute,
        max_concurrent_invocations=cfg.sagemaker_max_concurrent_invocations,
        log_retention=parts.retention,
        scopes=parts.scopes,
    )
    grant_input_locations(stack, stack.sagemaker.roles, cfg.input_locations)
    sm_env = env
    engines = sagemaker_engines(cfg.model_compute)
    if engines:  # their endpoints run the engine image: the bridge and completion map
        sm_env = {**env, ev.SAGEMAKER_ENGINES: json.dumps(engines, separators=(",", ":"))}
    stack.bridge_fn = PythonFunction(
        stack,
        "BridgeFn",
        code="sagemaker_bridge",
        service="sagemaker-bridge",
        environment=sm_env,
        timeout=Duration.seconds(cfg.bridge_timeout),
        description="asyncinfer SQS -> SageMaker InvokeEndpointAsync",
        reserved_concurrency=reserved["bridge"],
        **fn_common,
    ).function
    stack.sagemaker.grant_invoke_async(stack.bridge_fn)
    stack.sagemaker.grant_wake(stack.api_fn)
    stack.sagemaker.grant_wake(stack.batches.expander)
    stack.table.grant_read_write_data(stack.bridge_fn)
    stack.bucket.grant_read_write(stack.bridge_fn, "inputs/*")
    stack.events_topic.grant_publish(stack.bridge_fn)
    stack.queues.grant_job_queues(stack.bridge_fn, CONSUME_ACTIONS)
    for key, q in stack.queues.class_queues.items():
        model = key.split("#")[0]
        trigger_id = f"{key.replace('#', '-')}-bridge-trigger"
        sqs_trigger(
            parts.scopes.of(stack.queues, model), trigger_id, stack.bridge_fn, q, "sagemaker_bridge"
        )
    stack.completion_fn = PythonFunction(
        stack,
        "CompletionFn",
        code="sagemaker_completion",
        service="sagemaker-completion",
        environment=sm_env,
        timeout=timeout("sagemaker_completion"),
        description="asyncinfer SageMaker notifications -> job records and events",
        reserved_concurrency=reserved["completion"],
        **fn_common,
    ).function
    stack.table.grant_read_write_data(stack.completion_fn)
    stack.bucket.grant_read(stack.completion_fn, "outputs/*")
    if engines:  # an engine's large mapped outputs: outputs/<tenant>/<job_id>.json
        stack.bucket.grant_put(stack.completion_fn, "outputs/*")
    stack.events_topic.grant_publish(stack.completion_fn)
    for t in (success, error):
        t.add_subscription(subs.LambdaSubscription(stack.completion_fn))
    # leases (issue 14): failed notifications are kept; the sweeper re-sends the
    # messages of SageMaker jobs it takes back.
    stack.sagemaker.add_completion_failure_destination(stack.completion_fn)
    return {
        m: endpoint_metric("ApproximateBacklogSizePerInstance", n)
        for m, n in stack.sagemaker.endpoint_names.items()
    }
