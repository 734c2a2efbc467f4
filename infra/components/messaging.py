"""Per-model SQS queues with dead-letter queues, and encrypted SNS topics."""

from __future__ import annotations

from collections.abc import Sequence

from aws_cdk import ArnFormat, Aws, Duration, RemovalPolicy, Stack
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_sns as sns
from aws_cdk import aws_sqs as sqs
from constructs import Construct

from asyncinfer.core import naming, topology
from infra.components.model_scopes import ModelScopes

#: Actions of CDK's grantConsumeMessages / grantSendMessages (SQS-managed SSE: no KMS).
CONSUME_ACTIONS = (
    "sqs:ReceiveMessage",
    "sqs:ChangeMessageVisibility",
    "sqs:GetQueueUrl",
    "sqs:DeleteMessage",
    "sqs:GetQueueAttributes",
)
SEND_ACTIONS = ("sqs:SendMessage", "sqs:GetQueueAttributes", "sqs:GetQueueUrl")

#: The job queues and their DLQs as the topology has them (:mod:`asyncinfer.core.topology`;
#: the local stack creates the same).
JOB_QUEUE = topology.QUEUES["jobs"]
JOB_DLQ = topology.QUEUES["jobs-dlq"]
#: SQS retention maximum (14 days) for dead-letter queues, so nothing is lost before triage.
DLQ_RETENTION = Duration.seconds(JOB_DLQ.retention_seconds)
#: Job queue retention: longer than the longest job TTL of the spec (259200 s = 3 days).
QUEUE_RETENTION = Duration.seconds(JOB_QUEUE.retention_seconds)
#: Priority classes with a queue of their own (spec: ``priority`` high | normal | low).
PRIORITIES = topology.PRIORITIES


class ModelQueues(Construct):
    """Job queues per model, one per priority class, and one dead-letter queue per model.

    Every queue: SSE with SQS-owned keys, a queue policy denying non-TLS access, long polling
    (20 s). Job queues redrive to their DLQ after ``max_receive_count`` receives. Queues are
    named by :mod:`asyncinfer.core.naming` from ``prefix``, so the code derives every URL from the
    prefix and :meth:`url_base` instead of carrying a map of them.

    Args:
        models: model ids.
        prefix: the deployment's resource prefix (:mod:`asyncinfer.core.naming`).
        visibility_timeout: job queue visibility timeout (the worker extends it by heartbeats).
        max_receive_count: receives before a message moves to the DLQ.
        dlq_visibility_timeout: DLQ visibility timeout (at least six times the DLQ handler's
            timeout, Lambda developer guide, "Using Lambda with Amazon SQS").
        scopes: where each model's queues go (:class:`ModelScopes`; default: here).
    """

    def __init__(
        self,
        scope: Construct,
        id: str,
        *,
        models: Sequence[str],
        prefix: str,
        visibility_timeout: Duration,
        max_receive_count: int,
        dlq_visibility_timeout: Duration,
        scopes: ModelScopes | None = None,
    ) -> None:
        super().__init__(scope, id)
        self.prefix = prefix
        #: model -> its normal-priority queue (scaling and alarms read these)
        self.queues: dict[str, sqs.Queue] = {}
        #: ``model`` / ``model#high`` / ``model#low`` -> queue (ASYNCINFER_QUEUE_URLS keys)
        self.class_queues: dict[str, sqs.Queue] = {}
        self.dlqs: dict[str, sqs.Queue] = {}
        for model in models:
            sc = scopes.of(self, model) if scopes else self
            dlq = sqs.Queue(
                sc,
                f"{model}-dlq",
                queue_name=naming.dlq_name(prefix, model),
                encryption=sqs.QueueEncryption.SQS_MANAGED,
                enforce_ssl=True,
                retention_period=DLQ_RETENTION,
                visibility_timeout=dlq_visibility_timeout,
            )
            for priority in PRIORITIES:
                queue = sqs.Queue(
                    sc,
                    f"{model}-queue" if priority == "normal" else f"{model}-{priority}-queue",
                    queue_name=naming.queue_name(prefix, model, priority),
                    encryption=sqs.QueueEncryption.SQS_MANAGED,
                    enforce_ssl=True,
                    retention_period=QUEUE_RETENTION,
                    visibility_timeout=visibility_timeout,
                    receive_message_wait_time=Duration.seconds(JOB_QUEUE.receive_wait_seconds),
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

    def arn_pattern(self, infix: str) -> str:
        """The IAM resource pattern of every job queue (``infix`` ``jobs-``) or dead-letter
        queue (``dlq-``) of this deployment and nothing else (:mod:`asyncinfer.core.naming`)."""
        return Stack.of(self).format_arn(
            service="sqs", resource=f"{self.prefix}{infix}*", arn_format=ArnFormat.NO_RESOURCE_NAME
        )

    def grant_job_queues(self, grantee: iam.IGrantable, actions: Sequence[str]) -> None:
        """Allow ``actions`` on every model's job queues: one statement whatever the number of
        models (a statement per queue would outgrow IAM's policy size limits)."""
        iam.Grant.add_to_principal(
            grantee=grantee,
            actions=list(actions),
            resource_arns=[self.arn_pattern(naming.JOBS_INFIX)],
        )

    def grant_dlqs(self, grantee: iam.IGrantable, actions: Sequence[str]) -> None:
        """Allow ``actions`` on every model's dead-letter queue (one statement)."""
        iam.Grant.add_to_principal(
            grantee=grantee,
            actions=list(actions),
            resource_arns=[self.arn_pattern(naming.DLQ_INFIX)],
        )

    @staticmethod
    def url_base() -> str:
        """``https://sqs.<region>.<url suffix>/<account>/`` (tokens resolved at deploy time),
        the value of ``ASYNCINFER_QUEUE_URL_BASE``; a queue's URL is this plus its name (SQS
        developer guide, "Amazon SQS queue and message identifiers")."""
        return f"https://sqs.{Aws.REGION}.{Aws.URL_SUFFIX}/{Aws.ACCOUNT_ID}/"

    def url_template(self) -> str:
        """The queue URLs as one readable template (the ``QueueUrls`` stack output)."""
        return f"{self.url_base()}{naming.queue_name(self.prefix, '{model}')}[-high|-low]"


class EncryptedTopics(Construct):
    """A customer-managed KMS key (rotation on) and factory of topics encrypted with it, each
    with a TLS-only topic policy.

    The key policy lets CloudWatch (alarm notifications) and SageMaker's async notifications use
    the key only on behalf of this account (``aws:SourceAccount``, the confused-deputy guard of
    the IAM user guide); :meth:`allow_cloudwatch_alarms` does the same on a topic's policy.
    """

    def __init__(self, scope: Construct, id: str) -> None:
        super().__init__(scope, id)
        # The key encrypts messages in flight only (SNS stores none): scheduled for deletion
        # with the stack (7-day waiting period) instead of CDK's default of keeping it, where it
        # would bill $1 a month for ever after a teardown.
        self.key = kms.Key(
            self,
            "Key",
            enable_key_rotation=True,
            description="asyncinfer SNS topics",
            removal_policy=RemovalPolicy.DESTROY,
            pending_window=Duration.days(7),
        )
        self.key.add_to_resource_policy(
            iam.PolicyStatement(
                sid="AllowCloudWatchAlarms",
                principals=[iam.ServicePrincipal("cloudwatch.amazonaws.com")],
                actions=["kms:Decrypt", "kms:GenerateDataKey*"],
                resources=["*"],
                conditions={"StringEquals": {"aws:SourceAccount": Aws.ACCOUNT_ID}},
            )
        )

    def topic(self, id: str, *, display_name: str) -> sns.Topic:
        """A new topic encrypted with the key and restricted to TLS."""
        return sns.Topic(self, id, display_name=display_name, master_key=self.key, enforce_ssl=True)

    @staticmethod
    def allow_cloudwatch_alarms(topic: sns.Topic) -> None:
        """Let CloudWatch alarms of this account publish to ``topic``. ``enforce_ssl`` gives the
        topic a policy of its own, which replaces SNS's default policy that let CloudWatch
        publish; without this statement alarm notifications are dropped."""
        topic.add_to_resource_policy(
            iam.PolicyStatement(
                sid="AllowCloudWatchAlarms",
                principals=[iam.ServicePrincipal("cloudwatch.amazonaws.com")],
                actions=["sns:Publish"],
                resources=[topic.topic_arn],
                conditions={"StringEquals": {"aws:SourceAccount": Aws.ACCOUNT_ID}},
            )
        )
