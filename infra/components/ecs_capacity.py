"""The capacity of ``compute=ecs``: one group per (instance type, GPU or not) of the catalogue,
each a launch template, an Auto Scaling group (optionally with a warm pool) and a managed
capacity provider on the cluster, plus the custom resource that releases the group when the stack
is deleted. :class:`~infra.components.ecs_workers.EcsWorkers` builds them in its own scope."""

from __future__ import annotations

from aws_cdk import ArnFormat, CustomResource, Stack
from aws_cdk import aws_autoscaling as autoscaling
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_ecr_assets as ecr_assets
from aws_cdk import aws_ecs as ecs
from aws_cdk import aws_iam as iam
from aws_cdk import aws_lambda as lambda_
from constructs import Construct

from infra.components.ecs_instances import instance_user_data

#: The root volume of every instance, GiB (gp3, encrypted): the worker image, and the weights
#: cache (:data:`~infra.components.ecs_instances.WEIGHTS_CACHE_PATH`) that tasks share.
ROOT_VOLUME_GIB = 200


def capacity_group(
    scope: Construct,
    sfx: str,
    *,
    vpc: ec2.IVpc,
    cluster: ecs.Cluster,
    role: iam.IRole,
    security_group: ec2.ISecurityGroup,
    instance_type: str,
    gpu: bool,
    min_instances: int,
    max_instances: int,
    warm_pool: int = 0,
    image: ecr_assets.DockerImageAsset | None = None,
) -> tuple[ecs.AsgCapacityProvider, autoscaling.AutoScalingGroup]:
    """One capacity group in ``scope``, its construct ids suffixed ``sfx`` (``""`` for the first
    group): a launch template (the GPU or the
    standard ECS-optimised AL2023 AMI; IMDSv2 with a hop limit of 1, public address, the
    :data:`ROOT_VOLUME_GIB` root volume), an Auto Scaling group of
    ``min_instances..max_instances`` in the public subnets and a capacity provider with managed
    scaling, termination protection and draining, added to ``cluster``.

    With ``warm_pool`` > 0 the group gets an EC2 Auto Scaling warm pool of that many stopped
    instances (:func:`~infra.components.ecs_instances.instance_user_data`).

    Returns:
        ``(capacity provider, Auto Scaling group)``.
    """
    hw = ecs.AmiHardwareType.GPU if gpu else ecs.AmiHardwareType.STANDARD
    launch_template = ec2.LaunchTemplate(
        scope,
        f"LaunchTemplate{sfx}",
        instance_type=ec2.InstanceType(instance_type),
        machine_image=ecs.EcsOptimizedImage.amazon_linux2023(hw),
        user_data=instance_user_data(
            gpu=gpu, warm_pool=warm_pool > 0, image_uri=image.image_uri if image else None
        ),
        role=role,
        security_group=security_group,
        require_imdsv2=True,
        http_tokens=ec2.LaunchTemplateHttpTokens.REQUIRED,
        http_put_response_hop_limit=1,
        associate_public_ip_address=True,
        detailed_monitoring=False,
        block_devices=[
            ec2.BlockDevice(
                device_name="/dev/xvda",
                volume=ec2.BlockDeviceVolume.ebs(
                    ROOT_VOLUME_GIB,
                    encrypted=True,
                    volume_type=ec2.EbsDeviceVolumeType.GP3,
                    delete_on_termination=True,
                ),
            )
        ],
    )
    asg = autoscaling.AutoScalingGroup(
        scope,
        f"Asg{sfx}",
        vpc=vpc,
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
        scope,
        f"CapacityProvider{sfx}",
        auto_scaling_group=asg,
        enable_managed_scaling=True,
        enable_managed_termination_protection=True,
        enable_managed_draining=True,
        target_capacity_percent=100,
    )
    cluster.add_asg_capacity_provider(cp)
    return cp, asg


def capacity_release(
    scope: Construct, fn: lambda_.IFunction, asg: autoscaling.AutoScalingGroup, sfx: str
) -> CustomResource:
    """The custom resource (``Custom::EcsCapacityRelease``, id ``CapacityRelease<sfx>`` in
    ``scope``) that releases ``asg`` on deletion through ``fn``
    (:mod:`asyncinfer.functions.ecs_teardown`), with the function's rights on this group only
    (DescribeAutoScalingGroups takes no resource ARN). It depends on the group and on the
    function, so their role and policy outlive it."""
    stack = Stack.of(scope)
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
        scope,
        f"CapacityRelease{sfx}",
        service_token=fn.function_arn,
        resource_type="Custom::EcsCapacityRelease",
        properties={"AutoScalingGroupName": asg.auto_scaling_group_name},
    )
    release.node.add_dependency(asg)
    release.node.add_dependency(fn)  # its role and policy outlive the release
    return release
