"""Webhook delivery: an SQS queue subscribed to the events topic (raw delivery) feeding the
dispatcher Lambda (:mod:`asyncinfer.functions.webhook_dispatcher`), the webhook dead-letter queue
where
events go after the retry window (24 h by default), and the KMS key that encrypts tenants'
signing secrets, which only the dispatcher and the API (:meth:`WebhookDelivery.grant_secrets`)
may use (:mod:`asyncinfer.webhooks.secrets`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from aws_cdk import Duration, RemovalPolicy
from aws_cdk import aws_cloudwatch as cloudwatch
from aws_cdk import aws_dynamodb as dynamodb
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_lambda_event_sources as sources
from aws_cdk import aws_sns as sns
from aws_cdk import aws_sns_subscriptions as subs
from aws_cdk import aws_sqs as sqs
from constructs import Construct

from asyncinfer.core import envvars as ev
from asyncinfer.core import topology
from asyncinfer.webhooks import queues, secrets
from infra.components.function import PythonFunction

#: The dispatcher's timeout and its queue's visibility timeout (six times it), from the one
#: definition the local stack uses too.
DISPATCHER_TIMEOUT = Duration.seconds(queues.DISPATCHER_TIMEOUT_SECONDS)
QUEUE_VISIBILITY = Duration.seconds(queues.VISIBILITY_TIMEOUT_SECONDS)
#: Receives before SQS itself dead-letters an event: a safety net for a crashing dispatcher; the
#: dispatcher moves events to the DLQ after the retry window on its own.
SAFETY_MAX_RECEIVES = queues.MAX_RECEIVE_COUNT
#: What the two users of the secrets key may do with it, and only under the secrets' encryption
#: context (:func:`asyncinfer.webhooks.secrets.encryption_context`).
SECRETS_ACTIONS = ("kms:Encrypt", "kms:Decrypt")
#: What the account (IAM) may do with the secrets key: administer it, never use it. Encrypt and
#: Decrypt are allowed by the key policy to the roles given to ``grant_secrets`` only, so no IAM
#: policy elsewhere (``ReadOnlyAccess``, a broad ``kms:*``) can open the secrets. The list is
#: CDK's key administrator actions (``aws_kms.Key``, ``admins``).
SECRETS_KEY_ADMIN_ACTIONS = (
    "kms:Create*",
    "kms:Describe*",
    "kms:Enable*",
    "kms:List*",
    "kms:Put*",
    "kms:Update*",
    "kms:Revoke*",
    "kms:Disable*",
    "kms:Get*",
    "kms:Delete*",
    "kms:TagResource",
    "kms:UntagResource",
    "kms:ScheduleKeyDeletion",
    "kms:CancelKeyDeletion",
    "kms:RotateKeyOnDemand",
)
SECRETS_CONDITION = {
    "StringEquals": {f"kms:EncryptionContext:{secrets.PURPOSE_KEY}": secrets.PURPOSE}
}
#: Default reserved concurrency of the dispatcher (setting ``webhooks_reserved_concurrency``).
DEFAULT_RESERVED_CONCURRENCY = 10
#: Packages the dispatcher imports at run time beyond the Powertools layer.
VENDORED = (
    "ulid",
    "standardwebhooks",
    "httpx",
    "httpcore",
    "h11",
    "idna",
    "certifi",
    "anyio",
)


class WebhookDelivery(Construct):
    """Queue, DLQ, subscription, dispatcher and secrets key of per-job webhooks.

    Args:
        topic: the job events topic.
        table: the job table (webhook delivery state on the job records).
        environment: the common Lambda environment (table name, ...).
        function_props: layer, log retention and removal policy for :class:`PythonFunction`.
        reserved_concurrency: the dispatcher's reserved concurrency (and its SQS event source's
            maximum concurrency, so the source never invokes it into throttling): webhooks get
            that many concurrent batches whatever the API's long polls use, and never more.
            0: no reservation and no maximum (accounts whose concurrency quota is too small to
            reserve any: AWS keeps at least 100 unreserved).
        removal_policy: of the secrets key (RETAIN keeps tenants' secrets readable with the data).

    The dispatcher runs outside any VPC (defence in depth against SSRF: it has no route into a
    private network even if an address check failed). Tenants' secrets (in the job table, which
    every function reads) are KMS ciphertexts that only the dispatcher and the functions given to
    :meth:`grant_secrets` (the API) may decrypt.
    """

    def __init__(
        self,
        scope: Construct,
        id: str,
        *,
        topic: sns.ITopic,
        table: dynamodb.ITable,
        environment: Mapping[str, str],
        function_props: Mapping[str, Any],
        reserved_concurrency: int = DEFAULT_RESERVED_CONCURRENCY,
        removal_policy: RemovalPolicy = RemovalPolicy.RETAIN,
    ) -> None:
        super().__init__(scope, id)
        self.secrets_key = kms.Key(
            self,
            "SecretsKey",
            description="asyncinfer webhook signing secrets (the API and the dispatcher only)",
            enable_key_rotation=True,
            removal_policy=removal_policy,
            policy=iam.PolicyDocument(
                statements=[
                    iam.PolicyStatement(
                        sid="KeyAdministrationOnly",
                        principals=[iam.AccountRootPrincipal()],
                        actions=list(SECRETS_KEY_ADMIN_ACTIONS),
                        resources=["*"],
                    )
                ]
            ),
        )
        self.dlq = sqs.Queue(
            self,
            "Dlq",
            encryption=sqs.QueueEncryption.SQS_MANAGED,
            enforce_ssl=True,
            retention_period=Duration.days(14),
        )
        self.queue = sqs.Queue(
            self,
            "Queue",
            encryption=sqs.QueueEncryption.SQS_MANAGED,
            enforce_ssl=True,
            retention_period=Duration.seconds(queues.RETENTION_SECONDS),
            visibility_timeout=QUEUE_VISIBILITY,
            dead_letter_queue=sqs.DeadLetterQueue(
                queue=self.dlq, max_receive_count=SAFETY_MAX_RECEIVES
            ),
        )
        # Only events of jobs and batches with a webhook (the has_webhook attribute): others
        # never queue ahead of a tenant's deliveries (core.topology.WEBHOOK_ATTRIBUTE).
        topic.add_subscription(
            subs.SqsSubscription(
                self.queue,
                raw_message_delivery=True,
                filter_policy={
                    k: sns.SubscriptionFilter.string_filter(allowlist=v)
                    for k, v in topology.QUEUES["webhooks"].filter_policy().items()
                },
            )
        )
        self.function: lambda_.Function = PythonFunction(
            self,
            "Dispatcher",
            code="webhooks",
            service="asyncinfer-webhooks",
            environment={
                **environment,
                ev.WEBHOOK_QUEUE_URL: self.queue.queue_url,
                ev.WEBHOOK_DLQ_URL: self.dlq.queue_url,
            },
            timeout=DISPATCHER_TIMEOUT,
            description="asyncinfer webhook dispatcher (signed, SSRF-checked, retried 24 h)",
            vendored=VENDORED,
            **function_props,
        ).function
        cfn_function = self.function.node.default_child
        assert isinstance(cfn_function, lambda_.CfnFunction)
        if reserved_concurrency:
            cfn_function.reserved_concurrent_executions = reserved_concurrency
        table.grant_read_write_data(self.function)
        self.grant_secrets(self.function)
        self.queue.grant(self.function, "sqs:ChangeMessageVisibility")
        self.dlq.grant_send_messages(self.function)
        self.function.add_event_source(
            sources.SqsEventSource(
                self.queue,
                batch_size=queues.BATCH_SIZE,
                report_batch_item_failures=True,
                max_concurrency=reserved_concurrency or None,
            )
        )
        self.dlq_alarm = self.dlq.metric_approximate_number_of_messages_visible(
            period=Duration.minutes(1), statistic="Maximum"
        ).create_alarm(
            self,
            "DlqNotEmpty",
            alarm_description="webhook events that could not be delivered",
            threshold=0,
            comparison_operator=cloudwatch.ComparisonOperator.GREATER_THAN_THRESHOLD,
            evaluation_periods=1,
            treat_missing_data=cloudwatch.TreatMissingData.NOT_BREACHING,
        )

    def grant_secrets(self, function: lambda_.Function) -> None:
        """Let ``function`` encrypt and decrypt tenants' secrets (:data:`SECRETS_ACTIONS` on the
        secrets key, under the secrets' encryption context only) and tell it the key. Only the
        dispatcher and the API get this."""
        role = function.role
        assert role is not None
        self.secrets_key.add_to_resource_policy(
            iam.PolicyStatement(
                principals=[iam.ArnPrincipal(role.role_arn)],
                actions=list(SECRETS_ACTIONS),
                resources=["*"],
                conditions=SECRETS_CONDITION,
            )
        )
        function.add_to_role_policy(
            iam.PolicyStatement(
                actions=list(SECRETS_ACTIONS),
                resources=[self.secrets_key.key_arn],
                conditions=SECRETS_CONDITION,
            )
        )
        function.add_environment(ev.WEBHOOK_SECRETS_KEY, self.secrets_key.key_arn)
