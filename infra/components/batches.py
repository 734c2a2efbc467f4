"""OpenAI batches (spec openai.md, "Batches"): the batch queue feeding the expander Lambda
(:mod:`asyncinfer.openai_api.expansion`), the batch-events queue (subscribed to the events
topic, terminal job events only) feeding the line counter and finalizer
(:mod:`asyncinfer.openai_api.finalize`), their dead-letter queues, and the alarms on stuck
batches. Queue shapes and timeouts come from :mod:`asyncinfer.openai_api.queues`, which the
local stack reads too."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from aws_cdk import Duration
from aws_cdk import aws_cloudwatch as cloudwatch
from aws_cdk import aws_dynamodb as dynamodb
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_lambda_event_sources as sources
from aws_cdk import aws_s3 as s3
from aws_cdk import aws_sns as sns
from aws_cdk import aws_sns_subscriptions as subs
from aws_cdk import aws_sqs as sqs
from constructs import Construct

from asyncinfer.openai_api import queues
from infra.components.function import PythonFunction

#: A batch-queue message older than this means a batch's expansion or checks are stuck, seconds
#: (checks wait at most 15 minutes in the queue by design: SQS's largest delay).
STUCK_SECONDS = 3600
#: Records per counter invocation (SQS event source batch size).
COUNTER_BATCH_SIZE = 10


def _queue(scope: Construct, id: str, visibility: int) -> tuple[sqs.Queue, sqs.Queue]:
    dlq = sqs.Queue(
        scope,
        f"{id}Dlq",
        encryption=sqs.QueueEncryption.SQS_MANAGED,
        enforce_ssl=True,
        retention_period=Duration.seconds(queues.RETENTION_SECONDS),
    )
    queue = sqs.Queue(
        scope,
        id,
        encryption=sqs.QueueEncryption.SQS_MANAGED,
        enforce_ssl=True,
        retention_period=Duration.seconds(queues.RETENTION_SECONDS),
        visibility_timeout=Duration.seconds(visibility),
        dead_letter_queue=sqs.DeadLetterQueue(
            queue=dlq, max_receive_count=queues.MAX_RECEIVE_COUNT
        ),
    )
    return queue, dlq


class BatchProcessing(Construct):
    """Queues, functions, grants and alarms of OpenAI batches.

    Args:
        topic: the job events topic (the counter subscribes; both functions publish batch events).
        table: the job table (batch records and lines live beside the jobs).
        bucket: the payload bucket (files, chunks, outputs).
        environment: the common Lambda environment.
        function_props: layer, log retention, removal policy, catalogue for
            :class:`PythonFunction`.
        grant_submit: grants a function what submitting a job takes beyond the table, bucket and
            topic (send to every job queue, wake-on-submit): the stack's own grants of the API.
    """

    def __init__(
        self,
        scope: Construct,
        id: str,
        *,
        topic: sns.ITopic,
        table: dynamodb.ITable,
        bucket: s3.IBucket,
        environment: Mapping[str, str],
        function_props: Mapping[str, Any],
        grant_submit: Callable[[lambda_.IFunction], None],
    ) -> None:
        super().__init__(scope, id)
        self.queue, self.dlq = _queue(self, "Queue", queues.VISIBILITY_TIMEOUT_SECONDS)
        self.events_queue, self.events_dlq = _queue(
            self, "EventsQueue", queues.EVENTS_VISIBILITY_TIMEOUT_SECONDS
        )
        topic.add_subscription(
            subs.SqsSubscription(
                self.events_queue,
                raw_message_delivery=True,
                filter_policy={
                    "event_type": sns.SubscriptionFilter.string_filter(
                        allowlist=list(queues.TERMINAL_JOB_EVENTS)
                    )
                },
            )
        )
        env = {
            **environment,
            "ASYNCINFER_BATCH_QUEUE_URL": self.queue.queue_url,
            "ASYNCINFER_BATCH_EVENTS_QUEUE_URL": self.events_queue.queue_url,
        }
        self.expander: lambda_.Function = PythonFunction(
            self,
            "Expander",
            code="openai_batches",
            service="asyncinfer-openai-batches",
            environment=env,
            timeout=Duration.seconds(queues.EXPANDER_TIMEOUT_SECONDS),
            memory_mib=1024,
            description="asyncinfer OpenAI batch expander (validate, expand into jobs, expiry)",
            **function_props,
        ).function
        self.counter: lambda_.Function = PythonFunction(
            self,
            "Counter",
            code="openai_batch_counter",
            service="asyncinfer-openai-batch-counter",
            environment=env,
            timeout=Duration.seconds(queues.FINALIZER_TIMEOUT_SECONDS),
            memory_mib=2048,
            description="asyncinfer OpenAI batch line counter and finalizer",
            **function_props,
        ).function
        for fn in (self.expander, self.counter):
            table.grant_read_write_data(fn)
            bucket.grant_read_write(fn)
            topic.grant_publish(fn)
            self.queue.grant_send_messages(fn)
        grant_submit(self.expander)
        self.expander.add_event_source(
            sources.SqsEventSource(self.queue, batch_size=1, report_batch_item_failures=True)
        )
        self.counter.add_event_source(
            sources.SqsEventSource(
                self.events_queue,
                batch_size=COUNTER_BATCH_SIZE,
                report_batch_item_failures=True,
            )
        )
        self.alarms: list[cloudwatch.Alarm] = []
        for name, q in (("Batch", self.queue), ("BatchEvents", self.events_queue)):
            self.alarms.append(
                q.metric_approximate_age_of_oldest_message(
                    period=Duration.minutes(5), statistic="Maximum"
                ).create_alarm(
                    self,
                    f"{name}Stuck",
                    alarm_description=f"OpenAI batches stuck: {name} queue's oldest message "
                    f"is older than {STUCK_SECONDS} s",
                    threshold=STUCK_SECONDS,
                    comparison_operator=cloudwatch.ComparisonOperator.GREATER_THAN_THRESHOLD,
                    evaluation_periods=1,
                    treat_missing_data=cloudwatch.TreatMissingData.NOT_BREACHING,
                )
            )
        for name, q in (("BatchDlq", self.dlq), ("BatchEventsDlq", self.events_dlq)):
            self.alarms.append(
                q.metric_approximate_number_of_messages_visible(
                    period=Duration.minutes(1), statistic="Maximum"
                ).create_alarm(
                    self,
                    f"{name}NotEmpty",
                    alarm_description=f"OpenAI batch operations given up ({name})",
                    threshold=0,
                    comparison_operator=cloudwatch.ComparisonOperator.GREATER_THAN_THRESHOLD,
                    evaluation_periods=1,
                    treat_missing_data=cloudwatch.TreatMissingData.NOT_BREACHING,
                )
            )

    def grant_create(self, function: lambda_.Function) -> None:
        """Let ``function`` (the API) start batches: send to the batch queue, and know it."""
        self.queue.grant_send_messages(function)
        function.add_environment("ASYNCINFER_BATCH_QUEUE_URL", self.queue.queue_url)
