"""The OpenAI batch part of the stack (infra/components/batches.py): the expander and the line
counter, fed by their queues with partial batch responses; the counter's subscription to the
events topic, filtered to terminal job events; the grants that submitting jobs takes; the alarms
on stuck batches. Shapes shared with the local stack come from asyncinfer.openai_api.queues."""

from __future__ import annotations

import json
from typing import Any

from asyncinfer.openai_api import queues
from infra.components.batches import STUCK_SECONDS

EXPANDER = "asyncinfer OpenAI batch expander"
COUNTER = "asyncinfer OpenAI batch line counter"


def _function(s: Any, description: str) -> tuple[str, dict[str, Any]]:
    found = [
        (lid, r)
        for lid, r in s.resources("AWS::Lambda::Function").items()
        if r["Properties"].get("Description", "").startswith(description)
    ]
    assert len(found) == 1, found
    return found[0]


def _mapping(s: Any, fn_id: str) -> dict[str, Any]:
    (m,) = [
        p for p in s.props("AWS::Lambda::EventSourceMapping") if p["FunctionName"] == {"Ref": fn_id}
    ]
    return m


def test_expander_takes_one_operation_at_a_time_with_partial_failures(any_mode: Any) -> None:
    lid, fn = _function(any_mode, EXPANDER)
    assert fn["Properties"]["Timeout"] == queues.EXPANDER_TIMEOUT_SECONDS
    m = _mapping(any_mode, lid)
    assert m["BatchSize"] == 1 and m["FunctionResponseTypes"] == ["ReportBatchItemFailures"]


def test_counter_has_the_finalizer_timeout_and_partial_failures(any_mode: Any) -> None:
    lid, fn = _function(any_mode, COUNTER)
    assert fn["Properties"]["Timeout"] == queues.FINALIZER_TIMEOUT_SECONDS
    m = _mapping(any_mode, lid)
    assert m["FunctionResponseTypes"] == ["ReportBatchItemFailures"]


def test_counter_subscription_takes_only_terminal_job_events_raw(any_mode: Any) -> None:
    filtered = [
        p
        for p in any_mode.props("AWS::SNS::Subscription")
        if p.get("FilterPolicy", {}).get("event_type") == queues.TERMINAL_JOB_EVENTS
    ]
    assert len(filtered) == 1
    assert filtered[0]["Protocol"] == "sqs" and filtered[0]["RawMessageDelivery"] is True


def test_batch_queues_have_dead_letter_queues(any_mode: Any) -> None:
    vis = {queues.VISIBILITY_TIMEOUT_SECONDS, queues.EVENTS_VISIBILITY_TIMEOUT_SECONDS}
    found = [
        p
        for p in any_mode.props("AWS::SQS::Queue")
        if p.get("VisibilityTimeout") in vis and "RedrivePolicy" in p
    ]
    assert len(found) == 2
    assert {p["RedrivePolicy"]["maxReceiveCount"] for p in found} == {queues.MAX_RECEIVE_COUNT}


def test_expander_may_send_to_job_queues_and_the_api_to_the_batch_queue(any_mode: Any) -> None:
    lid, _ = _function(any_mode, EXPANDER)
    text = json.dumps(any_mode.template)
    assert "ASYNCINFER_BATCH_QUEUE_URL" in text
    role = any_mode.resources("AWS::Lambda::Function")[lid]["Properties"]["Role"]["Fn::GetAtt"][0]
    actions: set[str] = set()
    for p in any_mode.props("AWS::IAM::Policy"):
        if {"Ref": role} in p.get("Roles", []):
            for st in p["PolicyDocument"]["Statement"]:
                a = st["Action"]
                actions |= set(a if isinstance(a, list) else [a])
    wanted = {"sqs:SendMessage", "dynamodb:UpdateItem", "sns:Publish", "s3:PutObject"}
    assert wanted <= actions, sorted(wanted - actions)
    (api,) = [
        r
        for r in any_mode.resources("AWS::Lambda::Function").values()
        if r["Properties"].get("Description") == "asyncinfer REST API"
    ]
    assert "ASYNCINFER_BATCH_QUEUE_URL" in api["Properties"]["Environment"]["Variables"]


def test_alarms_on_stuck_batches(any_mode: Any) -> None:
    stuck = [
        p
        for p in any_mode.props("AWS::CloudWatch::Alarm")
        if "OpenAI batches stuck" in p.get("AlarmDescription", "")
    ]
    assert len(stuck) == 2 and {p["Threshold"] for p in stuck} == {STUCK_SECONDS}
    assert {p["MetricName"] for p in stuck} == {"ApproximateAgeOfOldestMessage"}
    given_up = [
        p
        for p in any_mode.props("AWS::CloudWatch::Alarm")
        if "OpenAI batch operations given up" in p.get("AlarmDescription", "")
    ]
    assert len(given_up) == 2
