"""compute=ecs: GPU capacity scaling to zero, worker services, backlog-based scaling."""

from __future__ import annotations

import json
from typing import Any

from asyncinfer.core import naming
from asyncinfer.models.registry import MODELS


def test_gpu_autoscaling_group_starts_at_zero(ecs: Any) -> None:
    asg = ecs.props("AWS::AutoScaling::AutoScalingGroup")[0]
    assert asg["MinSize"] == "0"
    assert int(asg["MaxSize"]) == 2 * len(MODELS)
    assert asg["NewInstancesProtectedFromScaleIn"] is True


def test_launch_template_uses_the_ecs_gpu_ami_imdsv2_and_encrypted_disk(ecs: Any) -> None:
    lt = ecs.props("AWS::EC2::LaunchTemplate")[0]["LaunchTemplateData"]
    assert lt["InstanceType"] == "g5.xlarge"
    assert lt["MetadataOptions"]["HttpTokens"] == "required"
    assert lt["BlockDeviceMappings"][0]["Ebs"]["Encrypted"] is True
    param = ecs.template["Parameters"][lt["ImageId"]["Ref"]]
    assert (
        param["Default"]
        == "/aws/service/ecs/optimized-ami/amazon-linux-2023/gpu/recommended/image_id"
    )


def test_capacity_provider_has_managed_scaling(ecs: Any) -> None:
    cp = ecs.props("AWS::ECS::CapacityProvider")[0]["AutoScalingGroupProvider"]
    assert cp["ManagedScaling"]["Status"] == "ENABLED"
    assert cp["ManagedScaling"]["TargetCapacity"] == 100
    assert cp["ManagedTerminationProtection"] == "ENABLED"


def test_one_worker_service_per_model_with_a_gpu_each(ecs: Any) -> None:
    services = ecs.props("AWS::ECS::Service")
    assert len(services) == len(MODELS)
    for s in services:
        assert s["DesiredCount"] == 0
        assert s["CapacityProviderStrategy"]
    commands = set()
    for td in ecs.props("AWS::ECS::TaskDefinition"):
        c = td["ContainerDefinitions"][0]
        commands.add(" ".join(c["Command"]))
        assert c["ResourceRequirements"] == [{"Type": "GPU", "Value": "1"}]
        assert c["StopTimeout"] == 120
        env = {e["Name"]: e["Value"] for e in c["Environment"]}
        assert float(env["ASYNCINFER_DRAIN_SECONDS"]) < c["StopTimeout"]
        assert "ASYNCINFER_RESOURCE_PREFIX" in env and "ASYNCINFER_TABLE" in env
    assert commands == {f"worker --model {m}" for m in MODELS}


def test_task_role_may_protect_its_task_from_scale_in(ecs: Any) -> None:
    actions = set()
    for p in ecs.props("AWS::IAM::Policy"):
        for st in p["PolicyDocument"]["Statement"]:
            a = st["Action"]
            actions.update(a if isinstance(a, list) else [a])
    assert "ecs:UpdateTaskProtection" in actions


def test_service_scaling_min_zero_target_tracking_on_backlog_per_task(ecs: Any) -> None:
    targets = ecs.props("AWS::ApplicationAutoScaling::ScalableTarget")
    assert len(targets) == len(MODELS)
    for t in targets:
        assert t["MinCapacity"] == 0
        assert t["MaxCapacity"] == 2
        assert t["ScalableDimension"] == "ecs:service:DesiredCount"
    policies = ecs.props("AWS::ApplicationAutoScaling::ScalingPolicy")
    tracking = [p for p in policies if p["PolicyType"] == "TargetTrackingScaling"]
    assert len(tracking) == len(MODELS)
    for p in tracking:
        cfg = p["TargetTrackingScalingPolicyConfiguration"]
        assert cfg["TargetValue"] == 20
        spec = cfg["CustomizedMetricSpecification"]
        assert (spec["Namespace"], spec["MetricName"]) == ("asyncinfer", "BacklogPerTask")


def test_step_policy_takes_a_service_from_zero_to_one(ecs: Any) -> None:
    steps = [
        p
        for p in ecs.props("AWS::ApplicationAutoScaling::ScalingPolicy")
        if p["PolicyType"] == "StepScaling"
        and any(
            a.get("ScalingAdjustment") == 1
            for a in p["StepScalingPolicyConfiguration"]["StepAdjustments"]
        )
    ]
    assert len(steps) == len(MODELS)
    alarms = [
        a
        for a in ecs.props("AWS::CloudWatch::Alarm")
        if a.get("MetricName") == "BacklogWithoutCapacity"
    ]
    assert len(alarms) >= len(MODELS)


def test_backlog_metric_lambda_runs_every_minute(ecs: Any) -> None:
    rules = ecs.props("AWS::Events::Rule")
    # the backlog metric and the expiry sweeper
    assert [r["ScheduleExpression"] for r in rules] == ["rate(1 minute)"] * 2
    fn = next(
        f
        for f in ecs.props("AWS::Lambda::Function")
        if f.get("Environment", {}).get("Variables", {}).get("POWERTOOLS_SERVICE_NAME")
        == "backlog-metric"
    )
    env = fn["Environment"]["Variables"]
    assert {
        "ASYNCINFER_ECS_CLUSTER",
        "ASYNCINFER_RESOURCE_PREFIX",
        "ASYNCINFER_QUEUE_URL_BASE",
        "ASYNCINFER_MODELS",
    } <= set(env)
    assert env["ASYNCINFER_COMPUTE"] == "ecs"
    statements = [
        st for p in ecs.props("AWS::IAM::Policy") for st in p["PolicyDocument"]["Statement"]
    ]
    assert any(st["Action"] == "ecs:DescribeServices" for st in statements)
    assert any(st["Action"] == "sqs:GetQueueAttributes" for st in statements)


def test_workers_in_public_subnets_without_nat_or_inbound_rules(ecs: Any) -> None:
    ecs.assertions.resource_count_is("AWS::EC2::NatGateway", 0)
    for sg in ecs.props("AWS::EC2::SecurityGroup"):
        assert not sg.get("SecurityGroupIngress")
    assert ecs.props("AWS::EC2::FlowLog")


def test_no_sagemaker_resources(ecs: Any) -> None:
    assert not ecs.resources("AWS::SageMaker::Endpoint")
    assert "sagemaker" not in json.dumps(ecs.props("AWS::Lambda::Function")).lower()


def test_sweeper_may_resend_messages_of_lost_hand_backs(ecs: Any) -> None:
    """The sweeper sends the message of a job handed back whose message was lost again
    (``sweeper.resend_lost``, issue 14), a worker's job as well: it may send to every job queue
    in compute=ecs too. Before, only the SageMaker backend granted it, and each re-send of a
    worker's job was AccessDenied (logged), leaving the job queued for ever."""
    sweeper_role = next(
        r["Properties"]["Role"]["Fn::GetAtt"][0]
        for r in ecs.resources("AWS::Lambda::Function").values()
        if "expiry sweeper" in r["Properties"].get("Description", "")
    )
    send_to = [
        json.dumps(st["Resource"])
        for p in ecs.props("AWS::IAM::Policy")
        if {"Ref": sweeper_role} in p["Roles"]
        for st in p["PolicyDocument"]["Statement"]
        if "sqs:SendMessage" in (st["Action"] if isinstance(st["Action"], list) else [st["Action"]])
    ]
    # Every job queue of the deployment, by the naming rule's pattern (as the API's grant).
    assert any(f"{naming.JOBS_INFIX}*" in r for r in send_to), send_to
