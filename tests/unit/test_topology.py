"""The topology's data is consistent: what it names exists, and a queue's attributes are what
SQS takes (the CDK template comparison is tests/infra/test_topology_parity.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from asyncinfer.core import settings_parts, topology
from asyncinfer.core.settings import Settings

ROOT = Path(__file__).resolve().parents[2]


def test_every_function_has_its_code_and_names_real_queues_and_parts() -> None:
    for code, fn in topology.FUNCTIONS.items():
        assert (ROOT / "lambdas" / code / "app.py").is_file(), code
        for trigger in fn.triggers:
            if isinstance(trigger, topology.SqsTrigger):
                assert trigger.queue in topology.QUEUES
                assert 1 <= trigger.batch_size <= 10  # SQS ReceiveMessage's maximum
        if fn.part:
            assert isinstance(getattr(Settings(), fn.part), settings_parts.SettingsPart)
        assert fn.timeout_seconds <= 900  # Lambda's maximum


def test_every_dead_letter_queue_exists_and_outlives_its_source() -> None:
    for q in topology.QUEUES.values():
        if q.dead_letter:
            dlq = topology.QUEUES[q.dead_letter]
            assert dlq.retention_seconds >= q.retention_seconds


def test_a_source_queue_outlasts_its_consumer_six_times() -> None:
    """Lambda developer guide, "Using Lambda with Amazon SQS"."""
    for fn in topology.FUNCTIONS.values():
        for trigger in fn.triggers:
            if isinstance(trigger, topology.SqsTrigger) and trigger.queue != "jobs":
                visibility = topology.QUEUES[trigger.queue].visibility_timeout_seconds
                assert visibility is not None and visibility >= 6 * fn.timeout_seconds


def test_queue_attributes() -> None:
    jobs = topology.QUEUES["jobs"]
    attrs = jobs.attributes(visibility_timeout=90, max_receive_count=4, dlq_arn="arn:dlq")
    assert attrs["VisibilityTimeout"] == "90"
    assert attrs["ReceiveMessageWaitTimeSeconds"] == "20"
    assert json.loads(attrs["RedrivePolicy"]) == {
        "deadLetterTargetArn": "arn:dlq",
        "maxReceiveCount": 4,
    }
    assert jobs.fair  # the tenant is the MessageGroupId (asyncinfer.jobs.messages)
    with pytest.raises(ValueError, match="visibility"):
        jobs.attributes(max_receive_count=4, dlq_arn="arn:dlq")
    with pytest.raises(ValueError, match="DLQ"):
        topology.QUEUES["webhooks"].attributes()
    hooks = topology.QUEUES["webhooks"].attributes(dlq_arn="arn:d")
    assert (
        json.loads(hooks["RedrivePolicy"])["maxReceiveCount"] == topology.WEBHOOK_MAX_RECEIVE_COUNT
    )


def test_table_attribute_definitions_are_each_key_once() -> None:
    names = [k.name for k in topology.JOB_TABLE.attribute_definitions()]
    assert names == [
        "job_id",
        "tenant",
        "queued_mark",
        "expires_epoch",
        "running_mark",
        "lease_expires_epoch",
        "outbox_mark",
        "outbox_since",
    ]


def test_batch_events_subscription_filters_terminal_job_events_raw() -> None:
    events = topology.QUEUES["batch-events"]
    assert events.subscribed_to_events
    attrs = events.subscription_attributes()
    assert attrs["RawMessageDelivery"] == "true"
    assert json.loads(attrs["FilterPolicy"]) == {
        "event_type": ["job.succeeded", "job.failed", "job.cancelled", "job.expired"]
    }
    # The webhook queue takes the events of jobs and batches with a webhook only.
    hooks = topology.QUEUES["webhooks"].subscription_attributes()
    assert json.loads(hooks["FilterPolicy"]) == {"has_webhook": ["true"]}


def test_batch_queues_local_visibility_is_the_documented_override_only() -> None:
    batches = topology.QUEUES["batches"]
    aws = batches.attributes(dlq_arn="arn:d")
    local = batches.attributes(dlq_arn="arn:d", local=True)
    assert aws["VisibilityTimeout"] == str(6 * topology.BATCH_EXPANDER_TIMEOUT_SECONDS)
    assert local["VisibilityTimeout"] == str(topology.BATCH_LOCAL_VISIBILITY_SECONDS)
    assert {k: v for k, v in aws.items() if k != "VisibilityTimeout"} == {
        k: v for k, v in local.items() if k != "VisibilityTimeout"
    }
    assert json.loads(aws["RedrivePolicy"])["maxReceiveCount"] == topology.BATCH_MAX_RECEIVE_COUNT
    # A queue without an override is the same locally.
    hooks = topology.QUEUES["webhooks"]
    assert hooks.attributes(dlq_arn="a", local=True) == hooks.attributes(dlq_arn="a")
