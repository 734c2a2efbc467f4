"""``compute=ecs``: GPU container instances that scale to zero, one worker service per model,
scaled on backlog per task."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from aws_cdk import ArnFormat, Aws, CustomResource, Duration, RemovalPolicy, Stack
from aws_cdk import aws_applicationautoscaling as appscaling
from aws_cdk import aws_autoscaling as autoscaling
from aws_cdk import aws_cloudwatch as cloudwatch
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_ecr_assets as ecr_assets
from aws_cdk import aws_ecs as ecs
from aws_cdk import aws_iam as iam
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_logs as logs
from aws_cdk import aws_sqs as sqs
from constructs import Construct

from asyncinfer.core import envvars as ev
from asyncinfer.core import naming
from infra.components.ecs_instances import WEIGHTS_CACHE_PATH, instance_user_data
from infra.components.engine import ENGINE_PORT, add_engine
from infra.components.function import METRICS_NAMESPACE
from infra.components.model_scopes import ModelScopes
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


class EcsWorkers(Construct):
    """An ECS cluster on an Auto Scaling group of GPU instances (ECS GPU-optimised Amazon Linux
    2023 AMI, min 0) behind a capacity provider with managed scaling and managed termination
    protection, and one worker service per model (``worker --model <id>``).

    Each service scales between ``min_workers`` and ``max_workers`` tasks with
    * target tracking on ``BacklogPerTask`` = (visible + in-flight messages) / running tasks,
      the metric of AWS's guidance for scaling on SQS (Auto Scaling user guide, "Scaling policy
      based on Amazon SQS"), published every minute by the backlog Lambda;
    * a step policy on ``BacklogWithoutCapacity`` (1 when there is backlog and no running task)
      that adds one task, because target tracking cannot scale up from zero.

    The network is a VPC with public subnets only (no NAT gateway cost at zero); instances get
    public addresses and a security group without inbound rules; tasks use bridge networking.
    Instances require IMDSv2 with a hop limit of 1, so containers (one hop further) cannot read
    the instance role's credentials; tasks get theirs from the ECS agent.

    Every service depends on the cluster's capacity-provider association, so CreateService runs
    after it exists and, on delete, the services go before it.

    Args:
        image: the worker image asset (``container/``).
        queues: model id -> job queue.
        prefix: the deployment's resource prefix (service names, :mod:`asyncinfer.core.naming`).
        environment: ``ASYNCINFER_*`` settings for the container.
        computes: model id -> its compute (instance type, GPUs per task, min/max tasks,
            ``BacklogPerTask`` target); models sharing an instance type and GPU-or-not share one
            capacity group (launch template, Auto Scaling group, capacity provider). A model with
            ``gpus: 0`` runs on CPU instances (the standard ECS AMI, no GPU reservation).
        stop_timeout: seconds ECS waits after SIGTERM before SIGKILL (max 120).
        memory_reservation_mib: soft memory reservation of a GPU task (a CPU task reserves
            :data:`CPU_MEMORY_RESERVATION_MIB`).
        log_retention / removal_policy: of the container and flow log groups.
        container_insights: Container Insights on the cluster (CloudWatch charges per metric).
        ssm_access: the instance role gets ``AmazonSSMManagedInstanceCore`` (Session Manager
            shells for debugging; no inbound port is opened).
        scopes: where each model's task definition and service go (default: here).
        capacity_release: the function behind ``Custom::EcsCapacityRelease``
            (:mod:`asyncinfer.functions.ecs_teardown`): on stack deletion, after the services and
            before the
            group, it sets the group to 0 and lifts the instances' scale-in protection, which
            managed termination protection set and which would otherwise hang the deletion.
    """

    def __init__(
        self,
        scope: Construct,
        id: str,
        *,
        image: ecr_assets.DockerImageAsset,
        queues: Mapping[str, sqs.IQueue],
        prefix: str,
        environment: Mapping[str, str],
        computes: Mapping[str, ModelCompute],
        stop_timeout: int,
        memory_reservation_mib: int,
        log_retention: logs.RetentionDays,
        removal_policy: RemovalPolicy,
        container_insights: bool = False,
        ssm_access: bool = False,
        scopes: ModelScopes | None = None,
        capacity_release: lambda_.IFunction | None = None,
    ) -> None:
        self.prefix = prefix
        super().__init__(scope, id)
        flow_logs = logs.LogGroup(
            self, "FlowLogs", retention=log_retention, removal_policy=removal_policy
        )
        self.vpc = ec2.Vpc(
            self,
            "Vpc",
            max_azs=2,
            nat_gateways=0,
            subnet_configuration=[
                ec2.SubnetConfiguration(
                    name="public", subnet_type=ec2.SubnetType.PUBLIC, cidr_mask=24
                )
            ],
            flow_logs={
                "all": ec2.FlowLogOptions(
                    destination=ec2.FlowLogDestination.to_cloud_watch_logs(flow_logs),
                    traffic_type=ec2.FlowLogTrafficType.REJECT,
                )
            },
        )
        self.cluster = ecs.Cluster(
            self,
            "Cluster",
            vpc=self.vpc,
            container_insights_v2=(
                ecs.ContainerInsights.ENABLED
                if container_insights
                else ecs.ContainerInsights.DISABLED
            ),
        )
        sg = ec2.SecurityGroup(
            self,
            "InstanceSg",
            vpc=self.vpc,
            allow_all_outbound=True,
            description="asyncinfer GPU workers: no inbound",
        )
        instance_role = iam.Role(
            self, "InstanceRole", assumed_by=iam.ServicePrincipal("ec2.amazonaws.com")
        )
        instance_role.add_managed_policy(
            iam.ManagedPolicy.from_aws_managed_policy_name(
                "service-role/AmazonEC2ContainerServiceforEC2Role"
            )
        )
        if ssm_access:
            instance_role.add_managed_policy(
                iam.ManagedPolicy.from_aws_managed_policy_name("AmazonSSMManagedInstanceCore")
            )
        self._instance_role, self._sg = instance_role, sg
        self._capacity_release_fn = capacity_release
        #: Models of each capacity group, keyed (instance type, GPU or not), in model order.
        groups: dict[tuple[str, bool], list[str]] = {}
        for model, c in computes.items():
            groups.setdefault((c.instance_type, c.gpus > 0), []).append(model)
        #: model id -> the capacity provider its service places tasks on.
        self.capacity_providers: dict[str, ecs.AsgCapacityProvider] = {}
        self.asgs: list[autoscaling.AutoScalingGroup] = []
        self.releases: list[CustomResource] = []
        for index, ((itype, gpu), members) in enumerate(groups.items()):
            cp = self._capacity_group(
                index,
                instance_type=itype,
                gpu=gpu,
                min_instances=sum(computes[m].min_workers for m in members),
                max_instances=sum(computes[m].max_workers for m in members),
                warm_pool=sum(computes[m].warm_pool for m in members),
                image=image,
            )
            for m in members:
                self.capacity_providers[m] = cp
        #: The first group's (a catalogue on one instance type has one group).
        self.asg = self.asgs[0]
        self.release: CustomResource | None = self.releases[0] if self.releases else None

        self.services: dict[str, ecs.Ec2Service] = {}
        self.task_roles: dict[str, iam.Role] = {}
        stack = Stack.of(self)
        for model, _queue in queues.items():
            c = computes[model]
            sc = scopes.of(self, model) if scopes else self
            task_def = ecs.Ec2TaskDefinition(
                sc, f"{model}-task", network_mode=ecs.NetworkMode.BRIDGE
            )
            log_group = logs.LogGroup(
                sc, f"{model}-logs", retention=log_retention, removal_policy=removal_policy
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
                    memory_reservation_mib
                    if c.gpus and not engine_beside
                    else CPU_MEMORY_RESERVATION_MIB
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
                    resources=[
                        stack.format_arn(
                            service="ecs",
                            resource="task",
                            resource_name=f"{self.cluster.cluster_name}/*",
                        )
                    ],
                )
            )
            service = ecs.Ec2Service(
                sc,
                f"{model}-service",
                service_name=naming.ecs_service_name(prefix, model),
                cluster=self.cluster,
                task_definition=task_def,
                desired_count=c.min_workers,
                min_healthy_percent=0,
                max_healthy_percent=100,
                circuit_breaker=ecs.DeploymentCircuitBreaker(rollback=True),
                capacity_provider_strategies=[
                    ecs.CapacityProviderStrategy(
                        capacity_provider=self.capacity_providers[model].capacity_provider_name,
                        weight=1,
                    )
                ],
                enable_ecs_managed_tags=True,
                propagate_tags=ecs.PropagatedTagSource.SERVICE,
            )
            # CDK adds the cluster's capacity-provider association (an aspect, at synth) as a
            # child of the cluster; a dependency on the cluster construct includes it.
            service.node.add_dependency(self.cluster)
            for release in self.releases:
                service.node.add_dependency(release)
            scaling = service.auto_scale_task_count(
                min_capacity=c.min_workers, max_capacity=c.max_workers
            )
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
            self.services[model] = service
            self.task_roles[model] = task_def.task_role  # type: ignore[assignment]

    def _capacity_group(
        self,
        index: int,
        *,
        instance_type: str,
        gpu: bool,
        min_instances: int,
        max_instances: int,
        warm_pool: int = 0,
        image: ecr_assets.DockerImageAsset | None = None,
    ) -> ecs.AsgCapacityProvider:
        """One capacity group: a launch template (the GPU or the standard ECS-optimised AL2023
        AMI), an Auto Scaling group of ``min_instances..max_instances`` and a managed capacity
        provider on the cluster, plus its release custom resource. The first group keeps the
        construct ids of the single group of earlier versions; the others are suffixed.

        With ``warm_pool`` > 0 the group gets an EC2 Auto Scaling warm pool of that many stopped
        instances (:func:`instance_user_data`)."""
        sfx = "" if index == 0 else str(index + 1)
        hw = ecs.AmiHardwareType.GPU if gpu else ecs.AmiHardwareType.STANDARD
        instance_role, sg = self._instance_role, self._sg
        launch_template = ec2.LaunchTemplate(
            self,
            f"LaunchTemplate{sfx}",
            instance_type=ec2.InstanceType(instance_type),
            machine_image=ecs.EcsOptimizedImage.amazon_linux2023(hw),
            user_data=instance_user_data(
                gpu=gpu, warm_pool=warm_pool > 0, image_uri=image.image_uri if image else None
            ),
            role=instance_role,
            security_group=sg,
            require_imdsv2=True,
            http_tokens=ec2.LaunchTemplateHttpTokens.REQUIRED,
            http_put_response_hop_limit=1,
            associate_public_ip_address=True,
            detailed_monitoring=False,
            block_devices=[
                ec2.BlockDevice(
                    device_name="/dev/xvda",
                    volume=ec2.BlockDeviceVolume.ebs(
                        200,
                        encrypted=True,
                        volume_type=ec2.EbsDeviceVolumeType.GP3,
                        delete_on_termination=True,
                    ),
                )
            ],
        )
        asg = autoscaling.AutoScalingGroup(
            self,
            f"Asg{sfx}",
            vpc=self.vpc,
            vpc_subnets=ec2.SubnetSelection(subnet_type=ec2.SubnetType.PUBLIC),
            launch_template=launch_template,
            min_capacity=min_instances,
            max_capacity=max_instances,
        )
        if warm_pool:
            # Stopped, not running: idle cost is the EBS volumes. Reuse on scale-in cannot be set
            # for ECS (ECS developer guide, "Configuring pre-initialized instances for your Amazon
            # ECS Auto Scaling group"). max_group_prepared_capacity = the pool size keeps exactly
            # ``warm_pool`` instances prepared whatever the group's desired count (EC2 Auto
            # Scaling user guide, "Warm pools": pool size = max(min_size, prepared - desired)).
            asg.add_warm_pool(
                min_size=warm_pool,
                max_group_prepared_capacity=warm_pool,
                pool_state=autoscaling.PoolState.STOPPED,
                reuse_on_scale_in=False,
            )
        cp = ecs.AsgCapacityProvider(
            self,
            f"CapacityProvider{sfx}",
            auto_scaling_group=asg,
            enable_managed_scaling=True,
            enable_managed_termination_protection=True,
            enable_managed_draining=True,
            target_capacity_percent=100,
        )
        self.cluster.add_asg_capacity_provider(cp)
        self.asgs.append(asg)
        if self._capacity_release_fn is not None:
            self.releases.append(self._capacity_release(self._capacity_release_fn, asg, sfx))
        return cp

    def _capacity_release(
        self, fn: lambda_.IFunction, asg: autoscaling.AutoScalingGroup, sfx: str
    ) -> CustomResource:
        """The custom resource that releases the group on deletion, with the function's rights
        on this group only (DescribeAutoScalingGroups takes no resource ARN)."""
        stack = Stack.of(self)
        group = stack.format_arn(
            service="autoscaling",
            resource="autoScalingGroup",
            resource_name=f"*:autoScalingGroupName/{asg.auto_scaling_group_name}",
            arn_format=ArnFormat.COLON_RESOURCE_NAME,
        )
        iam.Grant.add_to_principal(
            grantee=fn,
            actions=["autoscaling:UpdateAutoScalingGroup", "autoscaling:SetInstanceProtection"],
            resource_arns=[group],
        )
        iam.Grant.add_to_principal(
            grantee=fn, actions=["autoscaling:DescribeAutoScalingGroups"], resource_arns=["*"]
        )
        release = CustomResource(
            self,
            f"CapacityRelease{sfx}",
            service_token=fn.function_arn,
            resource_type="Custom::EcsCapacityRelease",
            properties={"AutoScalingGroupName": asg.auto_scaling_group_name},
        )
        release.node.add_dependency(asg)
        release.node.add_dependency(fn)  # its role and policy outlive the release
        return release

    def services_arn_pattern(self) -> str:
        """The worker services of this cluster (names from :mod:`asyncinfer.core.naming`) as one IAM
        resource pattern: a list of service ARNs would grow with the catalogue."""
        return Stack.of(self).format_arn(
            service="ecs",
            resource="service",
            resource_name=f"{self.cluster.cluster_name}/{self.prefix}*",
        )

    def grant_describe_services(self, grantee: iam.IGrantable) -> None:
        """Allow ``ecs:DescribeServices`` on this cluster's worker services."""
        iam.Grant.add_to_principal(
            grantee=grantee,
            actions=["ecs:DescribeServices"],
            resource_arns=[self.services_arn_pattern()],
        )

    def grant_wake(self, grantee: iam.IGrantable) -> None:
        """Allow wake-on-submit (:mod:`asyncinfer.scaling.wake`): ``ecs:DescribeServices`` and
        ``ecs:UpdateService`` on the worker services, to take one from 0 to 1 task."""
        iam.Grant.add_to_principal(
            grantee=grantee,
            actions=["ecs:DescribeServices", "ecs:UpdateService"],
            resource_arns=[self.services_arn_pattern()],
        )


def image_excludes() -> Sequence[str]:
    """Paths of the repository that the worker image never needs (kept out of the asset hash and
    the build context; ``.dockerignore`` applies too)."""
    return [
        ".git",
        ".venv",
        "node_modules",
        "cdk.out",
        "build",
        "dist",
        ".asyncinfer",
        ".ci",
        "tests",
        "bench",
        "infra",
        "docs",
        "lambdas",
        "**/__pycache__",
        "**/*.pyc",
        ".mypy_cache",
        ".ruff_cache",
        ".pytest_cache",
        "*.egg-info",
        "package.json",
        "package-lock.json",
        "cdk.json",
        "cdk.context.json",
    ]
