"""The OpenAI batch queues, as the CDK app creates them in AWS and the local stack on the
emulator (both read the constants here):

* ``<prefix>-batches``: the expander's operations (``expand``, ``end``, ``check``); visibility
  timeout :data:`VISIBILITY_TIMEOUT_SECONDS`; redrive to ``<prefix>-batches-dlq`` after
  :data:`MAX_RECEIVE_COUNT` receives.
* ``<prefix>-batch-events``: subscribed to the events topic (raw delivery), filtered to the
  terminal job events; the counter/finalizer's input; redrive to ``<prefix>-batch-events-dlq``.
"""

from __future__ import annotations

import json
from typing import Any

#: The expander Lambda's timeout, seconds (one invocation expands chunks for all but the last
#: ``expansion.RESERVE_SECONDS`` of it).
EXPANDER_TIMEOUT_SECONDS = 300
#: The counter/finalizer Lambda's timeout, seconds (finalization reads every line's job).
FINALIZER_TIMEOUT_SECONDS = 900
#: Visibility timeouts: six times the consumer's timeout (Lambda developer guide, "Using Lambda
#: with Amazon SQS").
VISIBILITY_TIMEOUT_SECONDS = 6 * EXPANDER_TIMEOUT_SECONDS
EVENTS_VISIBILITY_TIMEOUT_SECONDS = 6 * FINALIZER_TIMEOUT_SECONDS
MAX_RECEIVE_COUNT = 5
RETENTION_SECONDS = 14 * 24 * 3600
#: The terminal job events the batch-events subscription lets through.
TERMINAL_JOB_EVENTS = ["job.succeeded", "job.failed", "job.cancelled", "job.expired"]


def create_batch_queues(
    sqs: Any, sns: Any, topic_arn: str, prefix: str, *, visibility: int | None = None
) -> dict[str, str]:
    """Create the batch queue and the batch-events queue (subscribed to ``topic_arn``) with
    their DLQs; idempotent. ``visibility`` overrides both visibility timeouts (the local stack:
    a failed record should come back in seconds). Returns ``{"queue", "dlq", "events",
    "events_dlq"}`` URLs."""
    out: dict[str, str] = {}
    for name, key, vis in (
        ("batches", "queue", VISIBILITY_TIMEOUT_SECONDS),
        ("batch-events", "events", EVENTS_VISIBILITY_TIMEOUT_SECONDS),
    ):
        dlq = sqs.create_queue(
            QueueName=f"{prefix}-{name}-dlq",
            Attributes={"MessageRetentionPeriod": str(RETENTION_SECONDS)},
        )["QueueUrl"]
        url = sqs.create_queue(
            QueueName=f"{prefix}-{name}",
            Attributes={
                "VisibilityTimeout": str(visibility or vis),
                "MessageRetentionPeriod": str(RETENTION_SECONDS),
                "RedrivePolicy": json.dumps(
                    {"deadLetterTargetArn": _arn(sqs, dlq), "maxReceiveCount": MAX_RECEIVE_COUNT}
                ),
            },
        )["QueueUrl"]
        out[key], out[f"{key}_dlq" if key == "events" else "dlq"] = url, dlq
    sns.subscribe(
        TopicArn=topic_arn,
        Protocol="sqs",
        Endpoint=_arn(sqs, out["events"]),
        Attributes={
            "RawMessageDelivery": "true",
            "FilterPolicy": json.dumps({"event_type": TERMINAL_JOB_EVENTS}),
        },
    )
    return out


def _arn(sqs: Any, url: str) -> str:
    arn: str = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"][
        "QueueArn"
    ]
    return arn
