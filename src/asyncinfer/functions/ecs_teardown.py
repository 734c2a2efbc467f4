"""Stack deletion in ECS mode: release the GPU Auto Scaling group before CloudFormation deletes
it.

The capacity provider's managed termination protection marks instances that ran tasks as
protected from scale-in. When the stack is deleted CloudFormation sets the group to zero and
waits for its instances to terminate, which protected instances never do, so the deletion hangs
(aws-cdk issue 18179). The CDK app's ``Custom::EcsCapacityRelease`` resource runs
:func:`release_capacity` on Delete, after the worker services are gone and before the group is
deleted.
"""

from __future__ import annotations

import json
import urllib.request
from typing import Any

#: SetInstanceProtection takes at most 50 instance ids per call (Auto Scaling API reference).
PROTECTION_BATCH = 50


def release_capacity(group: str, *, autoscaling: Any) -> list[str]:
    """Set ``group``'s min, max and desired capacity to 0 and remove scale-in protection from
    its instances, so that they terminate. Returns the instance ids released; a group that no
    longer exists releases nothing."""
    groups = autoscaling.describe_auto_scaling_groups(AutoScalingGroupNames=[group])
    found = groups.get("AutoScalingGroups", [])
    if not found:
        return []
    autoscaling.update_auto_scaling_group(
        AutoScalingGroupName=group,
        MinSize=0,
        MaxSize=0,
        DesiredCapacity=0,
        NewInstancesProtectedFromScaleIn=False,
    )
    protected = [
        i["InstanceId"] for i in found[0].get("Instances", []) if i.get("ProtectedFromScaleIn")
    ]
    for start in range(0, len(protected), PROTECTION_BATCH):
        autoscaling.set_instance_protection(
            AutoScalingGroupName=group,
            InstanceIds=protected[start : start + PROTECTION_BATCH],
            ProtectedFromScaleIn=False,
        )
    return protected


def cfn_response(event: dict[str, Any], context: Any, status: str, reason: str = "") -> bytes:
    """The body of a CloudFormation custom resource response (CloudFormation user guide,
    "Custom resource response objects")."""
    return json.dumps(
        {
            "Status": status,
            "Reason": reason or f"see log stream {getattr(context, 'log_stream_name', '')}",
            "PhysicalResourceId": event.get("PhysicalResourceId") or "ecs-capacity-release",
            "StackId": event["StackId"],
            "RequestId": event["RequestId"],
            "LogicalResourceId": event["LogicalResourceId"],
            "NoEcho": False,
            "Data": {},
        }
    ).encode()


def handle(event: dict[str, Any], context: Any, *, autoscaling: Any, send: Any = None) -> str:
    """Custom resource handler: on Delete release the group; always answer SUCCESS (a failed
    release must not leave the stack stuck in DELETE_FAILED; the group's own deletion then
    reports what is wrong). Returns the status sent."""
    reason = ""
    if event.get("RequestType") == "Delete":
        try:
            released = release_capacity(
                event["ResourceProperties"]["AutoScalingGroupName"], autoscaling=autoscaling
            )
            reason = f"released {len(released)} protected instance(s)"
        except Exception as exc:  # report, never block the deletion
            reason = f"release failed: {exc}"[:500]
    body = cfn_response(event, context, "SUCCESS", reason)
    (send or _put)(event["ResponseURL"], body)
    return "SUCCESS"


def _put(url: str, body: bytes) -> None:
    """PUT the response to CloudFormation's pre-signed S3 URL."""
    if not url.startswith("https://"):
        raise ValueError("the custom resource response URL must be https")
    req = urllib.request.Request(url, data=body, method="PUT", headers={"content-type": ""})
    with urllib.request.urlopen(req, timeout=30) as resp:  # https only, checked above
        resp.read()


def handler(event: dict[str, Any], context: Any) -> str:
    """``Custom::EcsCapacityRelease`` entry point: answer CloudFormation; on Delete, release the
    group first (:func:`handle`)."""
    import boto3

    return handle(event, context, autoscaling=boto3.client("autoscaling"))
