"""The defects of a first deploy that synth, cfn-lint and cdk-nag do not catch (issue 19) and the
infrastructure items of issue 14 (behaviours 7 and 8): one test per property."""

from __future__ import annotations

import json
from typing import Any

from asyncinfer.core import job_metrics
from infra.components.function import powertools_version


def _statements(s: Any) -> list[dict[str, Any]]:
    return [st for p in s.props("AWS::IAM::Policy") for st in p["PolicyDocument"]["Statement"]]


def _fn(s: Any, service: str) -> dict[str, Any]:
    return next(
        f
        for f in s.props("AWS::Lambda::Function")
        if f.get("Environment", {}).get("Variables", {}).get("POWERTOOLS_SERVICE_NAME") == service
    )


# ------------------------------------------------------------------ 1. deploy failures


def test_ecs_services_depend_on_the_capacity_provider_association(ecs: Any) -> None:
    (association,) = ecs.resources("AWS::ECS::ClusterCapacityProviderAssociations")
    services = ecs.resources("AWS::ECS::Service")
    assert services
    for service in services.values():
        assert association in service.get("DependsOn", [])


def test_nested_model_stacks_depend_on_the_capacity_provider_association(ecs50: Any) -> None:
    (association,) = ecs50.resources("AWS::ECS::ClusterCapacityProviderAssociations")
    nested = [
        r for r in ecs50.template["Resources"].values() if r["Type"] == "AWS::CloudFormation::Stack"
    ]
    assert len(nested) == 50
    for r in nested:
        assert association in r.get("DependsOn", [])


# ------------------------------------------------------------------ 2. runtime failures


def test_sagemaker_endpoint_role_reads_uploads(sagemaker: Any) -> None:
    role = next(
        k
        for k, r in sagemaker.resources("AWS::IAM::Role").items()
        if "sagemaker.amazonaws.com" in json.dumps(r["Properties"]["AssumeRolePolicyDocument"])
    )
    policies = [
        p for p in sagemaker.props("AWS::IAM::Policy") if {"Ref": role} in p.get("Roles", [])
    ]
    reads = json.dumps(
        [
            st["Resource"]
            for p in policies
            for st in p["PolicyDocument"]["Statement"]
            if "s3:GetObject*" in st["Action"]
        ]
    )
    assert "/uploads/*" in reads and "/inputs/*" in reads


def test_failure_rate_alarm_reads_the_metrics_as_the_code_emits_them(any_mode: Any) -> None:
    """Same namespace, names and dimension set as asyncinfer.core.job_metrics (which the completion
    Lambda and the worker use): CloudWatch matches all dimensions."""
    alarms = [
        a
        for a in any_mode.props("AWS::CloudWatch::Alarm")
        if "jobs failed" in a.get("AlarmDescription", "")
    ]
    assert alarms
    for a in alarms:
        stats = [m["MetricStat"]["Metric"] for m in a["Metrics"] if "MetricStat" in m]
        assert {m["MetricName"] for m in stats} == {
            job_metrics.JOBS_SUCCEEDED,
            job_metrics.JOBS_FAILED,
        }
        for m in stats:
            assert m["Namespace"] == job_metrics.NAMESPACE
            assert [d["Name"] for d in m["Dimensions"]] == [job_metrics.DIMENSION]


def test_alarm_topic_policy_lets_cloudwatch_of_this_account_publish(sagemaker: Any) -> None:
    allows = [
        st
        for p in sagemaker.props("AWS::SNS::TopicPolicy")
        for st in p["PolicyDocument"]["Statement"]
        if st["Effect"] == "Allow"
        and st.get("Principal", {}).get("Service") == "cloudwatch.amazonaws.com"
    ]
    assert len(allows) == 1
    assert allows[0]["Action"] == "sns:Publish"
    assert allows[0]["Condition"] == {
        "StringEquals": {"aws:SourceAccount": {"Ref": "AWS::AccountId"}}
    }


def test_lambdas_load_the_layer_of_the_powertools_the_tests_run(any_mode: Any) -> None:
    params = any_mode.template["Parameters"]
    for f in any_mode.props("AWS::Lambda::Function"):
        if f.get("Handler") != "app.handler":
            continue
        (layer,) = f["Layers"]
        assert params[layer["Ref"]]["Type"] == "AWS::SSM::Parameter::Value<String>"
        assert params[layer["Ref"]]["Default"] == (
            f"/aws/service/powertools/python/arm64/python3.12/{powertools_version()}"
        )


def test_a_pinned_layer_uses_the_publishing_account_of_the_partition(ecs50: Any) -> None:
    mapping = ecs50.template["Mappings"]["PowertoolsAccounts"]
    assert mapping["aws"] == {"account": "017000801446"}
    layers = json.dumps([f.get("Layers") for f in ecs50.props("AWS::Lambda::Function")])
    assert "Fn::FindInMap" in layers and "AWS::Partition" in layers
    assert "AWSLambdaPowertoolsPythonV3-python312-arm64:27" in layers


# ------------------------------------------------------------------ 3. teardown


def test_data_not_retained_is_emptied_and_deleted_with_the_stack(ecs50: Any) -> None:
    buckets = ecs50.resources("AWS::S3::Bucket")
    assert buckets and all(b["DeletionPolicy"] == "Delete" for b in buckets.values())
    assert len(ecs50.resources("Custom::S3AutoDeleteObjects")) == len(buckets)
    (table,) = ecs50.resources("AWS::DynamoDB::Table").values()
    assert table["DeletionPolicy"] == "Delete"
    assert table["Properties"].get("DeletionProtectionEnabled") is False


def test_retained_data_has_no_auto_delete(any_mode: Any) -> None:
    assert not any_mode.resources("Custom::S3AutoDeleteObjects")


# ------------------------------------------------------------------ 4. idle cost, log retention


def test_log_groups_made_outside_cdk_get_a_retention(any_mode: Any) -> None:
    groups = any_mode.props("AWS::Logs::LogGroup")
    execution = [g for g in groups if "API-Gateway-Execution-Logs_" in json.dumps(g)]
    assert len(execution) == 1 and execution[0]["RetentionInDays"] == 30
    if any_mode.mode == "sagemaker":
        names = {e["EndpointName"] for e in any_mode.props("AWS::SageMaker::Endpoint")}
        named = {g["LogGroupName"] for g in groups if isinstance(g.get("LogGroupName"), str)}
        assert {f"/aws/sagemaker/Endpoints/{n}" for n in names} <= named


def test_optional_idle_costs_are_settings(ecs: Any, ecs50: Any) -> None:
    (cluster,) = ecs.props("AWS::ECS::Cluster")
    assert cluster["ClusterSettings"] == [{"Name": "containerInsights", "Value": "disabled"}]
    assert len(ecs.resources("AWS::CloudWatch::Dashboard")) == 1
    assert not ecs50.resources("AWS::CloudWatch::Dashboard")  # dashboard=false


# ------------------------------------------------------------------ 5. hygiene


def test_sagemaker_scalable_targets_use_the_service_linked_role(sagemaker: Any) -> None:
    targets = sagemaker.props("AWS::ApplicationAutoScaling::ScalableTarget")
    assert targets
    for t in targets:
        assert "AWSServiceRoleForApplicationAutoScaling_SageMakerEndpoint" in json.dumps(
            t["RoleARN"]
        )
    assert not [
        r
        for r in sagemaker.props("AWS::IAM::Role")
        if "application-autoscaling" in json.dumps(r["AssumeRolePolicyDocument"])
    ]


def test_ssm_access_for_gpu_instances_is_off_by_default(ecs: Any, ecs50: Any) -> None:
    assert "AmazonSSMManagedInstanceCore" not in json.dumps(ecs.props("AWS::IAM::Role"))
    assert "AmazonSSMManagedInstanceCore" in json.dumps(ecs50.props("AWS::IAM::Role"))


# ------------------------------------------------------------------ issue 14: 7 and 8


def test_internal_functions_have_reserved_concurrency(any_mode: Any) -> None:
    expected = {"dlq": 5, "sweeper": 1, "asyncinfer-webhooks": 10}
    if any_mode.mode == "sagemaker":
        expected |= {"sagemaker-bridge": 10, "sagemaker-completion": 10}
    for service, n in expected.items():
        assert _fn(any_mode, service)["ReservedConcurrentExecutions"] == n, service
    assert "ReservedConcurrentExecutions" not in _fn(any_mode, "api")


def test_kms_service_principals_carry_a_source_account_condition(any_mode: Any) -> None:
    for key in any_mode.props("AWS::KMS::Key"):
        for st in key["KeyPolicy"]["Statement"]:
            if "Service" in st.get("Principal", {}):
                cond = json.dumps(st.get("Condition", {}))
                assert "aws:SourceAccount" in cond or "aws:SourceArn" in cond, st


def test_waf_has_a_rate_based_rule(any_mode: Any) -> None:
    (acl,) = any_mode.props("AWS::WAFv2::WebACL")
    rule = next(r for r in acl["Rules"] if "RateBasedStatement" in r["Statement"])
    assert rule["Statement"]["RateBasedStatement"]["Limit"] == 2000
    assert rule["Statement"]["RateBasedStatement"]["AggregateKeyType"] == "IP"
    assert rule["Action"]["Block"]["CustomResponse"]["ResponseCode"] == 429


def test_gpu_instances_require_imdsv2_with_hop_limit_1(ecs: Any) -> None:
    (lt,) = ecs.props("AWS::EC2::LaunchTemplate")
    options = lt["LaunchTemplateData"]["MetadataOptions"]
    assert options["HttpTokens"] == "required"
    assert options["HttpPutResponseHopLimit"] == 1


def test_workers_delete_nothing_outside_their_outputs(ecs: Any) -> None:
    task_roles = {
        k
        for k, r in ecs.resources("AWS::IAM::Role").items()
        if "ecs-tasks.amazonaws.com" in json.dumps(r["Properties"]["AssumeRolePolicyDocument"])
    }
    assert task_roles
    deletes = []
    for p in ecs.props("AWS::IAM::Policy"):
        if not any(r.get("Ref") in task_roles for r in p.get("Roles", [])):
            continue
        for st in p["PolicyDocument"]["Statement"]:
            actions = st["Action"] if isinstance(st["Action"], list) else [st["Action"]]
            if any(a.startswith("s3:Delete") for a in actions):
                res = st["Resource"] if isinstance(st["Resource"], list) else [st["Resource"]]
                deletes.extend(res)
    assert deletes
    for r in deletes:
        assert json.dumps(r).endswith('/outputs/*"]]}'), r


def test_ecs_stack_deletion_releases_the_protected_gpu_instances(ecs: Any) -> None:
    """Managed termination protection would hang the group's deletion (aws-cdk 18179): a
    custom resource, deleted after the services and before the group, releases it."""
    (rid, release) = next(iter(ecs.resources("Custom::EcsCapacityRelease").items()))
    (asg,) = ecs.resources("AWS::AutoScaling::AutoScalingGroup")
    assert asg in release["DependsOn"]
    assert release["Properties"]["AutoScalingGroupName"] == {"Ref": asg}
    for service in ecs.resources("AWS::ECS::Service").values():
        assert rid in service["DependsOn"]
    fn = ecs.template["Resources"][release["Properties"]["ServiceToken"]["Fn::GetAtt"][0]]
    assert fn["Properties"]["Handler"] == "app.handler"
    actions = {
        a
        for st in _statements(ecs)
        for a in (st["Action"] if isinstance(st["Action"], list) else [st["Action"]])
    }
    assert {"autoscaling:UpdateAutoScalingGroup", "autoscaling:SetInstanceProtection"} <= actions


def test_topic_key_is_scheduled_for_deletion_with_the_stack(any_mode: Any) -> None:
    """CDK keeps KMS keys by default; this one encrypts messages in flight only."""
    (key,) = [
        k
        for k in any_mode.resources("AWS::KMS::Key").values()
        if k["Properties"].get("Description") == "asyncinfer SNS topics"
    ]
    assert key["DeletionPolicy"] == "Delete"
    assert key["Properties"]["PendingWindowInDays"] == 7


def test_worker_environments_do_not_add_a_service_dimension(any_mode: Any) -> None:
    """The worker's job metrics go through Powertools, which adds a ``service`` dimension when
    POWERTOOLS_SERVICE_NAME is set; the alarms read {Model} only, so workers must not set it."""
    envs = [
        {e["Name"] for e in td["ContainerDefinitions"][0]["Environment"]}
        for td in any_mode.props("AWS::ECS::TaskDefinition")
    ] + [set(m["PrimaryContainer"]["Environment"]) for m in any_mode.props("AWS::SageMaker::Model")]
    assert envs
    for env in envs:
        assert "POWERTOOLS_SERVICE_NAME" not in env
