"""The asyncinfer stack: API -> queues -> compute (ECS or SageMaker) -> table, bucket, events.

Boundaries, top to bottom:

* data: :class:`~infra.components.storage.JobTable`, :class:`~infra.components.storage.DataBucket`,
  the events topic;
* intake (:mod:`infra.stack_intake`): per-model queues and DLQs, the REST API and its Lambda,
  the DLQ handler, the sweeper, webhooks, OpenAI batches;
* compute (:mod:`infra.stack_compute`): :class:`~infra.components.ecs_workers.EcsWorkers` plus
  the backlog metric Lambda, or :class:`~infra.components.sagemaker_endpoints.SageMakerEndpoints`
  plus the bridge and completion Lambdas;
* observability: :class:`~infra.components.monitoring.Monitoring`.

Every part builds in this stack's own scope, so logical ids do not depend on the module a part
is written in (:mod:`infra.stack_parts` holds what they share).
"""

from __future__ import annotations

from typing import Any

from aws_cdk import CfnOutput, Duration, RemovalPolicy, Stack
from aws_cdk import aws_cloudwatch as cloudwatch
from aws_cdk import aws_cloudwatch_actions as cw_actions
from aws_cdk import aws_dynamodb as dynamodb
from aws_cdk import aws_ecr_assets as ecr_assets
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_s3 as s3
from aws_cdk import aws_sns as sns
from aws_cdk import aws_sns_subscriptions as subs
from constructs import Construct

from asyncinfer.core import envvars as ev
from asyncinfer.core import naming
from infra.components.api import JobsApi
from infra.components.batches import BatchProcessing
from infra.components.ecs_workers import EcsWorkers, image_excludes
from infra.components.function import powertools_layer
from infra.components.messaging import EncryptedTopics, ModelQueues
from infra.components.model_scopes import ModelScopes
from infra.components.monitoring import Monitoring
from infra.components.sagemaker_endpoints import SageMakerEndpoints
from infra.components.storage import DataBucket, JobTable
from infra.components.webhooks import WebhookDelivery
from infra.config import REPO_ROOT, DeployConfig, DeployConfigError
from infra.nag import add_suppressions
from infra.stack_compute import WORKER_MEMORY_MIB, add_ecs_compute, add_sagemaker_compute
from infra.stack_intake import API_TIMEOUT, add_api, add_background
from infra.stack_parts import IMAGE_ROOT, StackParts, retention, worker_models_file

__all__ = [
    "API_TIMEOUT",
    "IMAGE_ROOT",
    "WORKER_MEMORY_MIB",
    "AsyncInferStack",
    "worker_models_file",
]


class AsyncInferStack(Stack):
    """Everything ``cdk deploy`` stands up for one ``DeployConfig``.

    Args:
        config: validated deployment settings.
        kwargs: passed to :class:`aws_cdk.Stack` (env, stack name, ...).

    Raises:
        DeployConfigError: the resource prefix and model ids break AWS's naming limits
            (:func:`asyncinfer.core.naming.problems`).
    """

    # Built by the parts (infra.stack_intake, infra.stack_compute) in this stack's scope.
    api_fn: lambda_.Function
    authorizer_fn: lambda_.Function
    api: JobsApi
    dlq_fn: lambda_.Function
    sweeper_fn: lambda_.Function
    webhooks: WebhookDelivery
    batches: BatchProcessing
    #: compute=ecs only.
    ecs: EcsWorkers
    backlog_fn: lambda_.Function
    #: compute=sagemaker only.
    sagemaker: SageMakerEndpoints
    bridge_fn: lambda_.Function
    completion_fn: lambda_.Function

    def __init__(self, scope: Construct, id: str, *, config: DeployConfig, **kwargs: Any) -> None:
        super().__init__(scope, id, **kwargs)
        self.config = config
        cfg = config
        models = list(cfg.models)
        self.prefix = prefix = cfg.prefix_for(self.stack_name)
        naming_problems = naming.problems(prefix, models)
        if naming_problems:
            raise DeployConfigError(naming_problems)
        removal = RemovalPolicy.RETAIN if cfg.retain_data else RemovalPolicy.DESTROY
        log_retention = retention(cfg.log_retention_days)
        reserved = cfg.reserved_concurrency()
        layer = powertools_layer(self, cfg.powertools_layer_version)
        self.scopes = scopes = ModelScopes(self, models)

        # ---------------------------------------------------------------- data
        self.table: dynamodb.Table = JobTable(self, "Jobs", removal_policy=removal).table
        self.bucket: s3.Bucket = DataBucket(
            self,
            "Data",
            expiry_days=cfg.object_expiry_days,
            removal_policy=removal,
            auto_delete_objects=not cfg.retain_data,
        ).bucket
        topics = EncryptedTopics(self, "Topics")
        self.events_topic: sns.Topic = topics.topic("Events", display_name="asyncinfer job events")

        # ---------------------------------------------------------------- intake
        self.queues = ModelQueues(
            self,
            "Queues",
            models=models,
            prefix=prefix,
            visibility_timeout=Duration.seconds(cfg.visibility_timeout),
            max_receive_count=cfg.max_receive_count,
            dlq_visibility_timeout=Duration.seconds(6 * cfg.dlq_handler_timeout),
            scopes=scopes,
        )
        env = {
            ev.TABLE: self.table.table_name,
            ev.BUCKET: self.bucket.bucket_name,
            ev.TOPIC_ARN: self.events_topic.topic_arn,
            # Queue URLs, service and endpoint names follow from these (asyncinfer.core.naming): a
            # constant size, not a map growing per model (Lambda: 4 KB of environment in all).
            ev.RESOURCE_PREFIX: prefix,
            ev.QUEUE_URL_BASE: self.queues.url_base(),
            ev.MODELS: ",".join(models),
            ev.MAX_RECEIVE_COUNT: str(cfg.max_receive_count),
            ev.VISIBILITY_TIMEOUT: str(cfg.visibility_timeout),
            ev.HEARTBEAT_SECONDS: f"{cfg.effective_heartbeat:g}",
            ev.RECORD_RETENTION: str(cfg.record_retention_days * 86400),
            ev.COMPUTE: cfg.compute,
        }
        if cfg.input_locations:
            env[ev.INPUT_LOCATIONS] = ",".join(cfg.input_locations)
        fn_common: dict[str, Any] = {
            "models_file": cfg.models_path,
            "layer": layer,
            "log_retention": log_retention,
            "removal_policy": RemovalPolicy.DESTROY,
        }
        parts = StackParts(
            cfg=cfg,
            models=models,
            prefix=prefix,
            env=env,
            fn_common=fn_common,
            reserved=reserved,
            retention=log_retention,
            scopes=scopes,
            topics=topics,
        )
        add_api(self, parts)
        add_background(self, parts, removal)

        # ---------------------------------------------------------------- compute
        image = ecr_assets.DockerImageAsset(
            self,
            "WorkerImage",
            directory=str(REPO_ROOT),
            file=cfg.worker_dockerfile,
            exclude=list(image_excludes()),
            platform=ecr_assets.Platform.LINUX_AMD64,
        )
        workers_metric: dict[str, cloudwatch.IMetric]
        if cfg.compute == "ecs":
            workers_metric = add_ecs_compute(self, parts, image)
        else:
            workers_metric = add_sagemaker_compute(self, parts, image)

        # ---------------------------------------------------------------- observability
        alarm_topic: sns.ITopic | None = None
        if cfg.alarm_email:
            alarm_topic = topics.topic("Alarms", display_name="asyncinfer alarms")
            topics.allow_cloudwatch_alarms(alarm_topic)
            alarm_topic.add_subscription(subs.EmailSubscription(cfg.alarm_email))
        self.monitoring = Monitoring(
            self,
            "Monitoring",
            queues=self.queues.queues,
            dlqs=self.queues.dlqs,
            workers_metric=workers_metric,
            alarm_topic=alarm_topic,
            oldest_message_seconds=cfg.oldest_message_alarm_seconds,
            failure_rate_percent=cfg.failure_rate_alarm_percent,
            dashboard=cfg.dashboard,
            scopes=scopes,
        )

        if alarm_topic is not None:
            self.webhooks.dlq_alarm.add_alarm_action(cw_actions.SnsAction(alarm_topic))
            for alarm in self.batches.alarms:
                alarm.add_alarm_action(cw_actions.SnsAction(alarm_topic))

        CfnOutput(self, "ApiUrl", value=self.api.api.url_for_path("/v1"))
        CfnOutput(self, "ApiKeyId", value=self.api.default_key.key_id)
        CfnOutput(self, "EventsTopicArn", value=self.events_topic.topic_arn)
        CfnOutput(self, "TableName", value=self.table.table_name)
        CfnOutput(self, "BucketName", value=self.bucket.bucket_name)
        CfnOutput(self, "QueueUrls", value=self.queues.url_template())
        CfnOutput(self, "ResourcePrefix", value=prefix)
        add_suppressions(
            self,
            table=self.table,
            bucket=self.bucket,
            cluster=self.ecs.cluster if cfg.compute == "ecs" else None,
            asg=self.ecs.asg if cfg.compute == "ecs" else None,
            asgs=self.ecs.asgs if cfg.compute == "ecs" else (),
            weight_prefixes=[w for c in cfg.model_compute.values() for w in c.weight_prefixes],
        )
