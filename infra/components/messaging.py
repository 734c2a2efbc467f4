"""Per-model SQS queues with dead-letter queues, and encrypted SNS topics."""

from __future__ import annotations

from collections.abc import Sequence

from aws_cdk import Duration, Stack
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_sns as sns
from aws_cdk import aws_sqs as sqs
from constructs import Construct

#: SQS retention maximum (14 days) for dead-letter queues, so nothing is lost before triage.
DLQ_RETENTION = Duration.days(14)
#: Job queue retention: longer than the longest job TTL of the spec (259200 s = 3 days).
QUEUE_RETENTION = Duration.days(4)


#: Priority classes with a queue of their own (spec: ``priority`` high | normal | low).
PRIORITIES = ("normal", "high", "low")


class ModelQueues(Construct):
    """Job queues per model, one per priority class, and one dead-letter queue per model.

    Every queue: SSE with SQS-owned keys, a queue policy denying non-TLS access, long polling
    (20 s). Job queues redrive to their DLQ after ``max_receive_count`` receives.

    Args:
        models: model ids.
        visibility_timeout: job queue visibility timeout (the worker extends it by heartbeats).
        max_receive_count: receives before a message moves to the DLQ.
        dlq_visibility_timeout: DLQ visibility timeout (at least six times the DLQ handler's
            timeout, Lambda developer guide, "Using Lambda with Amazon SQS").
    """

    def __init__(
        self,
        scope: Construct,
        id: str,
        *,
        models: Sequence[str],
        visibility_timeout: Duration,
        max_receive_count: int,
        dlq_visibility_timeout: Duration,
    ) -> None:
        super().__init__(scope, id)
        #: model -> its normal-priority queue (scaling and alarms read these)
        self.queues: dict[str, sqs.Queue] = {}
        #: ``model`` / ``model#high`` / ``model#low`` -> queue (ASYNCINFER_QUEUE_URLS keys)
        self.class_queues: dict[str, sqs.Queue] = {}
        self.dlqs: dict[str, sqs.Queue] = {}
        for model in models:
            dlq = sqs.Queue(
                self,
                f"{model}-dlq",
                encryption=sqs.QueueEncryption.SQS_MANAGED,
                enforce_ssl=True,
                retention_period=DLQ_RETENTION,
                visibility_timeout=dlq_visibility_timeout,
            )
            for priority in PRIORITIES:
                queue = sqs.Queue(
                    self,
                    f"{model}-queue" if priority == "normal" else f"{model}-{priority}-queue",
                    encryption=sqs.QueueEncryption.SQS_MANAGED,
                    enforce_ssl=True,
                    retention_period=QUEUE_RETENTION,
                    visibility_timeout=visibility_timeout,
                    receive_message_wait_time=Duration.seconds(20),
                    dead_letter_queue=sqs.DeadLetterQueue(
                        queue=dlq, max_receive_count=max_receive_count
                    ),
                )
                self.class_queues[model if priority == "normal" else f"{model}#{priority}"] = queue
                if priority == "normal":
                    self.queues[model] = queue
            self.dlqs[model] = dlq

    def queues_of(self, model: str) -> list[sqs.Queue]:
        """Every priority class queue of ``model``."""
        return [q for k, q in self.class_queues.items() if k.split("#")[0] == model]

    def queue_urls_json(self) -> str:
        """``{model: url, "<model>#high": url, "<model>#low": url}`` as a JSON string (tokens
        resolved at deploy time), the value of ``ASYNCINFER_QUEUE_URLS``."""
        urls = {k: q.queue_url for k, q in self.class_queues.items()}
        return Stack.of(self).to_json_string(urls)


class EncryptedTopics(Construct):
    """A customer-managed KMS key (rotation on) and factory of topics encrypted with it, each
    with a TLS-only topic policy. CloudWatch may use the key (alarm notifications)."""

    def __init__(self, scope: Construct, id: str) -> None:
        super().__init__(scope, id)
        self.key = kms.Key(
            self, "Key", enable_key_rotation=True, description="asyncinfer SNS topics"
        )
        self.key.add_to_resource_policy(
            iam.PolicyStatement(
                sid="AllowCloudWatchAlarms",
                principals=[iam.ServicePrincipal("cloudwatch.amazonaws.com")],
                actions=["kms:Decrypt", "kms:GenerateDataKey*"],
                resources=["*"],
            )
        )

    def topic(self, id: str, *, display_name: str) -> sns.Topic:
        """A new topic encrypted with the key and restricted to TLS."""
        return sns.Topic(self, id, display_name=display_name, master_key=self.key, enforce_ssl=True)
