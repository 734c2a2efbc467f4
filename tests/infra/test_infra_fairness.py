"""Fairness in the CDK app (issue 14, behaviour 7): SQS fair queues need the job queues to stay
standard queues (a FIFO queue would order each tenant's group and cap its throughput; the code
sends every job message with the tenant as its ``MessageGroupId``,
:mod:`asyncinfer.jobs.messages`)."""

from __future__ import annotations

from typing import Any


def test_the_job_queues_are_standard_queues_fair_by_tenant(any_mode: Any) -> None:
    queues = any_mode.props("AWS::SQS::Queue")
    job_queues = [q for q in queues if q.get("RedrivePolicy", {}).get("maxReceiveCount") == 3]
    assert job_queues
    for q in queues:
        assert not q.get("FifoQueue"), q.get("QueueName")
        assert "ContentBasedDeduplication" not in q
        assert not str(q.get("QueueName", "")).endswith(".fifo")
