"""Creates the AWS resources of the service on an endpoint (the emulator), shaped as the CDK app
shapes them in AWS: the job table (keys, GSI, TTL), the bucket, the events topic, a queue per
model with its dead-letter queue (redrive policy with maxReceiveCount), the webhook queues, the
OpenAI batch queues and the KMS key of the webhook secrets. Keys, indexes and queue attributes
come from :mod:`asyncinfer.core.topology`, which the CDK app reads too."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from asyncinfer.aws import clients
from asyncinfer.core import envvars as ev
from asyncinfer.core import topology
from asyncinfer.core.settings import Settings
from asyncinfer.openai_api.queues import create_batch_queues
from asyncinfer.webhooks.queues import create_webhook_queues
from asyncinfer.webhooks.secrets import create_secrets_key

#: SQS message retention, seconds: longer than the largest job TTL (259200 s), as in AWS.
MESSAGE_RETENTION_SECONDS = topology.JOB_QUEUE_RETENTION_SECONDS
#: Visibility timeout of the batch queues on the emulator, seconds: the topology's one
#: documented local override (AWS: six times the consumer's timeout).
BATCH_LOCAL_VISIBILITY = topology.BATCH_LOCAL_VISIBILITY_SECONDS


@dataclass
class Resources:
    """Names and URLs of created resources (what ``local.json`` reports)."""

    table: str
    bucket: str
    topic_arn: str
    queues: dict[str, str] = field(default_factory=dict)
    dlqs: dict[str, str] = field(default_factory=dict)
    event_log_queue: str = ""
    webhook_queue: str = ""
    webhook_dlq: str = ""
    webhook_secrets_key: str = ""
    batch_queue: str = ""
    batch_dlq: str = ""
    batch_events_queue: str = ""
    batch_events_dlq: str = ""

    @property
    def models(self) -> list[str]:
        """The model ids with queues (the keys of ``queues`` that name no priority class)."""
        return [m for m in self.queues if "#" not in m]

    def settings(self, base: Settings) -> Settings:
        """``base`` pointed at these resources (table, bucket, topic, queues, models): what a
        process given :meth:`env` would read, for code that builds its settings in process."""
        return base.model_copy(
            update={
                "table_name": self.table,
                "bucket": self.bucket,
                "topic_arn": self.topic_arn,
                "queue_urls": self.queues,
                "models": self.models,
                "webhook_secrets_key": self.webhook_secrets_key,
                "batch_queue_url": self.batch_queue,
                "batch_events_queue_url": self.batch_events_queue,
            }
        )

    def env(self) -> dict[str, str]:
        """The environment variables that point components at these resources."""
        return {
            ev.TABLE: self.table,
            ev.BUCKET: self.bucket,
            ev.TOPIC_ARN: self.topic_arn,
            ev.QUEUE_URLS: json.dumps(self.queues),
            ev.MODELS: ",".join(self.models),
            ev.WEBHOOK_QUEUE_URL: self.webhook_queue,
            ev.WEBHOOK_DLQ_URL: self.webhook_dlq,
            ev.WEBHOOK_SECRETS_KEY: self.webhook_secrets_key,
            ev.BATCH_QUEUE_URL: self.batch_queue,
            ev.BATCH_EVENTS_QUEUE_URL: self.batch_events_queue,
        }


def create_resources(
    settings: Settings,
    models: list[str],
    *,
    prefix: str = "asyncinfer",
    event_log: bool = True,
) -> Resources:
    """Create every resource for ``models`` through ``settings``' endpoint; idempotent.

    Each model gets three queues, one per priority class (``<prefix>-<model>`` for normal,
    ``-high`` and ``-low``; ``queues`` keys ``<model>``, ``<model>#high``, ``<model>#low``), all
    with ``settings.visibility_timeout_seconds`` and a redrive policy to the model's one DLQ with
    ``settings.max_receive_count``. With ``event_log``, an SQS queue subscribed to the topic
    (raw delivery) receives every job event, as a user's subscription would.
    """
    ddb = clients.client("dynamodb", settings)
    s3 = clients.client("s3", settings)
    sns = clients.client("sns", settings)
    sqs = clients.client("sqs", settings)

    spec = topology.JOB_TABLE
    table = f"{prefix}-{spec.suffix}"
    existing = ddb.list_tables().get("TableNames", [])
    if table not in existing:
        ddb.create_table(
            TableName=table,
            BillingMode="PAY_PER_REQUEST",
            AttributeDefinitions=[
                {"AttributeName": k.name, "AttributeType": k.type}
                for k in spec.attribute_definitions()
            ],
            KeySchema=_key_schema(spec.partition, None),
            GlobalSecondaryIndexes=[
                {
                    "IndexName": index.name,
                    "KeySchema": _key_schema(index.partition, index.sort),
                    "Projection": {"ProjectionType": index.projection},
                }
                for index in spec.indexes
            ],
        )
        ddb.update_time_to_live(
            TableName=table,
            TimeToLiveSpecification={"Enabled": True, "AttributeName": spec.ttl_attribute},
        )

    bucket = f"{prefix}-payloads"
    s3.create_bucket(Bucket=bucket)

    topic_arn = sns.create_topic(Name=f"{prefix}-events")["TopicArn"]
    res = Resources(table=table, bucket=bucket, topic_arn=topic_arn)

    job_queue, job_dlq = topology.QUEUES["jobs"], topology.QUEUES["jobs-dlq"]
    for model in models:
        dlq_url = sqs.create_queue(
            QueueName=f"{prefix}-{model}-dlq", Attributes=job_dlq.attributes()
        )["QueueUrl"]
        attrs = job_queue.attributes(
            visibility_timeout=settings.visibility_timeout_seconds,
            max_receive_count=settings.max_receive_count,
            dlq_arn=_arn(sqs, dlq_url),
        )
        for priority in topology.PRIORITIES:
            suffix = "" if priority == "normal" else f"-{priority}"
            key = model if priority == "normal" else f"{model}#{priority}"
            res.queues[key] = sqs.create_queue(
                QueueName=f"{prefix}-{model}{suffix}", Attributes=attrs
            )["QueueUrl"]
        res.dlqs[model] = dlq_url

    if event_log:
        url = sqs.create_queue(QueueName=f"{prefix}-events-log")["QueueUrl"]
        sns.subscribe(
            TopicArn=topic_arn,
            Protocol="sqs",
            Endpoint=_arn(sqs, url),
            Attributes={"RawMessageDelivery": "true"},
        )
        res.event_log_queue = url
    # The webhook dispatcher's queue (subscribed to the topic) and its dead-letter queue.
    res.webhook_queue, res.webhook_dlq = create_webhook_queues(sqs, sns, topic_arn, prefix)
    # The OpenAI batch expander's queue and the batch-events queue (subscribed to the topic).
    batch = create_batch_queues(sqs, sns, topic_arn, prefix, local=True)
    res.batch_queue, res.batch_dlq = batch["queue"], batch["dlq"]
    res.batch_events_queue, res.batch_events_dlq = batch["events"], batch["events_dlq"]
    # The KMS key that encrypts tenants' webhook signing secrets (as in AWS).
    kms = clients.client("kms", settings)
    res.webhook_secrets_key = create_secrets_key(kms, f"alias/{prefix}-webhook-secrets")
    return res


def _key_schema(partition: topology.Key, sort: topology.Key | None) -> list[dict[str, str]]:
    """A DynamoDB ``KeySchema``: the partition (HASH) key and, if any, the sort (RANGE) key."""
    out = [{"AttributeName": partition.name, "KeyType": "HASH"}]
    if sort is not None:
        out.append({"AttributeName": sort.name, "KeyType": "RANGE"})
    return out


def _arn(sqs: Any, url: str) -> str:
    arn: str = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"][
        "QueueArn"
    ]
    return arn
