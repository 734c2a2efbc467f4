"""``compute=ecs``: GPU container instances that scale to zero, one worker service per model,
scaled on backlog per task. The capacity groups are :mod:`infra.components.ecs_capacity`, each
model's service :mod:`infra.components.ecs_services`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from aws_cdk import CustomResource, RemovalPolicy, Stack
from aws_cdk import aws_autoscaling as autoscaling
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_ecr_assets as ecr_assets
from aws_cdk import aws_ecs as ecs
from aws_cdk import aws_iam as iam
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_logs as logs
from aws_cdk import aws_sqs as sqs
from constructs import Construct

from asyncinfer.core import naming
from infra.components.ecs_capacity import capacity_group
from infra.components.ecs_capacity import capacity_release as release_resource
from infra.components.ecs_services import add_worker_service
from infra.components.model_scopes import ModelScopes
from infra.model_compute import ModelCompute

__all__ = ["EcsWorkers", "image_excludes"]


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
            :data:`~infra.components.ecs_services.CPU_MEMORY_RESERVATION_MIB`).
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
            service, role = add_worker_service(
                scopes.of(self, model) if scopes else self,
                model=model,
                compute=computes[model],
                image=image,
                cluster=self.cluster,
                capacity_provider=self.capacity_providers[model],
                releases=self.releases,
                service_name=naming.ecs_service_name(prefix, model),
                protection_arn=stack.format_arn(
                    service="ecs",
                    resource="task",
                    resource_name=f"{self.cluster.cluster_name}/*",
                ),
                environment=environment,
                stop_timeout=stop_timeout,
                memory_reservation_mib=memory_reservation_mib,
                log_retention=log_retention,
                removal_policy=removal_policy,
            )
            self.services[model] = service
            self.task_roles[model] = role  # type: ignore[assignment]

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
        """Capacity group ``index`` (:func:`~infra.components.ecs_capacity.capacity_group`) and
        its release custom resource. The first group's construct ids have no suffix; the
        others are suffixed with their number."""
        sfx = "" if index == 0 else str(index + 1)
        cp, asg = capacity_group(
            self,
            sfx,
            vpc=self.vpc,
            cluster=self.cluster,
            role=self._instance_role,
            security_group=self._sg,
            instance_type=instance_type,
            gpu=gpu,
            min_instances=min_instances,
            max_instances=max_instances,
            warm_pool=warm_pool,
            image=image,
        )
        self.asgs.append(asg)
        if self._capacity_release_fn is not None:
            self.releases.append(release_resource(self, self._capacity_release_fn, asg, sfx))
        return cp

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
