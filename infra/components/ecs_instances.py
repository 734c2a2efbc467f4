"""What the ECS capacity's instances do at boot: the weight cache directory and, for a group with
an EC2 Auto Scaling warm pool, the ECS agent's warm-pool check and a pull of the worker image
while the instance is warmed (so a stopped pooled instance holds the image on its volume)."""

from __future__ import annotations

from aws_cdk import Aws, Fn
from aws_cdk import aws_ec2 as ec2

#: The instance's weight cache for ``s3://`` sources (on its EBS root volume), and where a
#: worker task sees it: downloaded once per instance, reused by its later tasks.
HOST_WEIGHT_CACHE = "/var/cache/asyncinfer/weights"
CONTAINER_WEIGHT_CACHE = "/opt/asyncinfer/weights"
#: The worker image's user (container/Dockerfile: ``useradd --uid 1000``).
WORKER_UID = 1000


def instance_user_data(*, warm_pool: bool, image_uri: str | None) -> ec2.UserData:
    """The GPU or CPU instances' user data (before the ECS cluster line CDK adds).

    Always: the weight cache directory, owned by the worker image's user. With a warm pool:
    ``ECS_WARM_POOLS_CHECK=true`` (the ECS agent does not register an instance while it is
    being warmed; agent >= 1.59.0), ``ECS_IMAGE_PULL_BEHAVIOR=prefer-cached`` and a pull of the
    worker image during warm-up, so the image is on the stopped instance's volume when the pool
    hands it to the group (ECS developer guide, "Configuring pre-initialized instances for your
    Amazon ECS Auto Scaling group" and "Amazon ECS container agent configuration"). The pull
    needs the AWS CLI of the AMI and the instance role's ECR read (both on the ECS-optimised
    AMI and its managed policy); where it fails the first task pulls as without a pool.
    """
    ud = ec2.UserData.for_linux()
    ud.add_commands(
        f"install -d -o {WORKER_UID} -g {WORKER_UID} -m 0750 {HOST_WEIGHT_CACHE}",
    )
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
