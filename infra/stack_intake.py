"""The intake of :class:`infra.stack.AsyncInferStack`: the API Lambda and its key authorizer
behind the REST API, the dead-letter handler, the expiry sweeper, webhook delivery and OpenAI
batches, each with its grants on the table, bucket, topic and queues."""

from __future__ import annotations

from typing import TYPE_CHECKING

from aws_cdk import Duration, RemovalPolicy
from aws_cdk import aws_events as events
from aws_cdk import aws_iam as iam

from asyncinfer.core import topology
from infra.components import bucket_access
from infra.components.api import JobsApi
from infra.components.batches import BatchProcessing
from infra.components.function import PythonFunction
from infra.components.messaging import CONSUME_ACTIONS, SEND_ACTIONS
from infra.components.webhooks import WebhookDelivery
from infra.stack_parts import StackParts, schedule, sqs_trigger, timeout

if TYPE_CHECKING:
    from infra.stack import AsyncInferStack

#: Timeout of the API Lambda: API Gateway's integration timeout is 29 s (``?wait`` holds <= 20 s).
API_TIMEOUT = Duration.seconds(topology.FUNCTIONS["api"].timeout_seconds)


def add_api(stack: AsyncInferStack, parts: StackParts) -> None:
    """The API Lambda (``stack.api_fn``), the key authorizer (``stack.authorizer_fn``) and the
    REST API (``stack.api``), in ``stack``; needs its table, bucket, topic and queues."""
    cfg, env, fn_common = parts.cfg, parts.env, parts.fn_common
    stack.api_fn = PythonFunction(
        stack,
        "ApiFn",
        code="api",
        service="api",
        environment=env,
        timeout=API_TIMEOUT,
        memory_mib=512,
        description="asyncinfer REST API",
        **fn_common,
    ).function
    stack.table.grant_read_write_data(stack.api_fn)
    # Its prefixes only (issue 14, least privilege): infra.components.bucket_access.
    bucket_access.grant(stack.bucket, stack.api_fn, bucket_access.API)
    stack.events_topic.grant_publish(stack.api_fn)
    stack.queues.grant_job_queues(stack.api_fn, SEND_ACTIONS)
    stack.authorizer_fn = PythonFunction(
        stack,
        "AuthorizerFn",
        code="authorizer",
        service="authorizer",
        environment=env,
        timeout=Duration.seconds(10),
        description="asyncinfer API key authorizer: x-api-key or Authorization: Bearer",
        **fn_common,
    ).function
    # GetApiKeys (with values) is GET on the region's /apikeys collection, nothing wider.
    stack.authorizer_fn.add_to_role_policy(
        iam.PolicyStatement(
            actions=["apigateway:GET"],
            resources=[f"arn:{stack.partition}:apigateway:{stack.region}::/apikeys"],
        )
    )
    stack.api = JobsApi(
        stack,
        "Http",
        handler=stack.api_fn,
        key_authorizer=stack.authorizer_fn,
        throttle_rate=cfg.throttle_rate,
        throttle_burst=cfg.throttle_burst,
        quota_limit=cfg.quota_limit,
        quota_period=cfg.quota_period,
        waf_max_body_kb=cfg.waf_max_body_kb,
        lambda_body_guard=cfg.lambda_body_guard,
        waf_rate_limit=cfg.waf_rate_limit,
        log_retention=parts.retention,
        removal_policy=RemovalPolicy.DESTROY,
    )


def add_background(stack: AsyncInferStack, parts: StackParts, removal: RemovalPolicy) -> None:
    """The dead-letter handler (``stack.dlq_fn``, one trigger per model's DLQ), the sweeper
    (``stack.sweeper_fn``, every minute), webhook delivery (``stack.webhooks``) and OpenAI
    batches (``stack.batches``), in ``stack``, after :func:`add_api` (the API gets the webhook
    secrets and may start batches). ``removal``: of the webhook secrets' table."""
    cfg, env, fn_common, reserved = parts.cfg, parts.env, parts.fn_common, parts.reserved
    stack.dlq_fn = PythonFunction(
        stack,
        "DlqFn",
        code="dlq",
        service="dlq",
        environment=env,
        timeout=Duration.seconds(cfg.dlq_handler_timeout),
        description="asyncinfer dead-letter handler",
        reserved_concurrency=reserved["dlq"],
        **fn_common,
    ).function
    stack.table.grant_read_write_data(stack.dlq_fn)
    stack.bucket.grant_read(stack.dlq_fn)
    stack.events_topic.grant_publish(stack.dlq_fn)
    stack.queues.grant_dlqs(stack.dlq_fn, CONSUME_ACTIONS)
    for model, dlq in stack.queues.dlqs.items():
        sqs_trigger(
            parts.scopes.of(stack.queues, model), f"{model}-dlq-trigger", stack.dlq_fn, dlq, "dlq"
        )

    stack.sweeper_fn = PythonFunction(
        stack,
        "SweeperFn",
        code="sweeper",
        service="sweeper",
        environment=env,
        timeout=timeout("sweeper"),
        description="asyncinfer expiry sweeper: queued jobs past their TTL, running jobs "
        "whose lease lapsed (every minute)",
        reserved_concurrency=reserved["sweeper"],
        tracing=cfg.trace_scheduled_functions,
        **fn_common,
    ).function
    stack.table.grant_read_write_data(stack.sweeper_fn)
    stack.bucket.grant_read(stack.sweeper_fn, "outputs/*")
    stack.events_topic.grant_publish(stack.sweeper_fn)
    # The sweeper sends job messages again in both backends (issue 14): the messages of the
    # SageMaker jobs it takes back, and of the jobs handed back whose message was lost
    # (sweeper.resend_lost, a worker's job as well).
    stack.queues.grant_job_queues(stack.sweeper_fn, SEND_ACTIONS)
    events.Rule(
        stack,
        "SweeperSchedule",
        **schedule("sweeper", stack.sweeper_fn),
    )

    stack.webhooks = WebhookDelivery(
        stack,
        "Webhooks",
        topic=stack.events_topic,
        table=stack.table,
        environment=env,
        function_props=fn_common,
        reserved_concurrency=reserved["webhooks"],
        removal_policy=removal,
    )
    stack.webhooks.grant_secrets(stack.api_fn)  # tenants' secrets: the API and dispatcher only

    # OpenAI batches: the expander submits jobs as the API does (wake grants: the compute part).
    stack.batches = BatchProcessing(
        stack,
        "Batches",
        topic=stack.events_topic,
        table=stack.table,
        bucket=stack.bucket,
        environment=env,
        function_props=fn_common,
        grant_submit=lambda fn: stack.queues.grant_job_queues(fn, SEND_ACTIONS),
    )
    stack.batches.grant_create(stack.api_fn)
