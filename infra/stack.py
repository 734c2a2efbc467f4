"""The asyncinfer stack: API -> queues -> compute (ECS or SageMaker) -> table, bucket, events.

Boundaries, top to bottom:

* data: :class:`~infra.components.storage.JobTable`, :class:`~infra.components.storage.DataBucket`,
  the events topic;
* intake: per-model queues and DLQs, the REST API and its Lambda, the DLQ handler;
* compute: :class:`~infra.components.ecs_workers.EcsWorkers` plus the backlog metric Lambda, or
  :class:`~infra.components.sagemaker_endpoints.SageMakerEndpoints` plus the bridge and
  completion Lambdas;
* observability: :class:`~infra.components.monitoring.Monitoring`.
"""

from __future__ import annotations

import json
from typing import Any

from aws_cdk import CfnOutput, Duration, RemovalPolicy, Stack
from aws_cdk import aws_cloudwatch as cloudwatch
from aws_cdk import aws_cloudwatch_actions as cw_actions
from aws_cdk import aws_ecr_assets as ecr_assets
from aws_cdk import aws_events as events
from aws_cdk import aws_events_targets as targets
from aws_cdk import aws_iam as iam
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_logs as logs
from aws_cdk import aws_sns as sns
from aws_cdk import aws_sns_subscriptions as subs
from aws_cdk import aws_sqs as sqs
from constructs import Construct

from asyncinfer.core import envvars as ev
from asyncinfer.core import naming, topology
from infra.components.api import JobsApi
from infra.components.batches import BatchProcessing
from infra.components.ecs_workers import EcsWorkers, image_excludes
from infra.components.function import METRICS_NAMESPACE, PythonFunction, powertools_layer
from infra.components.inputs import grant_input_locations
from infra.components.messaging import CONSUME_ACTIONS, SEND_ACTIONS, EncryptedTopics, ModelQueues
from infra.components.model_scopes import ModelScopes
from infra.components.monitoring import Monitoring
from infra.components.sagemaker_endpoints import SageMakerEndpoints, endpoint_metric
from infra.components.sagemaker_engine import sagemaker_engines
from infra.components.storage import DataBucket, JobTable
from infra.components.webhooks import WebhookDelivery
from infra.config import LOG_RETENTION_DAYS, REPO_ROOT, DeployConfig, DeployConfigError
from infra.model_compute import grant_weight_read
from infra.nag import add_suppressions

#: Timeout of the API Lambda: API Gateway's integration timeout is 29 s (``?wait`` holds <= 20 s).
API_TIMEOUT = Duration.seconds(topology.FUNCTIONS["api"].timeout_seconds)
#: Worker soft memory reservation, MiB (fits a 16 GiB g4dn/g5 xlarge next to the ECS agent).
WORKER_MEMORY_MIB = 8192


class AsyncInferStack(Stack):
    """Everything ``cdk deploy`` stands up for one ``DeployConfig``.

    Args:
        config: validated deployment settings.
        kwargs: passed to :class:`aws_cdk.Stack` (env, stack name, ...).
    """

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
        retention = _retention(cfg.log_retention_days)
        reserved = cfg.reserved_concurrency()
        layer = powertools_layer(self, cfg.powertools_layer_version)
        self.scopes = scopes = ModelScopes(self, models)

        # ---------------------------------------------------------------- data
        self.table = JobTable(self, "Jobs", removal_policy=removal).table
        self.bucket = DataBucket(
            self,
            "Data",
            expiry_days=cfg.object_expiry_days,
            removal_policy=removal,
            auto_delete_objects=not cfg.retain_data,
        ).bucket
        topics = EncryptedTopics(self, "Topics")
        self.events_topic = topics.topic("Events", display_name="asyncinfer job events")

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
            "log_retention": retention,
            "removal_policy": RemovalPolicy.DESTROY,
        }
        self.api_fn = PythonFunction(
            self,
            "ApiFn",
            code="api",
            service="api",
            environment=env,
            timeout=API_TIMEOUT,
            memory_mib=512,
            description="asyncinfer REST API",
            **fn_common,
        ).function
        self.table.grant_read_write_data(self.api_fn)
        self.bucket.grant_read_write(self.api_fn)
        self.events_topic.grant_publish(self.api_fn)
        self.queues.grant_job_queues(self.api_fn, SEND_ACTIONS)
        self.authorizer_fn = PythonFunction(
            self,
            "AuthorizerFn",
            code="authorizer",
            service="authorizer",
            environment=env,
            timeout=Duration.seconds(10),
            description="asyncinfer API key authorizer: x-api-key or Authorization: Bearer",
            **fn_common,
        ).function
        # GetApiKeys (with values) is GET on the region's /apikeys collection, nothing wider.
        self.authorizer_fn.add_to_role_policy(
            iam.PolicyStatement(
                actions=["apigateway:GET"],
                resources=[f"arn:{self.partition}:apigateway:{self.region}::/apikeys"],
            )
        )
        self.api = JobsApi(
            self,
            "Http",
            handler=self.api_fn,
            key_authorizer=self.authorizer_fn,
            throttle_rate=cfg.throttle_rate,
            throttle_burst=cfg.throttle_burst,
            quota_limit=cfg.quota_limit,
            quota_period=cfg.quota_period,
            waf_max_body_kb=cfg.waf_max_body_kb,
            lambda_body_guard=cfg.lambda_body_guard,
            waf_rate_limit=cfg.waf_rate_limit,
            log_retention=retention,
            removal_policy=RemovalPolicy.DESTROY,
        )

        self.dlq_fn = PythonFunction(
            self,
            "DlqFn",
            code="dlq",
            service="dlq",
            environment=env,
            timeout=Duration.seconds(cfg.dlq_handler_timeout),
            description="asyncinfer dead-letter handler",
            reserved_concurrency=reserved["dlq"],
            **fn_common,
        ).function
        self.table.grant_read_write_data(self.dlq_fn)
        self.bucket.grant_read(self.dlq_fn)
        self.events_topic.grant_publish(self.dlq_fn)
        self.queues.grant_dlqs(self.dlq_fn, CONSUME_ACTIONS)
        for model, dlq in self.queues.dlqs.items():
            _sqs_trigger(
                scopes.of(self.queues, model), f"{model}-dlq-trigger", self.dlq_fn, dlq, "dlq"
            )

        self.sweeper_fn = PythonFunction(
            self,
            "SweeperFn",
            code="sweeper",
            service="sweeper",
            environment=env,
            timeout=_timeout("sweeper"),
            description="asyncinfer expiry sweeper: queued jobs past their TTL, running jobs "
            "whose lease lapsed (every minute)",
            reserved_concurrency=reserved["sweeper"],
            tracing=cfg.trace_scheduled_functions,
            **fn_common,
        ).function
        self.table.grant_read_write_data(self.sweeper_fn)
        self.bucket.grant_read(self.sweeper_fn, "outputs/*")
        self.events_topic.grant_publish(self.sweeper_fn)
        events.Rule(
            self,
            "SweeperSchedule",
            **_schedule("sweeper", self.sweeper_fn),
        )

        self.webhooks = WebhookDelivery(
            self,
            "Webhooks",
            topic=self.events_topic,
            table=self.table,
            environment=env,
            function_props=fn_common,
            reserved_concurrency=reserved["webhooks"],
            removal_policy=removal,
        )
        self.webhooks.grant_secrets(self.api_fn)  # tenants' secrets: the API and dispatcher only

        # OpenAI batches: the expander submits jobs as the API does (wake grants below).
        self.batches = BatchProcessing(
            self,
            "Batches",
            topic=self.events_topic,
            table=self.table,
            bucket=self.bucket,
            environment=env,
            function_props=fn_common,
            grant_submit=lambda fn: self.queues.grant_job_queues(fn, SEND_ACTIONS),
        )
        self.batches.grant_create(self.api_fn)

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
            worker_env = {
                **env,
                ev.DRAIN_SECONDS: str(cfg.drain_seconds),
                ev.MODELS_FILE: worker_models_file(cfg),
            }
            release_fn = PythonFunction(
                self,
                "CapacityReleaseFn",
                code="ecs_teardown",
                service="ecs-teardown",
                environment=env,
                timeout=_timeout("ecs_teardown"),
                description="asyncinfer stack deletion: release the GPU group's instances",
                **fn_common,
            ).function
            self.ecs = EcsWorkers(
                self,
                "Ecs",
                image=image,
                queues=self.queues.queues,
                prefix=prefix,
                environment=worker_env,
                computes=cfg.model_compute,
                stop_timeout=cfg.stop_timeout,
                memory_reservation_mib=WORKER_MEMORY_MIB,
                log_retention=retention,
                removal_policy=RemovalPolicy.DESTROY,
                container_insights=cfg.container_insights,
                ssm_access=cfg.instance_ssm_access,
                scopes=scopes,
                capacity_release=release_fn,
            )
            grant_input_locations(self, self.ecs.task_roles.values(), cfg.input_locations)
            for model, role in self.ecs.task_roles.items():
                for q in self.queues.queues_of(model):
                    q.grant_consume_messages(role)
                    q.grant_send_messages(role)
                self.table.grant_read_write_data(role)
                # Workers read inputs and uploads and write outputs; they delete nothing
                # outside outputs/ (issue 14, least privilege).
                self.bucket.grant_read(role)
                self.bucket.grant_put(role, "outputs/*")
                self.bucket.grant_delete(role, "outputs/*")
                self.events_topic.grant_publish(role)
                grant_weight_read(role, cfg.model_compute[model])
            self.backlog_fn = PythonFunction(
                self,
                "BacklogFn",
                code="backlog_metric",
                service="backlog-metric",
                environment={
                    ev.RESOURCE_PREFIX: prefix,
                    ev.QUEUE_URL_BASE: self.queues.url_base(),
                    ev.MODELS: ",".join(models),
                    ev.COMPUTE: "ecs",
                    ev.ECS_CLUSTER: self.ecs.cluster.cluster_name,
                },
                timeout=_timeout("backlog_metric"),
                description="asyncinfer backlog-per-task metric (every minute)",
                tracing=cfg.trace_scheduled_functions,
                **fn_common,
            ).function
            self.queues.grant_job_queues(self.backlog_fn, ["sqs:GetQueueAttributes"])
            self.ecs.grant_describe_services(self.backlog_fn)
            # Wake-on-submit: the API takes a service at zero to one task at once.
            self.ecs.grant_wake(self.api_fn)
            self.api_fn.add_environment(ev.ECS_CLUSTER, self.ecs.cluster.cluster_name)
            self.ecs.grant_wake(self.batches.expander)
            self.batches.expander.add_environment(ev.ECS_CLUSTER, self.ecs.cluster.cluster_name)
            events.Rule(
                self,
                "BacklogSchedule",
                **_schedule("backlog_metric", self.backlog_fn),
            )
            workers_metric = {
                m: cloudwatch.Metric(
                    namespace=METRICS_NAMESPACE,
                    metric_name="RunningTasks",
                    dimensions_map={"Model": m},
                    period=Duration.minutes(1),
                    statistic="Maximum",
                )
                for m in models
            }
        else:
            success = topics.topic("SageMakerSuccess", display_name="asyncinfer SageMaker success")
            error = topics.topic("SageMakerError", display_name="asyncinfer SageMaker errors")
            self.sagemaker = SageMakerEndpoints(
                self,
                "SageMaker",
                image=image,
                models=models,
                prefix=prefix,
                bucket=self.bucket,
                success_topic=success,
                error_topic=error,
                environment={**env, ev.MODELS_FILE: worker_models_file(cfg)},
                computes=cfg.model_compute,
                max_concurrent_invocations=cfg.sagemaker_max_concurrent_invocations,
                log_retention=retention,
                scopes=scopes,
            )
            grant_input_locations(self, self.sagemaker.roles, cfg.input_locations)
            sm_env = env
            engines = sagemaker_engines(cfg.model_compute)
            if engines:  # their endpoints run the engine image: the bridge and completion map
                sm_env = {**env, ev.SAGEMAKER_ENGINES: json.dumps(engines, separators=(",", ":"))}
            self.bridge_fn = PythonFunction(
                self,
                "BridgeFn",
                code="sagemaker_bridge",
                service="sagemaker-bridge",
                environment=sm_env,
                timeout=Duration.seconds(cfg.bridge_timeout),
                description="asyncinfer SQS -> SageMaker InvokeEndpointAsync",
                reserved_concurrency=reserved["bridge"],
                **fn_common,
            ).function
            self.sagemaker.grant_invoke_async(self.bridge_fn)
            self.sagemaker.grant_wake(self.api_fn)
            self.sagemaker.grant_wake(self.batches.expander)
            self.table.grant_read_write_data(self.bridge_fn)
            self.bucket.grant_read_write(self.bridge_fn, "inputs/*")
            self.events_topic.grant_publish(self.bridge_fn)
            self.queues.grant_job_queues(self.bridge_fn, CONSUME_ACTIONS)
            for key, q in self.queues.class_queues.items():
                model = key.split("#")[0]
                trigger_id = f"{key.replace('#', '-')}-bridge-trigger"
                _sqs_trigger(
                    scopes.of(self.queues, model), trigger_id, self.bridge_fn, q, "sagemaker_bridge"
                )
            self.completion_fn = PythonFunction(
                self,
                "CompletionFn",
                code="sagemaker_completion",
                service="sagemaker-completion",
                environment=sm_env,
                timeout=_timeout("sagemaker_completion"),
                description="asyncinfer SageMaker notifications -> job records and events",
                reserved_concurrency=reserved["completion"],
                **fn_common,
            ).function
            self.table.grant_read_write_data(self.completion_fn)
            self.bucket.grant_read(self.completion_fn, "outputs/*")
            if engines:  # an engine's large mapped outputs: outputs/<tenant>/<job_id>.json
                self.bucket.grant_put(self.completion_fn, "outputs/*")
            self.events_topic.grant_publish(self.completion_fn)
            for t in (success, error):
                t.add_subscription(subs.LambdaSubscription(self.completion_fn))
            # leases (issue 14): failed notifications are kept; the sweeper re-sends the
            # messages of SageMaker jobs it takes back.
            self.sagemaker.add_completion_failure_destination(self.completion_fn)
            for q in self.queues.class_queues.values():
                q.grant_send_messages(self.sweeper_fn)
            workers_metric = {
                m: endpoint_metric("ApproximateBacklogSizePerInstance", n)
                for m, n in self.sagemaker.endpoint_names.items()
            }

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


#: The worker image's working directory (``container/Dockerfile``: ``WORKDIR``; it copies the
#: repository's ``models.yaml`` there).
IMAGE_ROOT = "/opt/asyncinfer"


def worker_models_file(cfg: DeployConfig) -> str:
    """The catalogue's path inside the worker image: ``/opt/asyncinfer/`` + its path relative to
    the repository (the image builds from the repository root; ``container/Dockerfile`` copies
    ``models.yaml``, a custom ``worker_dockerfile`` copies the deployer's folder), or
    ``/opt/asyncinfer/catalogue/<name>`` for a file outside the repository (the deployer's
    Dockerfile copies its folder there; ``docs/deploy.md``)."""
    path = cfg.models_path
    try:
        return f"{IMAGE_ROOT}/{path.relative_to(REPO_ROOT.resolve()).as_posix()}"
    except ValueError:
        return f"{IMAGE_ROOT}/catalogue/{path.name}"


def _timeout(code: str) -> Duration:
    """The topology's timeout of function ``code`` (:mod:`asyncinfer.core.topology`)."""
    return Duration.seconds(topology.FUNCTIONS[code].timeout_seconds)


def _schedule(code: str, fn: lambda_.IFunction) -> dict[str, Any]:
    """``events.Rule`` arguments of function ``code``'s topology schedule."""
    schedule = topology.FUNCTIONS[code].schedule()
    assert schedule is not None, code
    return {
        "schedule": events.Schedule.rate(Duration.minutes(schedule.rate_minutes)),
        "targets": [targets.LambdaFunction(fn, retry_attempts=schedule.retry_attempts)],
    }


def _sqs_trigger(
    scope: Construct, id: str, fn: lambda_.IFunction, queue: sqs.IQueue, code: str
) -> None:
    """The SQS event source mapping of function ``code`` (batch size, window and partial batch
    failures from the topology) in ``scope`` (the queue's model scope, so a large catalogue's
    mappings do not fill the parent stack). The function's rights on the queues are granted
    once, by name pattern."""
    trigger = topology.FUNCTIONS[code].sqs_trigger()
    window = trigger.max_batching_window_seconds
    lambda_.EventSourceMapping(
        scope,
        id,
        target=fn,
        event_source_arn=queue.queue_arn,
        batch_size=trigger.batch_size,
        max_batching_window=Duration.seconds(window) if window else None,
        report_batch_item_failures=trigger.report_batch_item_failures,
    )


def _retention(days: int) -> logs.RetentionDays:
    """The ``RetentionDays`` member whose value is ``days`` (validated by the config)."""
    members = [m for m in logs.RetentionDays if m is not logs.RetentionDays.INFINITE]
    return dict(zip(LOG_RETENTION_DAYS, members, strict=True))[days]
