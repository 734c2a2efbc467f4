"""The OpenAI batch queues, as the CDK app creates them in AWS (``infra/components/batches.py``
reads the constants here) and the local stack on the emulator; the values are the topology's
(:mod:`asyncinfer.core.topology`, ``QUEUES["batches"]`` and ``QUEUES["batch-events"]``):

* ``<prefix>-batches``: the expander's operations (``expand``, ``end``, ``check``); visibility
  timeout :data:`VISIBILITY_TIMEOUT_SECONDS`; redrive to ``<prefix>-batches-dlq`` after
  :data:`MAX_RECEIVE_COUNT` receives.
* ``<prefix>-batch-events``: subscribed to the events topic (raw delivery), filtered to the
  terminal job events; the counter/finalizer's input; redrive to ``<prefix>-batch-events-dlq``.

On the local stack both visibility timeouts are
:data:`~asyncinfer.core.topology.BATCH_LOCAL_VISIBILITY_SECONDS` (the topology argues why).
"""

from __future__ import annotations

from typing import Any

from asyncinfer.core import topology

_QUEUE = topology.QUEUES["batches"]
_EVENTS = topology.QUEUES["batch-events"]

#: The expander Lambda's timeout, seconds (one invocation expands chunks for all but the last
#: ``expansion.RESERVE_SECONDS`` of it).
EXPANDER_TIMEOUT_SECONDS = topology.FUNCTIONS["openai_batches"].timeout_seconds
#: The counter/finalizer Lambda's timeout, seconds (finalization reads every line's job).
FINALIZER_TIMEOUT_SECONDS = topology.FUNCTIONS["openai_batch_counter"].timeout_seconds
#: Records per expander and per counter invocation (their SQS event sources' batch sizes).
EXPANDER_BATCH_SIZE = topology.FUNCTIONS["openai_batches"].sqs_trigger().batch_size
COUNTER_BATCH_SIZE = topology.FUNCTIONS["openai_batch_counter"].sqs_trigger().batch_size
#: Visibility timeouts in AWS: six times the consumer's timeout (Lambda developer guide, "Using
#: Lambda with Amazon SQS").
VISIBILITY_TIMEOUT_SECONDS: int = _QUEUE.visibility_timeout_seconds or 0
EVENTS_VISIBILITY_TIMEOUT_SECONDS: int = _EVENTS.visibility_timeout_seconds or 0
MAX_RECEIVE_COUNT = topology.BATCH_MAX_RECEIVE_COUNT
RETENTION_SECONDS = _QUEUE.retention_seconds
#: The terminal job events the batch-events subscription lets through.
TERMINAL_JOB_EVENTS = list(_EVENTS.event_types)


def create_batch_queues(
    sqs: Any, sns: Any, topic_arn: str, prefix: str, *, local: bool = False
) -> dict[str, str]:
    """Create the batch queue and the batch-events queue (subscribed to ``topic_arn``) with
    their DLQs, with the topology's attributes; idempotent. ``local``: the local stack's
    visibility timeouts (``False``: AWS's). Returns ``{"queue", "dlq", "events",
    "events_dlq"}`` URLs."""
    out: dict[str, str] = {}
    for spec, key, dlq_key in ((_QUEUE, "queue", "dlq"), (_EVENTS, "events", "events_dlq")):
        assert spec.dead_letter is not None
        dlq = sqs.create_queue(
            QueueName=f"{prefix}-{spec.dead_letter}",
            Attributes=topology.QUEUES[spec.dead_letter].attributes(local=local),
        )["QueueUrl"]
        url = sqs.create_queue(
            QueueName=f"{prefix}-{spec.name}",
            Attributes=spec.attributes(dlq_arn=_arn(sqs, dlq), local=local),
        )["QueueUrl"]
        out[key], out[dlq_key] = url, dlq
    sns.subscribe(
        TopicArn=topic_arn,
        Protocol="sqs",
        Endpoint=_arn(sqs, out["events"]),
        Attributes=_EVENTS.subscription_attributes(),
    )
    return out


def _arn(sqs: Any, url: str) -> str:
    arn: str = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"][
        "QueueArn"
    ]
    return arn
