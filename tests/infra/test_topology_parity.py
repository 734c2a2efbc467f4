"""One topology (issue 14): the CDK template and the local stack's resources (created by
:mod:`asyncinfer.local.resources` against moto in-process) have the same table keys and indexes
and the same queue attributes, and both follow :mod:`asyncinfer.core.topology`."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from moto import mock_aws

from asyncinfer.core import naming, topology
from asyncinfer.core.settings import Settings
from asyncinfer.local.resources import Resources, create_resources
from infra.config import DEFAULTS
from tests.infra.conftest import Synth

#: What SQS and DynamoDB assume for a property the template leaves out.
SQS_DEFAULTS = {
    "VisibilityTimeout": 30,
    "MessageRetentionPeriod": 345600,
    "ReceiveMessageWaitTimeSeconds": 0,
}


def _queue(attrs: dict[str, Any], role_of_arn: dict[str, str]) -> dict[str, Any]:
    """The attributes that matter of one queue, in one shape for the template and for SQS."""
    out: dict[str, Any] = {k: int(attrs.get(k, v)) for k, v in SQS_DEFAULTS.items()}
    out["SqsManagedSseEnabled"] = str(attrs.get("SqsManagedSseEnabled", "false")).lower() == "true"
    redrive = attrs.get("RedrivePolicy")
    if isinstance(redrive, str):
        redrive = json.loads(redrive)
    if redrive:
        target = redrive["deadLetterTargetArn"]
        key = target["Fn::GetAtt"][0] if isinstance(target, dict) else target
        out["dead_letter"] = role_of_arn[key]
        out["maxReceiveCount"] = int(redrive["maxReceiveCount"])
    return out


def _template_queues(synth: Synth) -> dict[str, list[dict[str, Any]]]:
    queues = synth.resources("AWS::SQS::Queue")
    roles: dict[str, str] = {}
    for lid, q in queues.items():
        name = q["Properties"].get("QueueName", "")
        if naming.JOBS_INFIX in name:
            roles[lid] = "jobs"
        elif naming.DLQ_INFIX in name:
            roles[lid] = "jobs-dlq"
    # The unnamed queues: the source of a function's event source mapping has the role of that
    # function's SQS trigger in the topology (webhooks, batches, batch-events) ...
    by_service = {f.service: f for f in topology.FUNCTIONS.values()}
    mappings = synth.props("AWS::Lambda::EventSourceMapping")
    for service, (fn_lid, _props) in _functions(synth).items():
        if service not in by_service:
            continue  # test_every_function_of_the_template_is_in_the_topology reports it
        for m in mappings:
            if _targets(m["FunctionName"], fn_lid):
                role = by_service[service].sqs_trigger().queue
                source = m["EventSourceArn"]["Fn::GetAtt"][0]
                assert roles.setdefault(source, role) == role, (source, role)
    # ... and the target of a queue's redrive policy the role of that queue's dead-letter queue.
    for lid, role in list(roles.items()):
        redrive = queues[lid]["Properties"].get("RedrivePolicy")
        if redrive:
            dlq = topology.QUEUES[role].dead_letter
            assert dlq is not None, f"{role} has a redrive policy the topology does not name"
            target = redrive["deadLetterTargetArn"]["Fn::GetAtt"][0]
            assert roles.setdefault(target, dlq) == dlq, (target, dlq)
    assert set(roles) == set(queues), "a queue of the template has no topology role"
    out: dict[str, list[dict[str, Any]]] = {}
    for lid, q in queues.items():
        out.setdefault(roles[lid], []).append(_queue(q["Properties"], roles))
    return out


@pytest.fixture(scope="module")
def local() -> Iterator[tuple[Resources, Any, Any]]:
    """The local stack's resources for the default catalogue's first model, in moto."""
    with mock_aws():
        settings = Settings(
            visibility_timeout_seconds=DEFAULTS["visibility_timeout"],
            max_receive_count=DEFAULTS["max_receive_count"],
        )
        res = create_resources(settings, ["echo"], prefix="parity", event_log=False)
        from asyncinfer.aws import clients

        yield res, clients.client("sqs", settings), clients.client("dynamodb", settings)
        clients.reset()


def _local_queues(res: Resources, sqs: Any) -> dict[str, list[dict[str, Any]]]:
    by_role = {
        "jobs": list(res.queues.values()),
        "jobs-dlq": list(res.dlqs.values()),
        "webhooks": [res.webhook_queue],
        "webhooks-dlq": [res.webhook_dlq],
        "batches": [res.batch_queue],
        "batches-dlq": [res.batch_dlq],
        "batch-events": [res.batch_events_queue],
        "batch-events-dlq": [res.batch_events_dlq],
    }
    attrs = {
        url: sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
        for urls in by_role.values()
        for url in urls
    }
    role_of_arn = {
        a["QueueArn"]: r for r, urls in by_role.items() for u in urls for a in [attrs[u]]
    }
    return {r: [_queue(attrs[u], role_of_arn) for u in urls] for r, urls in by_role.items()}


def _distinct(queues: dict[str, list[dict[str, Any]]]) -> dict[str, list[dict[str, Any]]]:
    return {
        r: [json.loads(s) for s in sorted({json.dumps(q, sort_keys=True) for q in qs})]
        for r, qs in queues.items()
    }


def _with_local_overrides(queues: dict[str, list[dict[str, Any]]]) -> dict[str, list[Any]]:
    """The template's queues with the local stack's documented overrides of the topology
    (``Queue.local_visibility_timeout_seconds``: the batch queues' retry delay)."""
    out: dict[str, list[Any]] = {}
    for role, qs in queues.items():
        local_visibility = topology.QUEUES[role].local_visibility_timeout_seconds
        out[role] = [
            {**q, "VisibilityTimeout": local_visibility} if local_visibility is not None else q
            for q in qs
        ]
    return out


def test_local_queues_have_the_template_attributes(ecs: Synth, local: Any) -> None:
    res, sqs, _ddb = local
    assert _distinct(_local_queues(res, sqs)) == _distinct(
        _with_local_overrides(_template_queues(ecs))
    )


def test_the_local_stack_overrides_only_the_batch_queues_retry_delay() -> None:
    """The one documented difference (topology.BATCH_LOCAL_VISIBILITY_SECONDS): shorter, and
    still longer than a local invocation (30 s, asyncinfer.local.lambda_runtime)."""
    overridden = {
        name: q.local_visibility_timeout_seconds
        for name, q in topology.QUEUES.items()
        if q.local_visibility_timeout_seconds is not None
    }
    assert overridden == {
        "batches": topology.BATCH_LOCAL_VISIBILITY_SECONDS,
        "batch-events": topology.BATCH_LOCAL_VISIBILITY_SECONDS,
    }
    assert (
        30
        < topology.BATCH_LOCAL_VISIBILITY_SECONDS
        < min(topology.QUEUES[n].visibility_timeout_seconds or 0 for n in overridden)
    )


def test_template_queues_follow_the_topology(ecs: Synth) -> None:
    template = _distinct(_template_queues(ecs))
    assert set(template) == set(topology.QUEUES)
    for name, spec in topology.QUEUES.items():
        want = spec.attributes(
            visibility_timeout=DEFAULTS["visibility_timeout"],
            max_receive_count=DEFAULTS["max_receive_count"],
            dlq_arn=spec.dead_letter,
        )
        assert template[name] == [_queue(want, {d: d for d in topology.QUEUES})], name


def _table(
    keys: list[dict[str, str]],
    attrs: list[dict[str, str]],
    gsis: list[dict[str, Any]],
    ttl: str,
    billing: str,
) -> dict[str, Any]:
    return {
        "keys": keys,
        "attributes": sorted((a["AttributeName"], a["AttributeType"]) for a in attrs),
        "indexes": sorted(
            (g["IndexName"], json.dumps(g["KeySchema"]), g["Projection"]["ProjectionType"])
            for g in gsis
        ),
        "ttl": ttl,
        "billing": billing,
    }


def test_local_table_has_the_template_keys_and_indexes(ecs: Synth, local: Any) -> None:
    res, _sqs, ddb = local
    (cfn,) = ecs.props("AWS::DynamoDB::Table")
    desc = ddb.describe_table(TableName=res.table)["Table"]
    ttl = ddb.describe_time_to_live(TableName=res.table)["TimeToLiveDescription"]
    local_table = _table(
        desc["KeySchema"],
        desc["AttributeDefinitions"],
        desc["GlobalSecondaryIndexes"],
        ttl["AttributeName"],
        desc["BillingModeSummary"]["BillingMode"],
    )
    template_table = _table(
        cfn["KeySchema"],
        cfn["AttributeDefinitions"],
        cfn["GlobalSecondaryIndexes"],
        cfn["TimeToLiveSpecification"]["AttributeName"],
        cfn["BillingMode"],
    )
    assert local_table == template_table
    t = topology.JOB_TABLE
    assert template_table["attributes"] == sorted(
        (k.name, k.type) for k in t.attribute_definitions()
    )
    assert [i[0] for i in template_table["indexes"]] == sorted(i.name for i in t.indexes)


def test_the_store_queries_the_topology_indexes() -> None:
    from asyncinfer.jobs import store

    assert (store.TENANT_INDEX, store.QUEUED_INDEX, store.RUNNING_INDEX) == (
        topology.TENANT_INDEX,
        topology.QUEUED_INDEX,
        topology.RUNNING_INDEX,
    )


def _functions(synth: Synth) -> dict[str, tuple[str, dict[str, Any]]]:
    """Powertools service name -> (logical id, properties) of every Lambda function."""
    out = {}
    for lid, fn in synth.resources("AWS::Lambda::Function").items():
        env = fn["Properties"].get("Environment", {}).get("Variables", {})
        if "POWERTOOLS_SERVICE_NAME" in env:
            out[env["POWERTOOLS_SERVICE_NAME"]] = (lid, fn["Properties"])
    return out


def _targets(ref: Any, lid: str) -> bool:
    return json.dumps(ref).count(f'"{lid}"') > 0


@pytest.mark.parametrize("mode", ["ecs", "sagemaker"])
def test_functions_follow_the_topology(mode: str, request: pytest.FixtureRequest) -> None:
    synth: Synth = request.getfixturevalue(mode)
    functions = _functions(synth)
    mappings = synth.props("AWS::Lambda::EventSourceMapping")
    rules = synth.props("AWS::Events::Rule")
    for spec in topology.FUNCTIONS.values():
        if spec.compute not in ("any", mode):
            assert spec.service not in functions
            continue
        lid, props = functions[spec.service]
        if spec.timeout_setting:
            assert DEFAULTS[spec.timeout_setting] == spec.timeout_seconds
        assert props["Timeout"] == spec.timeout_seconds, spec.code
        if spec.reserved_setting:
            assert props.get("ReservedConcurrentExecutions") == DEFAULTS[spec.reserved_setting]
        env = props["Environment"]["Variables"]
        assert set(spec.needs) <= set(env), (spec.code, set(spec.needs) - set(env))
        mine = [m for m in mappings if _targets(m["FunctionName"], lid)]
        sqs_triggers = [t for t in spec.triggers if isinstance(t, topology.SqsTrigger)]
        assert bool(mine) == bool(sqs_triggers), spec.code
        for m in mine:
            (trigger,) = sqs_triggers
            assert m["BatchSize"] == trigger.batch_size
            assert m.get("MaximumBatchingWindowInSeconds", 0) == trigger.max_batching_window_seconds
            assert ("ReportBatchItemFailures" in m.get("FunctionResponseTypes", [])) == (
                trigger.report_batch_item_failures
            )
            if trigger.max_concurrency_is_reserved:
                assert m["ScalingConfig"]["MaximumConcurrency"] == DEFAULTS[spec.reserved_setting]
        schedule = spec.schedule()
        scheduled = [r for r in rules if _targets(r.get("Targets", []), lid)]
        if schedule is None:
            assert scheduled == [], spec.code
        else:
            (rule,) = scheduled
            unit = "minute" if schedule.rate_minutes == 1 else "minutes"
            assert rule["ScheduleExpression"] == f"rate({schedule.rate_minutes} {unit})"
            assert rule["Targets"][0]["RetryPolicy"]["MaximumRetryAttempts"] == 0


def test_every_function_of_the_template_is_in_the_topology(any_mode: Synth) -> None:
    known = {f.service for f in topology.FUNCTIONS.values()}
    assert set(_functions(any_mode)) <= known
