"""OpenAI batches (spec openai.md, "Batches"): the batch queue feeding the expander Lambda
(:mod:`asyncinfer.openai_api.expansion`), the batch-events queue (subscribed to the events
topic, terminal job events only) feeding the line counter and finalizer
(:mod:`asyncinfer.openai_api.finalize`), their dead-letter queues, and the alarms on stuck
batches. Queue shapes, triggers and timeouts come from the topology
(:mod:`asyncinfer.core.topology`, through :mod:`asyncinfer.openai_api.queues`), which the local
stack reads too."""

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

from asyncinfer.core import envvars as ev
from asyncinfer.core import topology
from asyncinfer.openai_api import queues
from infra.components import bucket_access
from infra.components.function import PythonFunction

#: A batch-queue message older than this means a batch's expansion or checks are stuck, seconds
#: (checks wait at most 15 minutes in the queue by design: SQS's largest delay).
STUCK_SECONDS = 3600
#: Records per counter invocation (SQS event source batch size; the topology's).
COUNTER_BATCH_SIZE = queues.COUNTER_BATCH_SIZE


def _sqs_queue(scope: Construct, id: str, spec: topology.Queue, **kwargs: Any) -> sqs.Queue:
    """An SQS queue with the topology's retention and visibility timeout (``spec``)."""
    assert spec.visibility_timeout_seconds is not None
    return sqs.Queue(
        scope,
        id,
        encryption=sqs.QueueEncryption.SQS_MANAGED,
        enforce_ssl=True,
        retention_period=Duration.seconds(spec.retention_seconds),
        visibility_timeout=Duration.seconds(spec.visibility_timeout_seconds),
        **kwargs,
    )


def _queue(scope: Construct, id: str, name: str) -> tuple[sqs.Queue, sqs.Queue]:
    """The topology's queue ``name`` and its dead-letter queue."""
    spec = topology.QUEUES[name]
    assert spec.dead_letter is not None and spec.max_receive_count is not None
    dlq = _sqs_queue(scope, f"{id}Dlq", topology.QUEUES[spec.dead_letter])
    queue = _sqs_queue(
        scope,
        id,
        spec,
        dead_letter_queue=sqs.DeadLetterQueue(queue=dlq, max_receive_count=spec.max_receive_count),
    )
    return queue, dlq


class BatchProcessing(Construct):
    """Queues, functions, grants and alarms of OpenAI batches.

    Args:
        topic: the job events topic (the counter subscribes; both functions publish batch events).
        table: the job table (batch records and lines live beside the jobs).
        bucket: the payload bucket (files, chunks, outputs; each function gets its prefixes,
            :mod:`infra.components.bucket_access`).
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
        expander_spec = topology.FUNCTIONS["openai_batches"]
        counter_spec = topology.FUNCTIONS["openai_batch_counter"]
        expander_trigger = expander_spec.sqs_trigger()
        counter_trigger = counter_spec.sqs_trigger()
        self.queue, self.dlq = _queue(self, "Queue", expander_trigger.queue)
        self.events_queue, self.events_dlq = _queue(self, "EventsQueue", counter_trigger.queue)
        topic.add_subscription(
            subs.SqsSubscription(
                self.events_queue,
                raw_message_delivery=True,
                filter_policy={
                    topology.EVENT_TYPE_ATTRIBUTE: sns.SubscriptionFilter.string_filter(
                        allowlist=list(topology.QUEUES[counter_trigger.queue].event_types)
                    )
                },
            )
        )
        env = {
            **environment,
            ev.BATCH_QUEUE_URL: self.queue.queue_url,
            ev.BATCH_EVENTS_QUEUE_URL: self.events_queue.queue_url,
        }
        self.expander: lambda_.Function = PythonFunction(
            self,
            "Expander",
            code=expander_spec.code,
            service=expander_spec.service,
            environment=env,
            timeout=Duration.seconds(expander_spec.timeout_seconds),
            memory_mib=1024,
            description="asyncinfer OpenAI batch expander (validate, expand into jobs, expiry)",
            **function_props,
        ).function
        self.counter: lambda_.Function = PythonFunction(
            self,
            "Counter",
            code=counter_spec.code,
            service=counter_spec.service,
            environment=env,
            timeout=Duration.seconds(counter_spec.timeout_seconds),
            memory_mib=2048,
            description="asyncinfer OpenAI batch line counter and finalizer",
            **function_props,
        ).function
        for fn, access in (
            (self.expander, bucket_access.BATCH_EXPANDER),
            (self.counter, bucket_access.BATCH_COUNTER),
        ):
            table.grant_read_write_data(fn)
            # Their prefixes only (issue 14, least privilege): infra.components.bucket_access.
            bucket_access.grant(bucket, fn, access)
            topic.grant_publish(fn)
            self.queue.grant_send_messages(fn)
        grant_submit(self.expander)
        for fn, queue, trigger in (
            (self.expander, self.queue, expander_trigger),
            (self.counter, self.events_queue, counter_trigger),
        ):
            fn.add_event_source(
                sources.SqsEventSource(
                    queue,
                    batch_size=trigger.batch_size,
                    max_batching_window=Duration.seconds(trigger.max_batching_window_seconds)
                    if trigger.max_batching_window_seconds
                    else None,
                    report_batch_item_failures=trigger.report_batch_item_failures,
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
        function.add_environment(ev.BATCH_QUEUE_URL, self.queue.queue_url)
