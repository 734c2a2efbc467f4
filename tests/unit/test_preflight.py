"""``asyncinfer preflight``: moto for IAM, EC2, CloudFormation and SSM; botocore's Stubber for
Service Quotas and Lambda's account settings, which moto does not serve. Never calls AWS."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.stub import Stubber
from moto import mock_aws

from asyncinfer.aws import preflight
from asyncinfer.aws.preflight import Check, Plan

ROOT = Path(__file__).resolve().parents[2]
REGION = "us-east-1"
ECS_PLAN = Plan(
    compute="ecs", instance_type="g5.xlarge", max_workers=2, models=3, reserved_concurrency=16
)
SM_PLAN = Plan(
    compute="sagemaker", instance_type="g5.xlarge", max_workers=2, models=3, reserved_concurrency=36
)


@pytest.fixture
def aws(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for var in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.setenv(var, "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", REGION)
    with mock_aws():
        yield


def _quotas(*responses: tuple[str, dict[str, Any]]) -> tuple[Any, Stubber]:
    client = boto3.client("service-quotas", region_name=REGION)
    stub = Stubber(client)
    for method, resp in responses:
        stub.add_response(method, resp)
    stub.activate()
    return client, stub


def _ec2_quota(value: float) -> tuple[str, dict[str, Any]]:
    return (
        "get_service_quota",
        {"Quota": {"QuotaCode": "L-DB2E81BA", "ServiceCode": "ec2", "Value": value}},
    )


def test_ecs_gpu_quota_counts_vcpus_of_every_worker(aws: None) -> None:
    ec2 = boto3.client("ec2", region_name=REGION)
    quotas, _ = _quotas(_ec2_quota(0.0))
    [c] = preflight.check_gpu_quota(ECS_PLAN, quotas=quotas, ec2=ec2)
    assert c.status == "fail"
    assert "need 24" in c.detail  # 2 workers x 3 models x 4 vCPUs (g5.xlarge)
    assert "L-DB2E81BA" in c.fix
    quotas, _ = _quotas(_ec2_quota(32.0))
    [c] = preflight.check_gpu_quota(ECS_PLAN, quotas=quotas, ec2=ec2)
    assert c.status == "ok"


def test_sagemaker_quota_is_the_endpoint_instance_count(aws: None) -> None:
    page = {
        "Quotas": [
            {
                "QuotaName": "ml.g5.xlarge for endpoint usage",
                "QuotaCode": "L-1928E07B",
                "Value": 0.0,
            },
            {"QuotaName": "ml.g5.2xlarge for endpoint usage", "QuotaCode": "L-X", "Value": 10.0},
        ]
    }
    quotas, _ = _quotas(("list_service_quotas", page))
    [c] = preflight.check_gpu_quota(SM_PLAN, quotas=quotas)
    assert (c.status, "need 6" in c.detail, "L-1928E07B" in c.fix) == ("fail", True, True)


CATALOGUE3 = "models_file=tests/infra/fixtures/catalogue3/models.yaml"


def test_ecs_quotas_add_up_vcpus_per_family_over_the_catalogue(aws: None) -> None:
    plan = preflight.plan_from_context([CATALOGUE3], ROOT)
    assert plan.workers == (
        ("llama-s3", "g6.2xlarge", 3),
        ("encoder-s3", "g5.xlarge", 4),
        ("cpu-echo", "c7i.large", 2),
    )
    ec2 = boto3.client("ec2", region_name=REGION)
    standard = {"QuotaCode": "L-1216C47A", "ServiceCode": "ec2", "Value": 4.0}
    quotas, stub = _quotas(_ec2_quota(32.0), ("get_service_quota", {"Quota": standard}))
    g, cpu = preflight.check_gpu_quota(plan, quotas=quotas, ec2=ec2)
    stub.assert_no_pending_responses()
    # G and VT: 3 x 8 vCPUs (g6.2xlarge) + 4 x 4 vCPUs (g5.xlarge); standard: 2 x 2 (c7i.large)
    assert (g.status, "need 40" in g.detail, "L-DB2E81BA" in g.fix) == ("fail", True, True)
    assert "llama-s3" in g.detail and "encoder-s3" in g.detail and "cpu-echo" not in g.detail
    assert (cpu.status, "need 4" in cpu.detail, "L-1216C47A" in cpu.fix) == ("ok", True, True)


def test_explicit_context_overrides_every_catalogue_entry(aws: None) -> None:
    plan = preflight.plan_from_context([CATALOGUE3, "max_workers=1"], ROOT)
    assert [w for _, _, w in plan.workers] == [1, 1, 1]
    ec2 = boto3.client("ec2", region_name=REGION)
    standard = {"QuotaCode": "L-1216C47A", "ServiceCode": "ec2", "Value": 0.0}
    quotas, _ = _quotas(_ec2_quota(12.0), ("get_service_quota", {"Quota": standard}))
    g, cpu = preflight.check_gpu_quota(plan, quotas=quotas, ec2=ec2)
    assert (g.status, "need 12" in g.detail) == ("ok", True)  # 1 x 8 + 1 x 4
    assert (cpu.status, "need 2" in cpu.detail) == ("fail", True)


def test_sagemaker_quotas_count_endpoint_instances_per_type_over_the_catalogue() -> None:
    plan = preflight.plan_from_context([CATALOGUE3, "compute=sagemaker"], ROOT)
    page = {
        "Quotas": [
            {"QuotaName": "ml.g6.2xlarge for endpoint usage", "QuotaCode": "L-A", "Value": 3.0},
            {"QuotaName": "ml.g5.xlarge for endpoint usage", "QuotaCode": "L-B", "Value": 2.0},
            {"QuotaName": "ml.c7i.large for endpoint usage", "QuotaCode": "L-C", "Value": 2.0},
        ]
    }
    quotas, _ = _quotas(("list_service_quotas", page))
    checks = preflight.check_gpu_quota(plan, quotas=quotas)
    by_type = {c.detail.split("'")[1]: c for c in checks}
    assert by_type["ml.g6.2xlarge for endpoint usage"].status == "ok"
    g5 = by_type["ml.g5.xlarge for endpoint usage"]
    assert (g5.status, "need 4" in g5.detail, "L-B" in g5.fix) == ("fail", True, True)
    assert by_type["ml.c7i.large for endpoint usage"].status == "ok"


def test_missing_ecs_service_linked_role_fails_with_the_command(aws: None) -> None:
    iam = boto3.client("iam", region_name=REGION)
    checks = {c.name: c for c in preflight.check_service_linked_roles("ecs", iam=iam)}
    ecs = checks["role AWSServiceRoleForECS"]
    assert ecs.status == "fail"
    assert ecs.fix == "aws iam create-service-linked-role --aws-service-name ecs.amazonaws.com"
    # moto names service-linked roles its own way; create the role with the name AWS gives it
    iam.create_role(
        RoleName="AWSServiceRoleForECS",
        Path="/aws-service-role/ecs.amazonaws.com/",
        AssumeRolePolicyDocument="{}",
    )
    checks = {c.name: c for c in preflight.check_service_linked_roles("ecs", iam=iam)}
    assert checks["role AWSServiceRoleForECS"].status == "ok"
    sm = preflight.check_service_linked_roles("sagemaker", iam=iam)
    assert [c.name for c in sm] == [
        "role AWSServiceRoleForApplicationAutoScaling_SageMakerEndpoint"
    ]


def test_lambda_concurrency_must_leave_100_unreserved() -> None:
    client = boto3.client("lambda", region_name=REGION)
    stub = Stubber(client)
    stub.add_response("get_account_settings", {"AccountLimit": {"ConcurrentExecutions": 10}})
    stub.add_response("get_account_settings", {"AccountLimit": {"ConcurrentExecutions": 1000}})
    with stub:
        new_account = preflight.check_lambda_concurrency(36, lambda_=client)
        usual = preflight.check_lambda_concurrency(36, lambda_=client)
    assert new_account.status == "fail" and "need 136" in new_account.detail
    assert "_reserved_concurrency" in new_account.fix
    assert usual.status == "ok"


def test_bootstrap_stack_and_version(aws: None) -> None:
    cfn = boto3.client("cloudformation", region_name=REGION)
    ssm = boto3.client("ssm", region_name=REGION)
    assert preflight.check_bootstrap(cloudformation=cfn, ssm=ssm).status == "fail"
    template = {"Resources": {"Topic": {"Type": "AWS::SNS::Topic"}}}
    cfn.create_stack(StackName="CDKToolkit", TemplateBody=json.dumps(template))
    missing = preflight.check_bootstrap(cloudformation=cfn, ssm=ssm)
    assert missing.status == "fail" and "version" in missing.detail
    ssm.put_parameter(Name=preflight.BOOTSTRAP_VERSION_PARAMETER, Value="5", Type="String")
    assert "too old" in preflight.check_bootstrap(cloudformation=cfn, ssm=ssm).detail
    ssm.put_parameter(
        Name=preflight.BOOTSTRAP_VERSION_PARAMETER, Value="28", Type="String", Overwrite=True
    )
    assert preflight.check_bootstrap(cloudformation=cfn, ssm=ssm).status == "ok"


def test_docker_needs_the_cli_and_a_daemon() -> None:
    def run(code: int, out: str = "", err: str = "") -> Any:
        return lambda cmd: subprocess.CompletedProcess(cmd, code, out, err)

    assert preflight.check_docker(which=lambda _: None).status == "fail"
    down = preflight.check_docker(which=lambda _: "/usr/bin/docker", run=run(1, err="no daemon"))
    assert down.status == "fail" and "no daemon" in down.detail
    up = preflight.check_docker(which=lambda _: "/usr/bin/docker", run=run(0, "27.1.1\n"))
    assert up.status == "ok" and "27.1.1" in up.detail


def test_a_refused_check_warns_and_the_others_still_run(aws: None) -> None:
    quotas, _ = _quotas()  # no stubbed response: the call raises
    lam = boto3.client("lambda", region_name=REGION)
    stub = Stubber(lam)
    stub.add_response("get_account_settings", {"AccountLimit": {"ConcurrentExecutions": 1000}})
    stub.activate()
    clients = {
        "service-quotas": quotas,
        "ec2": boto3.client("ec2", region_name=REGION),
        "iam": boto3.client("iam", region_name=REGION),
        "lambda": lam,
        "cloudformation": boto3.client("cloudformation", region_name=REGION),
        "ssm": boto3.client("ssm", region_name=REGION),
    }
    checks = preflight.run_checks(ECS_PLAN, clients, docker=lambda: Check("Docker", "ok", "x"))
    by_name = {c.name: c for c in checks}
    assert by_name["GPU quota"].status == "warn"
    assert by_name["Lambda concurrency"].status == "ok"
    assert by_name["CDK bootstrap"].status == "fail"
    assert "[FAIL] CDK bootstrap" in preflight.render(checks)


def test_plan_follows_the_cdk_context_of_the_checkout() -> None:
    plan = preflight.plan_from_context(["compute=sagemaker", "max_workers=3"], ROOT)
    assert (plan.compute, plan.max_workers, plan.instance_type) == ("sagemaker", 3, "g5.xlarge")
    assert plan.reserved_concurrency == 5 + 10 + 1 + 10 + 10
    assert preflight.plan_from_context([], ROOT).reserved_concurrency == 16  # no bridge/completion
    with pytest.raises(ValueError):
        preflight.plan_from_context(["compute"], ROOT)


def test_cli_has_the_preflight_command() -> None:
    from asyncinfer.cli import build_parser

    args = build_parser().parse_args(["preflight", "-c", "compute=ecs", "--region", "eu-west-1"])
    assert args.context == ["compute=ecs"] and args.region == "eu-west-1"
