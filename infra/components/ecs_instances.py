"""What the ECS capacity's instances do at boot: the weights cache folder, GPU support in the ECS
agent, and, for a group with an EC2 Auto Scaling warm pool, the agent's warm-pool check and a pull
of the worker image while the instance is warmed (so a stopped pooled instance holds the image on
its volume)."""

from __future__ import annotations

from aws_cdk import Aws, Fn
from aws_cdk import aws_ec2 as ec2

#: The instance folder that holds downloaded ``s3://`` weights (asyncinfer.models.weights), on
#: the instance's root volume: mounted into every worker task at the same path, so that later
#: tasks on the instance reuse them.
WEIGHTS_CACHE_PATH = "/var/cache/asyncinfer"
#: The uid of the worker image's user (container/Dockerfile: ``useradd --uid 1000``), owner of
#: :data:`WEIGHTS_CACHE_PATH` on the instance.
WORKER_UID = 1000


def instance_user_data(*, gpu: bool, warm_pool: bool, image_uri: str | None) -> ec2.UserData:
    """The GPU or CPU instances' user data (before the ECS cluster line CDK adds).

    Always: the weights cache folder, owned by the worker image's user (the ECS agent would create
    a missing host folder owned by root). GPU instances: ``ECS_ENABLE_GPU_SUPPORT=true`` (the
    agent registers the GPUs and starts a task that reserves some with the nvidia runtime and
    ``NVIDIA_VISIBLE_DEVICES``; ECS developer guide, "Amazon ECS task definitions for GPU
    workloads"; the GPU-optimised AMI sets it too, stated so that a custom AMI cannot silently run
    on the CPU). With a warm pool: ``ECS_WARM_POOLS_CHECK=true`` (the agent does not register an
    instance while it is being warmed; agent >= 1.59.0), ``ECS_IMAGE_PULL_BEHAVIOR=prefer-cached``
    and a pull of the worker image during warm-up, so the image is on the stopped instance's volume
    when the pool hands it to the group (ECS developer guide, "Configuring pre-initialized
    instances for your Amazon ECS Auto Scaling group", "Amazon ECS container agent
    configuration"). The pull uses the AMI's AWS CLI and the instance role's ECR read (both on the
    ECS-optimised AMI and its managed policy); where it fails, the first task pulls as without a
    pool.
    """
    ud = ec2.UserData.for_linux()
    ud.add_commands(
        f"mkdir -p {WEIGHTS_CACHE_PATH}",
        f"chown {WORKER_UID}:{WORKER_UID} {WEIGHTS_CACHE_PATH}",
    )
    if gpu:
        ud.add_commands("echo ECS_ENABLE_GPU_SUPPORT=true >> /etc/ecs/ecs.config")
    if warm_pool:
        ud.add_commands(
            "echo ECS_WARM_POOLS_CHECK=true >> /etc/ecs/ecs.config",
            "echo ECS_IMAGE_PULL_BEHAVIOR=prefer-cached >> /etc/ecs/ecs.config",
        )
        if image_uri is not None:
            registry = Fn.select(0, Fn.split("/", image_uri))
            ud.add_commands(
                "( systemctl start docker || true;"
                f" aws ecr get-login-password --region {Aws.REGION}"
                f" | docker login --username AWS --password-stdin {registry}"
                f" && docker pull {image_uri} ) || echo 'asyncinfer: image pre-pull failed'",
            )
    return ud
