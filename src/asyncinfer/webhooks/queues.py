"""The webhook queue and its dead-letter queue, as the CDK app creates them in AWS
(``infra/components/webhooks.py`` reads the constants here) and the local stack on the emulator;
the values are the topology's (:mod:`asyncinfer.core.topology`, ``QUEUES["webhooks"]``).

* ``<prefix>-webhooks``: subscribed to the events topic with raw message delivery; visibility
  timeout :data:`VISIBILITY_TIMEOUT_SECONDS` (the dispatcher sets each failed message's own
  retry delay); retention 14 days; redrive to the DLQ after :data:`MAX_RECEIVE_COUNT` receives,
  a safety net only: the dispatcher moves an event to the DLQ itself once its retry window (24 h)
  is over, well before that many receives.
* ``<prefix>-webhooks-dlq``: events whose delivery was given up (retention 14 days).
"""

from __future__ import annotations

from typing import Any

from asyncinfer.core import topology

_QUEUE = topology.QUEUES["webhooks"]
_DLQ = topology.QUEUES["webhooks-dlq"]
_TRIGGER = topology.FUNCTIONS["webhooks"].sqs_trigger()

#: Receives before SQS itself dead-letters a webhook event (a handler that keeps crashing).
MAX_RECEIVE_COUNT = topology.WEBHOOK_MAX_RECEIVE_COUNT
#: Events per dispatcher invocation (the SQS event source's batch size). They are delivered side
#: by side (:mod:`asyncinfer.webhooks.batch`), so a batch takes as long as its slowest attempt
#: (at most 10 s), not the sum of them.
BATCH_SIZE = _TRIGGER.batch_size
#: The dispatcher Lambda's timeout, seconds: one attempt (10 s) plus its bookkeeping
#: (``batch.BOOKKEEPING_SECONDS``), with room for slow AWS calls; the batch answers before it.
DISPATCHER_TIMEOUT_SECONDS = topology.FUNCTIONS["webhooks"].timeout_seconds
#: Visibility timeout of the webhook queue, seconds: six times the dispatcher's timeout, as the
#: Lambda developer guide advises for SQS event sources ("Using Lambda with Amazon SQS"). The
#: CDK app and the local stack both use this value. A record the batch leaves unfinished is
#: delivered again after it; a failed attempt sets its own retry delay instead.
VISIBILITY_TIMEOUT_SECONDS: int = _QUEUE.visibility_timeout_seconds or 0
RETENTION_SECONDS = _QUEUE.retention_seconds


def create_webhook_queues(sqs: Any, sns: Any, topic_arn: str, prefix: str) -> tuple[str, str]:
    """Create the webhook queue (subscribed to ``topic_arn``, raw delivery) and its DLQ;
    idempotent. Returns ``(queue_url, dlq_url)``."""
    dlq_url: str = sqs.create_queue(
        QueueName=f"{prefix}-webhooks-dlq", Attributes=_DLQ.attributes()
    )["QueueUrl"]
    url: str = sqs.create_queue(
        QueueName=f"{prefix}-webhooks", Attributes=_QUEUE.attributes(dlq_arn=_arn(sqs, dlq_url))
    )["QueueUrl"]
    sns.subscribe(
        TopicArn=topic_arn,
        Protocol="sqs",
        Endpoint=_arn(sqs, url),
        Attributes=_QUEUE.subscription_attributes(),  # raw; events with a webhook only
    )
    return url, dlq_url


def _arn(sqs: Any, url: str) -> str:
    arn: str = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"][
        "QueueArn"
    ]
    return arn
