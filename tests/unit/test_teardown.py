"""Stack deletion in ECS mode: the custom resource that releases the GPU group (moto)."""

from __future__ import annotations

from typing import Any

import boto3
from moto import mock_aws

from asyncinfer.functions.ecs_teardown import handle, release_capacity

REGION = "us-east-1"


def _group(autoscaling: Any, ec2: Any) -> list[str]:
    ami = ec2.describe_images()["Images"][0]["ImageId"]
    autoscaling.create_launch_configuration(
        LaunchConfigurationName="lc", ImageId=ami, InstanceType="t3.micro"
    )
    autoscaling.create_auto_scaling_group(
        AutoScalingGroupName="gpu",
        LaunchConfigurationName="lc",
        MinSize=2,
        MaxSize=4,
        DesiredCapacity=2,
        AvailabilityZones=[f"{REGION}a"],
        NewInstancesProtectedFromScaleIn=True,
    )
    group = autoscaling.describe_auto_scaling_groups(AutoScalingGroupNames=["gpu"])
    return [i["InstanceId"] for i in group["AutoScalingGroups"][0]["Instances"]]


@mock_aws
def test_release_sets_the_group_to_zero_and_lifts_scale_in_protection() -> None:
    autoscaling = boto3.client("autoscaling", region_name=REGION)
    ids = _group(autoscaling, boto3.client("ec2", region_name=REGION))
    assert len(ids) == 2
    assert sorted(release_capacity("gpu", autoscaling=autoscaling)) == sorted(ids)
    g = autoscaling.describe_auto_scaling_groups(AutoScalingGroupNames=["gpu"])["AutoScalingGroups"]
    assert (g[0]["MinSize"], g[0]["MaxSize"], g[0]["DesiredCapacity"]) == (0, 0, 0)
    assert not any(i.get("ProtectedFromScaleIn") for i in g[0]["Instances"])
    assert release_capacity("gone", autoscaling=autoscaling) == []


@mock_aws
def test_handler_answers_success_on_every_request_and_releases_only_on_delete() -> None:
    autoscaling = boto3.client("autoscaling", region_name=REGION)
    _group(autoscaling, boto3.client("ec2", region_name=REGION))
    sent: list[tuple[str, bytes]] = []
    event = {
        "RequestType": "Create",
        "ResponseURL": "https://cloudformation-custom-resource-response.invalid/x",
        "StackId": "arn:aws:cloudformation:us-east-1:123456789012:stack/s/1",
        "RequestId": "r",
        "LogicalResourceId": "CapacityRelease",
        "ResourceProperties": {"AutoScalingGroupName": "gpu"},
    }
    assert handle(event, None, autoscaling=autoscaling, send=lambda u, b: sent.append((u, b)))
    g = autoscaling.describe_auto_scaling_groups(AutoScalingGroupNames=["gpu"])["AutoScalingGroups"]
    assert g[0]["DesiredCapacity"] == 2  # create: nothing changed
    handle(
        {**event, "RequestType": "Delete", "PhysicalResourceId": "p"},
        None,
        autoscaling=autoscaling,
        send=lambda u, b: sent.append((u, b)),
    )
    g = autoscaling.describe_auto_scaling_groups(AutoScalingGroupNames=["gpu"])["AutoScalingGroups"]
    assert g[0]["DesiredCapacity"] == 0
    assert all(b'"Status": "SUCCESS"' in body for _, body in sent) and len(sent) == 2
    assert b'"PhysicalResourceId": "p"' in sent[1][1]


def test_a_failed_release_still_answers_success() -> None:
    class Broken:
        def describe_auto_scaling_groups(self, **_: Any) -> Any:
            raise RuntimeError("AccessDenied")

    sent: list[bytes] = []
    event = {
        "RequestType": "Delete",
        "ResponseURL": "https://x.invalid/",
        "StackId": "s",
        "RequestId": "r",
        "LogicalResourceId": "l",
        "ResourceProperties": {"AutoScalingGroupName": "gpu"},
    }
    handle(event, None, autoscaling=Broken(), send=lambda _u, b: sent.append(b))
    assert b"SUCCESS" in sent[0] and b"AccessDenied" in sent[0]
