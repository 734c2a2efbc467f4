"""Webhook delivery: an SQS queue subscribed to the events topic (raw delivery) feeding the
dispatcher Lambda (:mod:`asyncinfer.webhooks.dispatcher`), and the webhook dead-letter queue
where events go after the retry window (24 h by default)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from aws_cdk import Duration
from aws_cdk import aws_cloudwatch as cloudwatch
from aws_cdk import aws_dynamodb as dynamodb
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_lambda_event_sources as sources
from aws_cdk import aws_sns as sns
from aws_cdk import aws_sns_subscriptions as subs
from aws_cdk import aws_sqs as sqs
from constructs import Construct

from infra.components.function import PythonFunction

#: The dispatcher sends up to 10 events of at most 10 s each per batch.
DISPATCHER_TIMEOUT = Duration.seconds(150)
#: Visibility timeout of the webhook queue: six times the dispatcher's timeout, as the Lambda
#: developer guide advises for SQS event sources (retries then set their own visibility).
QUEUE_VISIBILITY = Duration.seconds(6 * 150)
#: Receives before SQS itself dead-letters an event: a safety net for a crashing dispatcher; the
#: dispatcher moves events to the DLQ after the retry window on its own.
SAFETY_MAX_RECEIVES = 100
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
    """Queue, DLQ, subscription and dispatcher of per-job webhooks.

    Args:
        topic: the job events topic.
        table: the job table (webhook state, tenant secrets).
        environment: the common Lambda environment (table name, ...).
        function_props: layer, log retention and removal policy for :class:`PythonFunction`.

    The dispatcher runs outside any VPC (defence in depth against SSRF: it has no route into a
    private network even if an address check failed).
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
    ) -> None:
        super().__init__(scope, id)
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
            retention_period=Duration.days(14),
            visibility_timeout=QUEUE_VISIBILITY,
            dead_letter_queue=sqs.DeadLetterQueue(
                queue=self.dlq, max_receive_count=SAFETY_MAX_RECEIVES
            ),
        )
        topic.add_subscription(subs.SqsSubscription(self.queue, raw_message_delivery=True))
        self.function: lambda_.Function = PythonFunction(
            self,
            "Dispatcher",
            code="webhooks",
            service="asyncinfer-webhooks",
            environment={
                **environment,
                "ASYNCINFER_WEBHOOK_QUEUE_URL": self.queue.queue_url,
                "ASYNCINFER_WEBHOOK_DLQ_URL": self.dlq.queue_url,
            },
            timeout=DISPATCHER_TIMEOUT,
            description="asyncinfer webhook dispatcher (signed, SSRF-checked, retried 24 h)",
            vendored=VENDORED,
            **function_props,
        ).function
        table.grant_read_write_data(self.function)
        self.queue.grant(self.function, "sqs:ChangeMessageVisibility")
        self.dlq.grant_send_messages(self.function)
        self.function.add_event_source(
            sources.SqsEventSource(self.queue, batch_size=10, report_batch_item_failures=True)
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
