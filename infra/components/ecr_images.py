"""Container images in Amazon ECR: recognising an image URI as a private ECR one and the ARN of
its repository, for the pull grants of the roles that run it (ECS task execution role, SageMaker
execution role). Imports no CDK.

URI shape (Amazon ECR User Guide, "Pulling an image"):
``<account>.dkr.ecr.<region>.amazonaws.com[.cn]/<repository>(:<tag>|@sha256:<digest>)``.
"""

from __future__ import annotations

import re

#: A private ECR image URI with a tag or a digest.
ECR_IMAGE = re.compile(
    r"^(?P<account>\d{12})\.dkr\.ecr\.(?P<region>[a-z0-9-]+)\.amazonaws\.com(?:\.cn)?/"
    r"(?P<repo>[a-z0-9._/-]+)(?::(?P<tag>[\w.-]+)|@(?P<digest>sha256:[0-9a-f]{64}))$"
)

#: The actions that pull an image from its repository (AmazonEC2ContainerRegistryReadOnly, less
#: the describe/list ones); ``ecr:GetAuthorizationToken`` takes no resource and is granted apart.
PULL_ACTIONS = (
    "ecr:BatchCheckLayerAvailability",
    "ecr:BatchGetImage",
    "ecr:GetDownloadUrlForLayer",
)


def is_ecr_image(uri: str) -> bool:
    """Whether ``uri`` is a private Amazon ECR image URI (:data:`ECR_IMAGE`)."""
    return ECR_IMAGE.match(uri) is not None


def split_image(uri: str) -> tuple[str, str]:
    """``(repository name, tag or digest)`` of ECR image ``uri``: ``("team/engine", "1.2")``, or
    ``("team/engine", "sha256:<hex>")`` for a digest (what CDK's
    ``ContainerImage.from_ecr_repository(repository, tag)`` takes).

    Raises:
        ValueError: ``uri`` is not a private ECR image URI.
    """
    m = ECR_IMAGE.match(uri)
    if m is None:
        raise ValueError(f"not an Amazon ECR image URI: {uri!r}")
    return m.group("repo"), m.group("tag") or m.group("digest")


def repository_arn(uri: str) -> str:
    """The ECR repository ARN of image ``uri``, in the partition of its region
    (``aws-cn`` for ``cn-*``, ``aws-us-gov`` for ``us-gov-*``, else ``aws``).

    Raises:
        ValueError: ``uri`` is not a private ECR image URI.
    """
    m = ECR_IMAGE.match(uri)
    if m is None:
        raise ValueError(f"not an Amazon ECR image URI: {uri!r}")
    region = m.group("region")
    partition = (
        "aws-cn"
        if region.startswith("cn-")
        else ("aws-us-gov" if region.startswith("us-gov-") else "aws")
    )
    return f"arn:{partition}:ecr:{region}:{m.group('account')}:repository/{m.group('repo')}"
