"""Creates the AWS resources of the service on an endpoint (the emulator), shaped as the CDK app
shapes them in AWS: the job table (keys, GSI, TTL), the bucket, the events topic, a queue per
model with its dead-letter queue (redrive policy with maxReceiveCount), the webhook queues and
the KMS key of the webhook secrets."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from asyncinfer import clients
from asyncinfer.jobs.record import (
    OUTBOX_INDEX,
    OUTBOX_MARK_FIELD,
    OUTBOX_SINCE_FIELD,
    QUEUED_INDEX,
    RUNNING_INDEX,
    TENANT_INDEX,
)
from asyncinfer.settings import Settings
from asyncinfer.webhooks.queues import create_webhook_queues
from asyncinfer.webhooks.secrets import create_secrets_key

#: SQS message retention, seconds: longer than the largest job TTL (259200 s), as in AWS.
MESSAGE_RETENTION_SECONDS = 4 * 24 * 3600


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
            }
        )

    def env(self) -> dict[str, str]:
        """The environment variables that point components at these resources."""
        return {
            "ASYNCINFER_TABLE": self.table,
            "ASYNCINFER_BUCKET": self.bucket,
            "ASYNCINFER_TOPIC_ARN": self.topic_arn,
            "ASYNCINFER_QUEUE_URLS": json.dumps(self.queues),
            "ASYNCINFER_MODELS": ",".join(self.models),
            "ASYNCINFER_WEBHOOK_QUEUE_URL": self.webhook_queue,
            "ASYNCINFER_WEBHOOK_DLQ_URL": self.webhook_dlq,
            "ASYNCINFER_WEBHOOK_SECRETS_KEY": self.webhook_secrets_key,
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

    table = f"{prefix}-jobs"
    existing = ddb.list_tables().get("TableNames", [])
    if table not in existing:
        ddb.create_table(
            TableName=table,
            BillingMode="PAY_PER_REQUEST",
            AttributeDefinitions=[
                {"AttributeName": "job_id", "AttributeType": "S"},
                {"AttributeName": "tenant", "AttributeType": "S"},
                {"AttributeName": "queued_mark", "AttributeType": "S"},
                {"AttributeName": "expires_epoch", "AttributeType": "N"},
                {"AttributeName": "running_mark", "AttributeType": "S"},
                {"AttributeName": "lease_expires_epoch", "AttributeType": "N"},
                {"AttributeName": OUTBOX_MARK_FIELD, "AttributeType": "S"},
                {"AttributeName": OUTBOX_SINCE_FIELD, "AttributeType": "N"},
            ],
            KeySchema=[{"AttributeName": "job_id", "KeyType": "HASH"}],
            GlobalSecondaryIndexes=[
                {
                    "IndexName": TENANT_INDEX,
                    "KeySchema": [
                        {"AttributeName": "tenant", "KeyType": "HASH"},
                        {"AttributeName": "job_id", "KeyType": "RANGE"},
                    ],
                    "Projection": {"ProjectionType": "ALL"},
                },
                {
                    "IndexName": QUEUED_INDEX,
                    "KeySchema": [
                        {"AttributeName": "queued_mark", "KeyType": "HASH"},
                        {"AttributeName": "expires_epoch", "KeyType": "RANGE"},
                    ],
                    "Projection": {"ProjectionType": "KEYS_ONLY"},
                },
                {
                    "IndexName": RUNNING_INDEX,
                    "KeySchema": [
                        {"AttributeName": "running_mark", "KeyType": "HASH"},
                        {"AttributeName": "lease_expires_epoch", "KeyType": "RANGE"},
                    ],
                    "Projection": {"ProjectionType": "KEYS_ONLY"},
                },
                {
                    "IndexName": OUTBOX_INDEX,
                    "KeySchema": [
                        {"AttributeName": OUTBOX_MARK_FIELD, "KeyType": "HASH"},
                        {"AttributeName": OUTBOX_SINCE_FIELD, "KeyType": "RANGE"},
                    ],
                    "Projection": {"ProjectionType": "KEYS_ONLY"},
                },
            ],
        )
        ddb.update_time_to_live(
            TableName=table, TimeToLiveSpecification={"Enabled": True, "AttributeName": "ttl"}
        )

    bucket = f"{prefix}-payloads"
    s3.create_bucket(Bucket=bucket)

    topic_arn = sns.create_topic(Name=f"{prefix}-events")["TopicArn"]
    res = Resources(table=table, bucket=bucket, topic_arn=topic_arn)

    for model in models:
        dlq_url = sqs.create_queue(
            QueueName=f"{prefix}-{model}-dlq",
            Attributes={"MessageRetentionPeriod": str(14 * 24 * 3600)},
        )["QueueUrl"]
        dlq_arn = _arn(sqs, dlq_url)
        attrs: dict[str, Any] = {
            "VisibilityTimeout": str(settings.visibility_timeout_seconds),
            "MessageRetentionPeriod": str(MESSAGE_RETENTION_SECONDS),
            "ReceiveMessageWaitTimeSeconds": "20",
            "RedrivePolicy": json.dumps(
                {"deadLetterTargetArn": dlq_arn, "maxReceiveCount": settings.max_receive_count}
            ),
        }
        for priority in ("normal", "high", "low"):
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
    # The KMS key that encrypts tenants' webhook signing secrets (as in AWS).
    kms = clients.client("kms", settings)
    res.webhook_secrets_key = create_secrets_key(kms, f"alias/{prefix}-webhook-secrets")
    return res


def _arn(sqs: Any, url: str) -> str:
    arn: str = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"][
        "QueueArn"
    ]
    return arn
