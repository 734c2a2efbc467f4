"""compute=sagemaker: async endpoints from the worker image, bridge and completion Lambdas,
scaling to zero as AWS documents for asynchronous endpoints."""

from __future__ import annotations

import json
from typing import Any

from asyncinfer.models.registry import MODELS


def test_one_model_per_model_id_from_the_worker_image(sagemaker: Any) -> None:
    models = sagemaker.props("AWS::SageMaker::Model")
    assert len(models) == len(MODELS)
    served = set()
    for m in models:
        env = m["PrimaryContainer"]["Environment"]
        served.add(env["ASYNCINFER_MODELS"])
        assert "ASYNCINFER_TABLE" in env
        assert "Image" in m["PrimaryContainer"]
    assert served == set(MODELS)


def test_endpoint_config_is_async_with_outputs_failures_and_notifications(sagemaker: Any) -> None:
    configs = sagemaker.props("AWS::SageMaker::EndpointConfig")
    assert len(configs) == len(MODELS)
    for c in configs:
        a = c["AsyncInferenceConfig"]
        out = a["OutputConfig"]
        assert "outputs/sagemaker/" in json.dumps(out["S3OutputPath"])
        assert "outputs/sagemaker-failures/" in json.dumps(out["S3FailurePath"])
        assert set(out["NotificationConfig"]) == {"SuccessTopic", "ErrorTopic"}
        assert out["NotificationConfig"]["SuccessTopic"] != out["NotificationConfig"]["ErrorTopic"]
        assert a["ClientConfig"]["MaxConcurrentInvocationsPerInstance"] == 4
        assert c["ProductionVariants"][0]["InstanceType"] == "ml.g5.xlarge"


def test_scaling_min_zero_backlog_tracking_and_zero_to_one_step(sagemaker: Any) -> None:
    targets = sagemaker.props("AWS::ApplicationAutoScaling::ScalableTarget")
    assert len(targets) == len(MODELS)
    for t in targets:
        assert t["MinCapacity"] == 0
        assert t["ScalableDimension"] == "sagemaker:variant:DesiredInstanceCount"
        assert t["ServiceNamespace"] == "sagemaker"
    policies = sagemaker.props("AWS::ApplicationAutoScaling::ScalingPolicy")
    tracking = [p for p in policies if p["PolicyType"] == "TargetTrackingScaling"]
    assert len(tracking) == len(MODELS)
    for p in tracking:
        spec = p["TargetTrackingScalingPolicyConfiguration"]["CustomizedMetricSpecification"]
        assert (spec["Namespace"], spec["MetricName"]) == (
            "AWS/SageMaker",
            "ApproximateBacklogSizePerInstance",
        )
    step_alarms = [
        a
        for a in sagemaker.props("AWS::CloudWatch::Alarm")
        if a.get("MetricName") == "HasBacklogWithoutCapacity"
    ]
    assert len(step_alarms) >= len(MODELS)


def test_nothing_scales_on_invocations_per_instance(sagemaker: Any) -> None:
    """Async endpoints do not publish InvocationsPerInstance (SageMaker developer guide)."""
    scaling = json.dumps(sagemaker.props("AWS::ApplicationAutoScaling::ScalingPolicy"))
    alarms = [a.get("MetricName") for a in sagemaker.props("AWS::CloudWatch::Alarm")]
    assert "InvocationsPerInstance" not in scaling
    assert "PredefinedMetricSpecification" not in scaling
    assert "InvocationsPerInstance" not in alarms


def test_bridge_reads_every_model_queue_with_partial_batch_failures(sagemaker: Any) -> None:
    mappings = [
        m
        for m in sagemaker.props("AWS::Lambda::EventSourceMapping")
        if "BridgeFn" in str(m["FunctionName"])
    ]
    assert len(mappings) == 3 * len(MODELS)  # a queue per priority class
    for m in mappings:
        assert m["FunctionResponseTypes"] == ["ReportBatchItemFailures"]
    statements = [
        st for p in sagemaker.props("AWS::IAM::Policy") for st in p["PolicyDocument"]["Statement"]
    ]
    invoke = [st for st in statements if st["Action"] == "sagemaker:InvokeEndpointAsync"]
    assert len(invoke) == 1 and len(invoke[0]["Resource"]) == len(MODELS)


def test_completion_lambda_subscribes_to_success_and_error_topics(sagemaker: Any) -> None:
    subs = [s for s in sagemaker.props("AWS::SNS::Subscription") if s["Protocol"] == "lambda"]
    assert len(subs) == 2
    assert len({json.dumps(s["TopicArn"]) for s in subs}) == 2


def test_optional_waf_blocks_large_bodies_with_413(sagemaker: Any) -> None:
    acl = sagemaker.props("AWS::WAFv2::WebACL")[0]
    rule = next(r for r in acl["Rules"] if r["Name"] == "body-size-limit")
    assert rule["Action"]["Block"]["CustomResponse"]["ResponseCode"] == 413
    assert rule["Statement"]["SizeConstraintStatement"]["Size"] == 64 * 1024
    assert sagemaker.resources("AWS::WAFv2::WebACLAssociation")


def test_optional_alarm_topic_receives_alarms(sagemaker: Any) -> None:
    sagemaker.assertions.has_resource_properties(
        "AWS::SNS::Subscription", {"Protocol": "email", "Endpoint": "ops@example.com"}
    )
    mine = [a for a in sagemaker.props("AWS::CloudWatch::Alarm") if "AlarmDescription" in a]
    assert mine and all(a.get("AlarmActions") for a in mine)


def test_no_ecs_resources(sagemaker: Any) -> None:
    assert not sagemaker.resources("AWS::ECS::Cluster")
    assert not sagemaker.resources("AWS::EC2::VPC")


def test_completion_lambda_has_a_failure_destination(sagemaker: Any) -> None:
    """Notifications the completion Lambda could not apply after its retries are kept in an SQS
    queue (issue 14), encrypted and kept 14 days."""
    fn_id = next(
        k
        for k, r in sagemaker.resources("AWS::Lambda::Function").items()
        if "SageMaker notifications" in r["Properties"].get("Description", "")
    )
    configs = [
        c
        for c in sagemaker.props("AWS::Lambda::EventInvokeConfig")
        if c["FunctionName"] == {"Ref": fn_id}
    ]
    assert len(configs) == 1
    config = configs[0]
    assert config["MaximumRetryAttempts"] == 2
    assert config["MaximumEventAgeInSeconds"] == 6 * 3600
    target = config["DestinationConfig"]["OnFailure"]["Destination"]
    queue_id = target["Fn::GetAtt"][0]
    queue = sagemaker.resources("AWS::SQS::Queue")[queue_id]["Properties"]
    assert queue["SqsManagedSseEnabled"] is True
    assert queue["MessageRetentionPeriod"] == 14 * 24 * 3600


def test_sweeper_may_resend_messages_of_sagemaker_jobs(sagemaker: Any) -> None:
    """The sweeper sends the message of a SageMaker job it takes back again (issue 14)."""
    sweeper_role = next(
        r["Properties"]["Role"]["Fn::GetAtt"][0]
        for r in sagemaker.resources("AWS::Lambda::Function").values()
        if "expiry sweeper" in r["Properties"].get("Description", "")
    )
    actions = [
        a
        for p in sagemaker.props("AWS::IAM::Policy")
        if {"Ref": sweeper_role} in p["Roles"]
        for st in p["PolicyDocument"]["Statement"]
        for a in (st["Action"] if isinstance(st["Action"], list) else [st["Action"]])
    ]
    assert "sqs:SendMessage" in actions
