"""One model's worker service on ``compute=ecs``: its task definition (the worker container, the
instance's weights cache mounted, and for an ``openai-server`` entry with ``engine.image`` the
engine beside it), its service on the model's capacity provider, and its task scaling on the
backlog Lambda's metrics. :class:`~infra.components.ecs_workers.EcsWorkers` builds one per model
in the model's scope."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from aws_cdk import Aws, CustomResource, Duration, RemovalPolicy
from aws_cdk import aws_applicationautoscaling as appscaling
from aws_cdk import aws_cloudwatch as cloudwatch
from aws_cdk import aws_ecr_assets as ecr_assets
from aws_cdk import aws_ecs as ecs
from aws_cdk import aws_iam as iam
from aws_cdk import aws_logs as logs
from constructs import Construct

from asyncinfer.core import envvars as ev
from infra.components.ecs_instances import WEIGHTS_CACHE_PATH
from infra.components.engine import ENGINE_PORT, add_engine
from infra.components.function import METRICS_NAMESPACE
from infra.model_compute import ModelCompute

#: Metrics the backlog Lambda publishes each minute (namespace ``asyncinfer``, dimension Model);
#: see :mod:`asyncinfer.scaling.backlog`.
BACKLOG_PER_TASK = "BacklogPerTask"
BACKLOG_WITHOUT_CAPACITY = "BacklogWithoutCapacity"
#: Soft memory reservation of a CPU worker task, MiB: small enough to place on a 2-vCPU/4 GiB
#: instance (c7i.large) beside the ECS agent; the task may use more (no hard limit is set).
CPU_MEMORY_RESERVATION_MIB = 1024


def backlog_metric(name: str, model: str) -> cloudwatch.Metric:
    """One of the backlog Lambda's metrics for ``model`` (1-minute average)."""
    return cloudwatch.Metric(
        namespace=METRICS_NAMESPACE,
        metric_name=name,
        dimensions_map={"Model": model},
        period=Duration.minutes(1),
        statistic="Average",
    )


def add_worker_service(
    scope: Construct,
    *,
    model: str,
    compute: ModelCompute,
    image: ecr_assets.DockerImageAsset,
    cluster: ecs.Cluster,
    capacity_provider: ecs.AsgCapacityProvider,
    releases: Sequence[CustomResource],
    service_name: str,
    protection_arn: str,
    environment: Mapping[str, str],
    stop_timeout: int,
    memory_reservation_mib: int,
    log_retention: logs.RetentionDays,
    removal_policy: RemovalPolicy,
) -> tuple[ecs.Ec2Service, iam.IRole]:
    """``model``'s task definition, log group and service in ``scope`` (ids ``<model>-task``,
    ``<model>-logs``, ``<model>-service``).

    Args:
        compute: the entry's compute (GPUs per task, min/max tasks, ``BacklogPerTask`` target,
            the engine beside the worker).
        cluster / capacity_provider: where the service places its tasks.
        releases: the capacity groups' release custom resources; the service depends on each,
            so on deletion it goes before them.
        service_name: from :mod:`asyncinfer.core.naming`.
        protection_arn: the cluster's task ARN pattern, for task scale-in protection from
            inside the task.
        environment: ``ASYNCINFER_*`` settings of the worker container.
        stop_timeout: seconds ECS waits after SIGTERM before SIGKILL (max 120).
        memory_reservation_mib: soft memory reservation of a GPU task (a CPU task, or the
            worker beside an engine, reserves :data:`CPU_MEMORY_RESERVATION_MIB`).

    Returns:
        ``(service, task role)``.
    """
    c = compute
    task_def = ecs.Ec2TaskDefinition(scope, f"{model}-task", network_mode=ecs.NetworkMode.BRIDGE)
    log_group = logs.LogGroup(
        scope, f"{model}-logs", retention=log_retention, removal_policy=removal_policy
    )
    task_def.add_volume(name="weights-cache", host=ecs.Host(source_path=WEIGHTS_CACHE_PATH))
    # An openai-server entry with engine.image: the GPUs go to the engine container
    # beside the worker (infra.components.engine); the worker runs no model.
    engine_beside = c.engine is not None
    worker_env = {
        **environment,
        ev.AWS_REGION: Aws.REGION,
        ev.COMPUTE: "ecs",
        ev.WEIGHTS_CACHE: WEIGHTS_CACHE_PATH,
    }
    if engine_beside:
        worker_env[ev.ENGINE_URL] = f"http://engine:{ENGINE_PORT}"
    worker = task_def.add_container(
        "worker",
        image=ecs.ContainerImage.from_docker_image_asset(image),
        command=["worker", "--model", model],
        memory_reservation_mib=(
            memory_reservation_mib if c.gpus and not engine_beside else CPU_MEMORY_RESERVATION_MIB
        ),
        gpu_count=(c.gpus or None) if not engine_beside else None,
        stop_timeout=Duration.seconds(stop_timeout),
        environment=worker_env,
        logging=ecs.LogDrivers.aws_logs(stream_prefix=model, log_group=log_group),
        essential=True,
    )
    worker.add_mount_points(
        ecs.MountPoint(
            container_path=WEIGHTS_CACHE_PATH,
            source_volume="weights-cache",
            read_only=False,
        )
    )
    if engine_beside:
        add_engine(
            task_def,
            worker,
            model=model,
            compute=c,
            memory_reservation_mib=memory_reservation_mib,
            log_group=log_group,
        )
    # Task scale-in protection from inside the task (ECS agent endpoint
    # $ECS_AGENT_URI/task-protection/v1/state uses the task role; ECS developer guide,
    # "Protect your Amazon ECS tasks from being terminated by scale-in events").
    task_def.add_to_task_role_policy(
        iam.PolicyStatement(
            actions=["ecs:GetTaskProtection", "ecs:UpdateTaskProtection"],
            resources=[protection_arn],
        )
    )
    service = ecs.Ec2Service(
        scope,
        f"{model}-service",
        service_name=service_name,
        cluster=cluster,
        task_definition=task_def,
        desired_count=c.min_workers,
        min_healthy_percent=0,
        max_healthy_percent=100,
        circuit_breaker=ecs.DeploymentCircuitBreaker(rollback=True),
        capacity_provider_strategies=[
            ecs.CapacityProviderStrategy(
                capacity_provider=capacity_provider.capacity_provider_name,
                weight=1,
            )
        ],
        enable_ecs_managed_tags=True,
        propagate_tags=ecs.PropagatedTagSource.SERVICE,
    )
    # CDK adds the cluster's capacity-provider association (an aspect, at synth) as a
    # child of the cluster; a dependency on the cluster construct includes it.
    service.node.add_dependency(cluster)
    for release in releases:
        service.node.add_dependency(release)
    scaling = service.auto_scale_task_count(min_capacity=c.min_workers, max_capacity=c.max_workers)
    scaling.scale_to_track_custom_metric(
        "BacklogPerTask",
        metric=backlog_metric(BACKLOG_PER_TASK, model),
        target_value=c.backlog_per_worker,
        scale_in_cooldown=Duration.minutes(5),
        scale_out_cooldown=Duration.minutes(1),
    )
    scaling.scale_on_metric(
        "ZeroToOne",
        metric=backlog_metric(BACKLOG_WITHOUT_CAPACITY, model),
        scaling_steps=[
            appscaling.ScalingInterval(upper=0, change=0),
            appscaling.ScalingInterval(lower=1, change=1),
        ],
        adjustment_type=appscaling.AdjustmentType.CHANGE_IN_CAPACITY,
        evaluation_periods=1,
        cooldown=Duration.minutes(2),
    )
    return service, task_def.task_role
