"""``Custom::EcsCapacityRelease`` (CloudFormation custom resource): on stack deletion, release the
GPU Auto Scaling group so that its protected instances terminate. Logic:
:mod:`asyncinfer.teardown`."""

from __future__ import annotations

from typing import Any

import boto3

from asyncinfer.teardown import handle


def handler(event: dict[str, Any], context: Any) -> str:
    """Answer CloudFormation; on Delete, release the group first."""
    return handle(event, context, autoscaling=boto3.client("autoscaling"))
