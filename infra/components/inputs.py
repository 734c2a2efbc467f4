"""Read access to the S3 locations an operator lets jobs name as ``input_url`` (context key
``input_locations``; :mod:`asyncinfer.jobs.inputs` checks them at submit). The components that read
a job's input get ``s3:GetObject`` on exactly those prefixes: the ECS workers' task roles and the
SageMaker endpoints' execution role (SageMaker reads ``InputLocation`` with it)."""

from __future__ import annotations

from collections.abc import Iterable

from aws_cdk import Acknowledgment, Aws, Stack, Validations
from aws_cdk import aws_iam as iam


def location_arns(locations: Iterable[str]) -> list[str]:
    """``bucket`` or ``bucket/prefix`` -> the object ARN pattern of that folder
    (``arn:<partition>:s3:::bucket/prefix/*``; a prefix always names a folder, as at submit)."""
    out = []
    for entry in locations:
        bucket, _, prefix = entry.strip().strip("/").partition("/")
        folder = f"{prefix.strip('/')}/" if prefix.strip("/") else ""
        out.append(f"arn:{Aws.PARTITION}:s3:::{bucket}/{folder}*")
    return out


def grant_input_locations(
    stack: Stack, grantees: Iterable[iam.IGrantable], locations: tuple[str, ...]
) -> None:
    """``s3:GetObject`` on ``locations`` for each of ``grantees``, and the cdk-nag IAM5
    acknowledgment of each (the operator chose these prefixes; objects, not buckets)."""
    if not locations:
        return
    arns = location_arns(locations)
    for grantee in grantees:
        grantee.grant_principal.add_to_principal_policy(
            iam.PolicyStatement(actions=["s3:GetObject"], resources=arns)
        )
    Validations.of(stack).acknowledge(
        *(
            Acknowledgment(
                id="AwsSolutions-IAM5[Resource::"
                + arn.replace(Aws.PARTITION, "<AWS::Partition>")
                + "]",
                reason="Objects under an input location the operator allows (input_locations).",
            )
            for arn in arns
        )
    )
