"""The webhook part of the stack: tenants' secrets (KMS ciphertexts in the job table) readable
only by the API and the dispatcher,
the dispatcher's reserved concurrency, and the queue and timeout values shared with the local
stack (one definition, asyncinfer.webhooks.queues)."""

from __future__ import annotations

from typing import Any

import pytest

from asyncinfer.webhooks import queues
from infra.components.webhooks import (
    DEFAULT_RESERVED_CONCURRENCY,
    SECRETS_ACTIONS,
    SECRETS_CONDITION,
)
from infra.config import DeployConfigError, load_config

API = "asyncinfer REST API"


def _secrets_key(s: Any) -> str:
    ids = [
        lid
        for lid, r in s.resources("AWS::KMS::Key").items()
        if "webhook signing secrets" in r["Properties"].get("Description", "")
    ]
    assert len(ids) == 1, ids
    return ids[0]


def _function_of_role(s: Any) -> dict[str, str]:
    """Role logical id -> the description of the Lambda function that uses it."""
    out = {}
    for r in s.resources("AWS::Lambda::Function").values():
        role = r["Properties"]["Role"]["Fn::GetAtt"][0]
        out[role] = r["Properties"].get("Description", "")
    return out


def _dispatcher(s: Any) -> dict[str, Any]:
    (fn,) = [
        p
        for p in s.props("AWS::Lambda::Function")
        if "webhook dispatcher" in p.get("Description", "")
    ]
    return fn


def test_secrets_key_rotates_and_is_retained(any_mode: Any) -> None:
    key = any_mode.resources("AWS::KMS::Key")[_secrets_key(any_mode)]
    assert key["Properties"]["EnableKeyRotation"] is True
    assert key.get("DeletionPolicy") == "Retain"  # retain_data defaults to true


def _crypto(actions: Any) -> set[str]:
    acts = actions if isinstance(actions, list) else [actions]
    return {
        a
        for a in acts
        if a in ("kms:*", "*")
        or a.split(":")[1].startswith(("Encrypt", "Decrypt", "ReEncrypt", "GenerateDataKey"))
    }


def test_key_policy_lets_only_the_api_and_the_dispatcher_use_the_secrets_key(any_mode: Any) -> None:
    lid = _secrets_key(any_mode)
    role_fn = _function_of_role(any_mode)
    statements = any_mode.resources("AWS::KMS::Key")[lid]["Properties"]["KeyPolicy"]["Statement"]
    users: dict[str, set[str]] = {}
    for st in statements:
        crypto = _crypto(st["Action"])
        if st["Effect"] != "Allow" or not crypto:
            continue
        principals = st["Principal"]["AWS"]
        for principal in principals if isinstance(principals, list) else [principals]:
            role = principal["Fn::GetAtt"][0]  # a role of this stack, never the account or "*"
            users[role_fn[role]] = crypto
        assert st["Condition"] == SECRETS_CONDITION
    assert set(users) == {API, _dispatcher(any_mode)["Description"]}, users
    assert all(c == set(SECRETS_ACTIONS) for c in users.values())


def test_iam_grants_of_the_secrets_key_go_to_the_api_and_the_dispatcher_only(
    any_mode: Any,
) -> None:
    lid = _secrets_key(any_mode)
    role_fn = _function_of_role(any_mode)
    granted: dict[str, set[str]] = {}
    for policy in any_mode.props("AWS::IAM::Policy"):
        for st in policy["PolicyDocument"]["Statement"]:
            if lid not in str(st.get("Resource")):
                continue
            assert st["Effect"] == "Allow" and st["Condition"] == SECRETS_CONDITION
            for role in policy["Roles"]:
                who = role_fn.get(role["Ref"], f"role {role['Ref']} of no function")
                granted.setdefault(who, set()).update(_crypto(st["Action"]))
    assert set(granted) == {API, _dispatcher(any_mode)["Description"]}, granted


def test_only_the_api_and_the_dispatcher_know_the_secrets_key(any_mode: Any) -> None:
    knowing = [
        p.get("Description", "")
        for p in any_mode.props("AWS::Lambda::Function")
        if "ASYNCINFER_WEBHOOK_SECRETS_KEY" in p.get("Environment", {}).get("Variables", {})
    ]
    assert sorted(knowing) == sorted([API, _dispatcher(any_mode)["Description"]])
    for td in any_mode.props("AWS::ECS::TaskDefinition"):
        assert "ASYNCINFER_WEBHOOK_SECRETS_KEY" not in str(td)


def test_dispatcher_has_reserved_concurrency_and_a_matching_event_source(any_mode: Any) -> None:
    fn = _dispatcher(any_mode)
    assert fn["ReservedConcurrentExecutions"] == DEFAULT_RESERVED_CONCURRENCY
    (mapping,) = [
        m
        for m in any_mode.props("AWS::Lambda::EventSourceMapping")
        if "Dispatcher" in str(m["FunctionName"])
    ]
    assert mapping["ScalingConfig"]["MaximumConcurrency"] == DEFAULT_RESERVED_CONCURRENCY
    assert mapping["BatchSize"] == queues.BATCH_SIZE


def test_webhook_queue_and_timeout_are_the_local_stacks(any_mode: Any) -> None:
    fn = _dispatcher(any_mode)
    assert fn["Timeout"] == queues.DISPATCHER_TIMEOUT_SECONDS
    t = any_mode.template["Resources"]
    (mapping,) = [
        m
        for m in any_mode.props("AWS::Lambda::EventSourceMapping")
        if "Dispatcher" in str(m["FunctionName"])
    ]
    queue = t[mapping["EventSourceArn"]["Fn::GetAtt"][0]]["Properties"]
    assert queue["VisibilityTimeout"] == queues.VISIBILITY_TIMEOUT_SECONDS
    assert queue["MessageRetentionPeriod"] == queues.RETENTION_SECONDS
    assert queue["RedrivePolicy"]["maxReceiveCount"] == queues.MAX_RECEIVE_COUNT


def test_webhook_queue_takes_only_events_with_a_webhook(any_mode: Any) -> None:
    """Issue 14, item 5: events of jobs without a webhook (a big batch's) never queue ahead of
    other tenants' deliveries: the subscription filters on the has_webhook attribute."""
    (mapping,) = [
        m
        for m in any_mode.props("AWS::Lambda::EventSourceMapping")
        if "Dispatcher" in str(m["FunctionName"])
    ]
    queue_id = mapping["EventSourceArn"]["Fn::GetAtt"][0]
    (sub,) = [
        p
        for p in any_mode.props("AWS::SNS::Subscription")
        if p["Protocol"] == "sqs" and p["Endpoint"] == {"Fn::GetAtt": [queue_id, "Arn"]}
    ]
    assert sub["RawMessageDelivery"] is True
    assert sub["FilterPolicy"] == {"has_webhook": ["true"]}


@pytest.mark.parametrize("value", [-1, 1, 1001, "x"])
def test_reserved_concurrency_setting_is_validated(value: Any) -> None:
    with pytest.raises(DeployConfigError, match="webhooks_reserved_concurrency"):
        load_config({"webhooks_reserved_concurrency": value})


def test_reserved_concurrency_setting_default_and_override() -> None:
    assert load_config({}).webhooks_reserved_concurrency == DEFAULT_RESERVED_CONCURRENCY
    assert load_config({"webhooks_reserved_concurrency": "25"}).webhooks_reserved_concurrency == 25
    assert load_config({"webhooks_reserved_concurrency": 0}).webhooks_reserved_concurrency == 0


def test_no_reservation_when_set_to_zero() -> None:
    import aws_cdk as cdk
    from aws_cdk import aws_dynamodb as dynamodb
    from aws_cdk import aws_lambda as lambda_
    from aws_cdk import aws_sns as sns
    from aws_cdk.assertions import Match, Template

    from infra.components.webhooks import WebhookDelivery

    stack = cdk.Stack(cdk.App(), "T")
    table = dynamodb.Table(
        stack,
        "J",
        partition_key=dynamodb.Attribute(name="job_id", type=dynamodb.AttributeType.STRING),
    )
    layer = lambda_.LayerVersion.from_layer_version_arn(
        stack, "L", "arn:aws:lambda:us-east-1:017000801446:layer:x:1"
    )
    WebhookDelivery(
        stack,
        "W",
        topic=sns.Topic(stack, "E"),
        table=table,
        environment={},
        function_props={"layer": layer, "log_retention": cdk.aws_logs.RetentionDays.ONE_DAY},
        reserved_concurrency=0,
    )
    t = Template.from_stack(stack)
    t.has_resource_properties(
        "AWS::Lambda::Function",
        {
            "Description": Match.string_like_regexp("webhook dispatcher"),
            "ReservedConcurrentExecutions": Match.absent(),
        },
    )
    t.has_resource_properties("AWS::Lambda::EventSourceMapping", {"ScalingConfig": Match.absent()})
