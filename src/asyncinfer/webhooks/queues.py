"""The webhook queue and its dead-letter queue, as the CDK app creates them in AWS
(``infra/components/webhooks.py`` reads the constants here) and the local stack on the emulator.

* ``<prefix>-webhooks``: subscribed to the events topic with raw message delivery; visibility
  timeout :data:`VISIBILITY_TIMEOUT_SECONDS` (the dispatcher sets each failed message's own
  retry delay); retention 14 days; redrive to the DLQ after :data:`MAX_RECEIVE_COUNT` receives,
  a safety net only: the dispatcher moves an event to the DLQ itself once its retry window (24 h)
  is over, well before that many receives.
* ``<prefix>-webhooks-dlq``: events whose delivery was given up (retention 14 days).
"""

from __future__ import annotations

import json
from typing import Any

#: Receives before SQS itself dead-letters a webhook event (a handler that keeps crashing).
MAX_RECEIVE_COUNT = 100
#: Events per dispatcher invocation (the SQS event source's batch size). They are delivered side
#: by side (:mod:`asyncinfer.webhooks.batch`), so a batch takes as long as its slowest attempt
#: (at most 10 s), not the sum of them.
BATCH_SIZE = 10
#: The dispatcher Lambda's timeout, seconds: one attempt (10 s) plus its bookkeeping
#: (``batch.BOOKKEEPING_SECONDS``), with room for slow AWS calls; the batch answers before it.
DISPATCHER_TIMEOUT_SECONDS = 30
#: Visibility timeout of the webhook queue, seconds: six times the dispatcher's timeout, as the
#: Lambda developer guide advises for SQS event sources ("Using Lambda with Amazon SQS"). The
#: CDK app and the local stack both use this value. A record the batch leaves unfinished is
#: delivered again after it; a failed attempt sets its own retry delay instead.
VISIBILITY_TIMEOUT_SECONDS = 6 * DISPATCHER_TIMEOUT_SECONDS
RETENTION_SECONDS = 14 * 24 * 3600


def create_webhook_queues(sqs: Any, sns: Any, topic_arn: str, prefix: str) -> tuple[str, str]:
    """Create the webhook queue (subscribed to ``topic_arn``, raw delivery) and its DLQ;
    idempotent. Returns ``(queue_url, dlq_url)``."""
    dlq_url: str = sqs.create_queue(
        QueueName=f"{prefix}-webhooks-dlq",
        Attributes={"MessageRetentionPeriod": str(RETENTION_SECONDS)},
    )["QueueUrl"]
    dlq_arn = _arn(sqs, dlq_url)
    url: str = sqs.create_queue(
        QueueName=f"{prefix}-webhooks",
        Attributes={
            "VisibilityTimeout": str(VISIBILITY_TIMEOUT_SECONDS),
            "MessageRetentionPeriod": str(RETENTION_SECONDS),
            "RedrivePolicy": json.dumps(
                {"deadLetterTargetArn": dlq_arn, "maxReceiveCount": MAX_RECEIVE_COUNT}
            ),
        },
    )["QueueUrl"]
    sns.subscribe(
        TopicArn=topic_arn,
        Protocol="sqs",
        Endpoint=_arn(sqs, url),
        Attributes={"RawMessageDelivery": "true"},
    )
    return url, dlq_url


def _arn(sqs: Any, url: str) -> str:
    arn: str = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"][
        "QueueArn"
    ]
    return arn
