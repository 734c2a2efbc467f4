"""``compute=sagemaker``: one SageMaker asynchronous inference endpoint per model, from the same
worker image (``serve``: GET /ping, POST /invocations on 8080), scaling to zero; an
``openai-server`` entry with ``engine.image`` runs its engine as the endpoint's container instead
(:mod:`infra.components.sagemaker_engine`)."""

from __future__ import annotations

from collections.abc import Mapping

from aws_cdk import Acknowledgment, ArnFormat, Duration, RemovalPolicy, Stack, Validations
from aws_cdk import aws_applicationautoscaling as appscaling
from aws_cdk import aws_cloudwatch as cloudwatch
from aws_cdk import aws_ecr_assets as ecr_assets
from aws_cdk import aws_iam as iam
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_lambda_destinations as destinations
from aws_cdk import aws_logs as logs
from aws_cdk import aws_s3 as s3
from aws_cdk import aws_sagemaker as sagemaker
from aws_cdk import aws_sns as sns
from aws_cdk import aws_sqs as sqs
from constructs import Construct

from asyncinfer.core import envvars as ev
from asyncinfer.core import naming
from infra.components.model_scopes import ModelScopes
from infra.components.sagemaker_engine import STARTUP_TIMEOUT_SECONDS, engine_container
from infra.model_compute import ModelCompute, grant_weight_read

#: Key prefixes SageMaker writes results and failures under (inside ``outputs/``, which expires).
OUTPUT_PREFIX = "outputs/sagemaker"
FAILURE_PREFIX = "outputs/sagemaker-failures"
VARIANT = "AllTraffic"

#: Asynchronous invocations of the completion Lambda: retries after an error (0..2, Lambda's
#: maximum) and how long an event may wait, before it goes to the failure destination.
COMPLETION_RETRY_ATTEMPTS = 2
COMPLETION_MAX_EVENT_AGE = Duration.hours(6)
#: Key prefixes the endpoints read request payloads from: ``inputs/`` (the bridge writes inline
#: inputs there) and ``uploads/`` (``POST /v1/uploads`` objects that the bridge passes through).
INPUT_PREFIXES = ("inputs/*", "uploads/*")
#: Application Auto Scaling's service-linked role for SageMaker variants (Application Auto
#: Scaling user guide, "Service-linked roles"); created on first use of the service.
SAGEMAKER_SCALING_ROLE = (
    "aws-service-role/sagemaker.application-autoscaling.amazonaws.com/"
    "AWSServiceRoleForApplicationAutoScaling_SageMakerEndpoint"
)


def endpoint_metric(name: str, endpoint_name: str) -> cloudwatch.Metric:
    """An ``AWS/SageMaker`` endpoint metric (1-minute average), e.g. ``ApproximateBacklogSize``."""
    return cloudwatch.Metric(
        namespace="AWS/SageMaker",
        metric_name=name,
        dimensions_map={"EndpointName": endpoint_name},
        period=Duration.minutes(1),
        statistic="Average",
    )


def endpoint_name_for(prefix: str, model: str) -> str:
    """A valid, lower-case endpoint name (:func:`asyncinfer.core.naming.endpoint_name`)."""
    return naming.endpoint_name(prefix, model)


class SageMakerEndpoints(Construct):
    """Per model: a SageMaker model (the worker image, ``ASYNCINFER_MODELS=<id>``), an endpoint
    config with ``AsyncInferenceConfig`` (S3OutputPath, S3FailurePath, success and error SNS
    topics, MaxConcurrentInvocationsPerInstance) and an endpoint.

    Scaling follows the SageMaker developer guide ("Autoscale an asynchronous endpoint"):
    MinCapacity 0; target tracking on ``ApproximateBacklogSizePerInstance``; a step policy on
    ``HasBacklogWithoutCapacity`` that adds one instance when requests wait and none runs. No
    policy uses ``InvocationsPerInstance``, which async endpoints do not publish.

    Args:
        image: the worker image asset.
        models: model ids.
        prefix: the deployment's resource prefix (endpoint names, :mod:`asyncinfer.core.naming`).
        bucket: data bucket (``inputs/`` and ``uploads/`` read, outputs and failures written).
        success_topic / error_topic: SageMaker notification topics.
        environment: ``ASYNCINFER_*`` settings for the container.
        computes: model id -> its compute: the endpoint's instance type (``ml.`` + it), most
            instances, ApproximateBacklogSizePerInstance target, and its ``s3://`` weight
            prefixes (a model with any gets its own execution role reading exactly those).
        max_concurrent_invocations: MaxConcurrentInvocationsPerInstance (1..1000).
        log_retention / removal_policy: of the endpoints' log groups
            (``/aws/sagemaker/Endpoints/<name>``), created here so that they have a retention
            (SageMaker would create them without one).
        scopes: where each model's resources go (default: here).
    """

    def __init__(
        self,
        scope: Construct,
        id: str,
        *,
        image: ecr_assets.DockerImageAsset,
        models: list[str],
        prefix: str,
        bucket: s3.IBucket,
        success_topic: sns.ITopic,
        error_topic: sns.ITopic,
        environment: Mapping[str, str],
        computes: Mapping[str, ModelCompute],
        max_concurrent_invocations: int,
        log_retention: logs.RetentionDays,
        removal_policy: RemovalPolicy = RemovalPolicy.DESTROY,
        scopes: ModelScopes | None = None,
    ) -> None:
        super().__init__(scope, id)
        stack = Stack.of(self)
        self._image, self._bucket = image, bucket
        self._topics = (success_topic, error_topic)
        #: The execution role of the models that read no S3 weights (shared).
        self.role = self._execution_role("ExecutionRole", "asyncinfer SageMaker async endpoints")
        #: model id -> its execution role (a model with ``s3://`` weights has its own, with read
        #: on exactly those prefixes).
        self.model_roles: dict[str, iam.Role] = {}
        for model in models:
            c = computes[model]
            if c.weight_prefixes:
                role = self._execution_role(
                    f"{model}-role", f"asyncinfer SageMaker endpoint of {model}"[:1000]
                )
                grant_weight_read(role, c)
            else:
                role = self.role
            self.model_roles[model] = role
        self.endpoint_names: dict[str, str] = {}
        self.endpoints: dict[str, sagemaker.CfnEndpoint] = {}
        self.log_groups: dict[str, logs.LogGroup] = {}
        scaling_role = iam.Role.from_role_arn(
            self,
            "ScalingRole",
            stack.format_arn(
                service="iam", region="", resource="role", resource_name=SAGEMAKER_SCALING_ROLE
            ),
        )
        for model in models:
            sc = scopes.of(self, model) if scopes else self
            name = endpoint_name_for(prefix, model)
            self.log_groups[model] = logs.LogGroup(
                sc,
                f"{model}-logs",
                log_group_name=f"/aws/sagemaker/Endpoints/{name}",
                retention=log_retention,
                removal_policy=removal_policy,
            )
            c = computes[model]
            # An engine entry's variant may take as long as SageMaker allows to copy the weights
            # and load them; our worker image keeps SageMaker's defaults.
            startup = STARTUP_TIMEOUT_SECONDS if c.engine is not None else None
            if c.engine is not None:  # the entry's engine serves the endpoint itself
                container = engine_container(sc, model, c, self.model_roles[model])
            else:
                container = sagemaker.CfnModel.ContainerDefinitionProperty(
                    image=image.image_uri,
                    environment={**environment, ev.MODELS: model, ev.COMPUTE: "sagemaker"},
                )
            cfn_model = sagemaker.CfnModel(
                sc,
                f"{model}-model",
                execution_role_arn=self.model_roles[model].role_arn,
                primary_container=container,
            )
            cfn_model.node.add_dependency(self.model_roles[model])
            config = sagemaker.CfnEndpointConfig(
                sc,
                f"{model}-config",
                production_variants=[
                    sagemaker.CfnEndpointConfig.ProductionVariantProperty(
                        variant_name=VARIANT,
                        model_name=cfn_model.attr_model_name,
                        initial_instance_count=1,
                        instance_type=computes[model].sagemaker_instance_type,
                        initial_variant_weight=1,
                        model_data_download_timeout_in_seconds=startup,
                        container_startup_health_check_timeout_in_seconds=startup,
                    )
                ],
                async_inference_config=sagemaker.CfnEndpointConfig.AsyncInferenceConfigProperty(
                    output_config=sagemaker.CfnEndpointConfig.AsyncInferenceOutputConfigProperty(
                        s3_output_path=f"s3://{bucket.bucket_name}/{OUTPUT_PREFIX}/{model}/",
                        s3_failure_path=f"s3://{bucket.bucket_name}/{FAILURE_PREFIX}/{model}/",
                        notification_config=sagemaker.CfnEndpointConfig.AsyncInferenceNotificationConfigProperty(
                            success_topic=success_topic.topic_arn,
                            error_topic=error_topic.topic_arn,
                        ),
                    ),
                    client_config=sagemaker.CfnEndpointConfig.AsyncInferenceClientConfigProperty(
                        max_concurrent_invocations_per_instance=max_concurrent_invocations
                    ),
                ),
            )
            endpoint = sagemaker.CfnEndpoint(
                sc,
                f"{model}-endpoint",
                endpoint_name=name,
                endpoint_config_name=config.attr_endpoint_config_name,
            )
            endpoint.node.add_dependency(self.log_groups[model])
            target = appscaling.ScalableTarget(
                sc,
                f"{model}-scaling",
                service_namespace=appscaling.ServiceNamespace.SAGEMAKER,
                resource_id=f"endpoint/{name}/variant/{VARIANT}",
                scalable_dimension="sagemaker:variant:DesiredInstanceCount",
                min_capacity=0,
                max_capacity=computes[model].max_workers,
                role=scaling_role,
            )
            target.node.add_dependency(endpoint)
            target.scale_to_track_metric(
                "BacklogPerInstance",
                target_value=computes[model].backlog_per_worker,
                custom_metric=endpoint_metric("ApproximateBacklogSizePerInstance", name),
                scale_in_cooldown=Duration.minutes(5),
                scale_out_cooldown=Duration.minutes(1),
            )
            target.scale_on_metric(
                "ZeroToOne",
                metric=endpoint_metric("HasBacklogWithoutCapacity", name),
                scaling_steps=[
                    appscaling.ScalingInterval(upper=0, change=0),
                    appscaling.ScalingInterval(lower=0.5, change=1),
                ],
                adjustment_type=appscaling.AdjustmentType.CHANGE_IN_CAPACITY,
                evaluation_periods=1,
                cooldown=Duration.minutes(2),
            )
            self.endpoint_names[model] = name
            self.endpoints[model] = endpoint

    @property
    def roles(self) -> list[iam.Role]:
        """Every execution role (the shared one first)."""
        return list(dict.fromkeys([self.role, *self.model_roles.values()]))

    def _execution_role(self, id: str, description: str) -> iam.Role:
        """An execution role with what every endpoint needs: image pull, reads of ``inputs/``
        and ``uploads/``, writes of ``outputs/``, the notification topics, its log groups and
        metrics."""
        image, bucket = self._image, self._bucket
        success_topic, error_topic = self._topics
        stack = Stack.of(self)
        role = iam.Role(
            self,
            id,
            assumed_by=iam.ServicePrincipal("sagemaker.amazonaws.com"),
            description=description,
        )
        image.repository.grant_pull(role)
        for objects in INPUT_PREFIXES:
            bucket.grant_read(role, objects)
        bucket.grant_put(role, "outputs/*")
        success_topic.grant_publish(role)
        error_topic.grant_publish(role)
        role.add_to_policy(
            iam.PolicyStatement(
                actions=[
                    "logs:CreateLogGroup",
                    "logs:CreateLogStream",
                    "logs:PutLogEvents",
                    "logs:DescribeLogStreams",
                ],
                resources=[
                    stack.format_arn(
                        service="logs",
                        resource="log-group",
                        resource_name="/aws/sagemaker/Endpoints/*",
                        arn_format=ArnFormat.COLON_RESOURCE_NAME,
                    )
                ],
            )
        )
        role.add_to_policy(
            iam.PolicyStatement(
                actions=["cloudwatch:PutMetricData"],
                resources=["*"],
                conditions={
                    "StringLike": {"cloudwatch:namespace": ["/aws/sagemaker/*", "asyncinfer"]}
                },
            )
        )
        return role

    def grant_invoke_async(self, grantee: iam.IGrantable) -> None:
        """Allow ``sagemaker:InvokeEndpointAsync`` on these endpoints."""
        stack = Stack.of(self)
        iam.Grant.add_to_principal(
            grantee=grantee,
            actions=["sagemaker:InvokeEndpointAsync"],
            resource_arns=[
                stack.format_arn(service="sagemaker", resource="endpoint", resource_name=n)
                for n in self.endpoint_names.values()
            ],
        )

    def grant_wake(self, grantee: iam.IGrantable) -> None:
        """Allow wake-on-submit (:mod:`asyncinfer.scaling.wake`): ``sagemaker:DescribeEndpoint``
        and ``sagemaker:UpdateEndpointWeightsAndCapacities`` on these endpoints."""
        stack = Stack.of(self)
        iam.Grant.add_to_principal(
            grantee=grantee,
            actions=["sagemaker:DescribeEndpoint", "sagemaker:UpdateEndpointWeightsAndCapacities"],
            resource_arns=[
                stack.format_arn(service="sagemaker", resource="endpoint", resource_name=n)
                for n in self.endpoint_names.values()
            ],
        )

    def add_completion_failure_destination(self, fn: lambda_.IFunction) -> sqs.Queue:
        """Give the completion Lambda (``fn``, invoked asynchronously by the notification topics)
        an on-failure destination: an SQS queue (SSE, TLS only, 14 days) that keeps each
        notification Lambda could not apply after :data:`COMPLETION_RETRY_ATTEMPTS` retries or
        :data:`COMPLETION_MAX_EVENT_AGE` (Lambda developer guide, "Retaining records of
        asynchronous invocations"), for triage. The job itself is not lost meanwhile: its lease
        lapses and the sweeper takes it back (:mod:`asyncinfer.jobs.leases`). Returns the queue."""
        queue = sqs.Queue(
            self,
            "CompletionFailures",
            encryption=sqs.QueueEncryption.SQS_MANAGED,
            enforce_ssl=True,
            retention_period=Duration.days(14),
        )
        Validations.of(queue).acknowledge(
            Acknowledgment(
                id="AwsSolutions-SQS3",
                reason="This queue is itself a dead-letter store (the completion Lambda's "
                "on-failure destination); nothing consumes it.",
            )
        )
        lambda_.EventInvokeConfig(
            self,
            "CompletionInvokeConfig",
            function=fn,
            on_failure=destinations.SqsDestination(queue),
            retry_attempts=COMPLETION_RETRY_ATTEMPTS,
            max_event_age=COMPLETION_MAX_EVENT_AGE,
        )
        self.completion_failures = queue
        return queue
