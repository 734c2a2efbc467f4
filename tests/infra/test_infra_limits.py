"""The limits AWS enforces at deploy time that ``cdk synth``, cfn-lint and cdk-nag do not check,
on both modes with the default catalogue and with a 50-model catalogue (issue 19, 1)."""

from __future__ import annotations

import json
from typing import Any

#: Stand-in lengths of values known only at deploy time, at least as long as AWS makes them.
PSEUDO = {
    "AWS::Region": "x" * 14,  # ap-southeast-3
    "AWS::AccountId": "0" * 12,
    "AWS::URLSuffix": "amazonaws.com.cn",
    "AWS::Partition": "aws-us-gov",
    "AWS::StackName": "x" * 64,
}
REF_LEN = 128  # a generated physical name, queue URL or topic ARN
GETATT_LEN = 160  # an ARN

#: SageMaker CreateModel: each ContainerDefinition environment value is at most 1,024 bytes
#: (SageMaker API reference, ContainerDefinition.Environment).
SAGEMAKER_ENV_VALUE_MAX = 1024
#: Lambda: "the total size of all environment variables doesn't exceed 4 KB" (Lambda quotas).
LAMBDA_ENV_MAX = 4096
#: CloudFormation: at most 500 resources per stack (CloudFormation quotas).
CFN_MAX_RESOURCES = 500


def resolve(value: Any) -> str:
    """A deploy-time value as a string of at least its real length."""
    if isinstance(value, str):
        return value
    if isinstance(value, int | float | bool):
        return json.dumps(value)
    if isinstance(value, dict) and len(value) == 1:
        ((fn, arg),) = value.items()
        if fn == "Ref":
            return PSEUDO.get(arg, "r" * REF_LEN)
        if fn == "Fn::Join":
            sep, parts = arg
            return sep.join(resolve(p) for p in parts)
    return "g" * GETATT_LEN


def lambda_environments(s: Any) -> dict[str, dict[str, str]]:
    """Function description -> resolved environment of each of our functions."""
    return {
        f.get("Description", ""): {
            k: resolve(v) for k, v in f.get("Environment", {}).get("Variables", {}).items()
        }
        for f in s.props("AWS::Lambda::Function")
        if f.get("Handler") == "app.handler"
    }


def test_every_lambda_environment_fits_in_4_kb(every_synth: Any) -> None:
    envs = lambda_environments(every_synth)
    assert len(envs) >= 5
    for name, env in envs.items():
        size = len(json.dumps(env, separators=(",", ":")).encode())
        assert size <= LAMBDA_ENV_MAX, f"{every_synth.mode} {name}: {size} bytes"


def test_every_sagemaker_environment_value_fits_in_1024_bytes(every_synth: Any) -> None:
    models = every_synth.props("AWS::SageMaker::Model")
    if every_synth.mode.startswith("ecs"):
        assert not models
        return
    assert len(models) >= 3
    for m in models:
        for key, value in m["PrimaryContainer"]["Environment"].items():
            size = len(resolve(value).encode())
            assert size <= SAGEMAKER_ENV_VALUE_MAX, f"{key}: {size} bytes"


def test_no_environment_carries_a_per_model_map(every_synth: Any) -> None:
    """Nothing in any environment grows with the catalogue except the model list itself."""
    for env in lambda_environments(every_synth).values():
        assert "ASYNCINFER_QUEUE_URLS" not in env
        assert "ASYNCINFER_ECS_SERVICES" not in env
        assert "ASYNCINFER_SAGEMAKER_ENDPOINTS" not in env
    for td in every_synth.props("AWS::ECS::TaskDefinition"):
        names = {e["Name"] for e in td["ContainerDefinitions"][0]["Environment"]}
        assert "ASYNCINFER_QUEUE_URLS" not in names


def test_the_50_model_catalogue_is_deployed_whole(ecs50: Any, sagemaker50: Any) -> None:
    assert len(ecs50.props("AWS::ECS::Service")) == 50
    assert len(sagemaker50.props("AWS::SageMaker::Endpoint")) == 50


def test_default_catalogue_fits_cloudformation_resource_quota(any_mode: Any) -> None:
    assert len(any_mode.template["Resources"]) <= CFN_MAX_RESOURCES


#: CloudFormation quotas: template body in S3 1 MB; 200 parameters and 200 outputs per template.
CFN_MAX_TEMPLATE_BYTES = 1_000_000
CFN_MAX_PARAMETERS = 200
CFN_MAX_OUTPUTS = 200


def test_every_template_fits_cloudformation_quotas(every_synth: Any) -> None:
    templates = [every_synth.template_path, *every_synth.outdir.glob("*.nested.template.json")]
    for path in templates:
        body = path.read_text()
        t = json.loads(body)
        assert len(body.encode()) <= CFN_MAX_TEMPLATE_BYTES, path.name
        assert len(t["Resources"]) <= CFN_MAX_RESOURCES, path.name
        assert len(t.get("Parameters", {})) <= CFN_MAX_PARAMETERS, path.name
        assert len(t.get("Outputs", {})) <= CFN_MAX_OUTPUTS, path.name


#: IAM: the inline policies of a role add up to at most 10,240 characters, whitespace not
#: counted (IAM quotas, "Role policy size"); a managed policy to 6,144.
IAM_ROLE_INLINE_MAX = 10_240
IAM_MANAGED_MAX = 6_144


def _deep(value: Any) -> Any:
    if isinstance(value, dict):
        if len(value) == 1 and next(iter(value)) in ("Ref", "Fn::Join", "Fn::GetAtt", "Fn::Sub"):
            return resolve(value)
        return {k: _deep(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_deep(v) for v in value]
    return value


def _size(doc: Any) -> int:
    return len(json.dumps(_deep(doc), separators=(",", ":")))


def test_role_policies_fit_iam_size_limits(every_synth: Any) -> None:
    per_role: dict[str, int] = {}
    for p in every_synth.props("AWS::IAM::Policy"):
        for role in p.get("Roles", []):
            key = json.dumps(role)
            per_role[key] = per_role.get(key, 0) + _size(p["PolicyDocument"])
    assert per_role
    for role, size in per_role.items():
        assert size <= IAM_ROLE_INLINE_MAX, f"{role}: {size} characters"
    for p in every_synth.props("AWS::IAM::ManagedPolicy"):
        assert _size(p["PolicyDocument"]) <= IAM_MANAGED_MAX
