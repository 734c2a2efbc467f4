"""The REST API: API Gateway (REST) with API keys and a usage plan, proxying every ``/v1`` route
and the OpenAI-compatible ``/openai/v1`` surface to the API Lambda; ``GET /v1/health`` needs no
key. With a key authorizer (the stack's default), keys come from a Lambda REQUEST authorizer
(``apiKeySource: AUTHORIZER``) that takes ``x-api-key`` or ``Authorization: Bearer``
(:mod:`asyncinfer.openai_api.authorizer` says why both proxies carry it)."""

from __future__ import annotations

import json
from typing import Any

from aws_cdk import Duration, RemovalPolicy
from aws_cdk import aws_apigateway as apigw
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_logs as logs
from aws_cdk import aws_wafv2 as wafv2
from constructs import Construct

from asyncinfer.openai_api.errors import gateway_error_body
from asyncinfer.openai_api.limits import BINARY_MEDIA_TYPES
from infra.components.api_waf import (
    CONTENT_LENGTH_OVER_LIMIT,
    LAMBDA_BODY_LIMIT,
    MULTIPART_OVER_LIMIT,
    add_web_acl,
    integer_over,
)

__all__ = [
    "CONTENT_LENGTH_OVER_LIMIT",
    "GATEWAY_ERRORS",
    "LAMBDA_BODY_LIMIT",
    "MULTIPART_OVER_LIMIT",
    "STAGE",
    "JobsApi",
    "add_web_acl",
    "integer_over",
]

#: API Gateway errors mapped to the contract's error body ``{"error": {"code", "message"}}``
#: (spec "Errors"): gateway response type -> (HTTP status, error code).
GATEWAY_ERRORS: dict[str, tuple[str, str]] = {
    "THROTTLED": ("429", "rate_limited"),
    "QUOTA_EXCEEDED": ("429", "rate_limited"),
    "REQUEST_TOO_LARGE": ("413", "payload_too_large"),
    "MISSING_AUTHENTICATION_TOKEN": ("404", "not_found"),
    "INVALID_API_KEY": ("403", "forbidden"),
    # The key authorizer: Deny on /v1 (api.md's 403), "Unauthorized" on /openai (OpenAI's 401).
    "ACCESS_DENIED": ("403", "forbidden"),
    "UNAUTHORIZED": ("401", "invalid_api_key"),
    "DEFAULT_5XX": ("500", "internal"),
}

_ACCESS_LOG_FIELDS = {
    "requestId": "$context.requestId",
    "ip": "$context.identity.sourceIp",
    "apiKeyId": "$context.identity.apiKeyId",
    "requestTime": "$context.requestTime",
    "httpMethod": "$context.httpMethod",
    "resourcePath": "$context.resourcePath",
    "path": "$context.path",
    "status": "$context.status",
    "responseLength": "$context.responseLength",
    "integrationLatency": "$context.integrationLatency",
    "latency": "$context.responseLatency",
    "error": "$context.error.message",
    "wafStatus": "$context.waf.status",
}


#: The REST API's one stage.
STAGE = "prod"


class JobsApi(Construct):
    """REST API -> Lambda proxy, keys required except on ``/v1/health``.

    Secure defaults: regional endpoint, API keys from the ``x-api-key`` header, a usage plan with
    throttling (requests/s, burst) and a quota, JSON access logs, X-Ray tracing, execution logs at
    ERROR, stage throttling as a backstop, contract-shaped gateway errors. Optionally a WAF web ACL
    whose rule answers 413 for bodies over ``waf_max_body_kb`` (API Gateway REST APIs themselves
    only enforce their fixed 10 MB payload limit, API Gateway quotas).

    Args:
        handler: the API Lambda.
        throttle_rate: usage plan steady-state rate, requests/s per key.
        throttle_burst: usage plan burst, requests.
        quota_limit: requests per ``quota_period`` per key.
        quota_period: ``DAY``, ``WEEK`` or ``MONTH``.
        waf_max_body_kb: 0 for no body-size rule, else 1..64 KB (the most WAF inspects of a REST
            API body).
        lambda_body_guard: a WAF rule answering 413 when ``Content-Length`` is over
            :data:`LAMBDA_BODY_LIMIT` bytes: API Gateway passes bodies up to 10 MB, but a Lambda
            proxy event is capped at 6 MB and a larger one would fail as a 5xx.
        waf_rate_limit: with a web ACL, a rate-based rule blocking (429) a client IP above this
            many requests per 5 minutes; 0 for none.
        key_authorizer: the Lambda REQUEST authorizer function
            (:mod:`asyncinfer.openai_api.authorizer`): the API key source becomes
            ``AUTHORIZER`` and both proxies carry it; ``None`` keeps ``x-api-key`` (``HEADER``).
        log_retention: of the access log group and of the execution log group
            (``API-Gateway-Execution-Logs_<api id>/prod``, which API Gateway would otherwise
            create without a retention).
        removal_policy: of those log groups.
    """

    def __init__(
        self,
        scope: Construct,
        id: str,
        *,
        handler: lambda_.IFunction,
        throttle_rate: float,
        throttle_burst: int,
        quota_limit: int,
        quota_period: str,
        waf_max_body_kb: int,
        lambda_body_guard: bool = True,
        waf_rate_limit: int = 0,
        key_authorizer: lambda_.IFunction | None = None,
        log_retention: logs.RetentionDays,
        removal_policy: RemovalPolicy,
    ) -> None:
        super().__init__(scope, id)
        self.access_logs = logs.LogGroup(
            self, "AccessLogs", retention=log_retention, removal_policy=removal_policy
        )
        integration = apigw.LambdaIntegration(handler, proxy=True)
        self.api = apigw.RestApi(
            self,
            "Api",
            description="asyncinfer HTTP API v1",
            endpoint_types=[apigw.EndpointType.REGIONAL],
            api_key_source_type=(
                apigw.ApiKeySourceType.AUTHORIZER
                if key_authorizer
                else apigw.ApiKeySourceType.HEADER
            ),
            # multipart uploads reach the Lambda intact (base64); file content goes out as bytes.
            binary_media_types=list(BINARY_MEDIA_TYPES),
            cloud_watch_role=True,
            cloud_watch_role_removal_policy=RemovalPolicy.RETAIN,
            deploy_options=apigw.StageOptions(
                stage_name=STAGE,
                access_log_destination=apigw.LogGroupLogDestination(self.access_logs),
                access_log_format=apigw.AccessLogFormat.custom(json.dumps(_ACCESS_LOG_FIELDS)),
                logging_level=apigw.MethodLoggingLevel.ERROR,
                data_trace_enabled=False,
                metrics_enabled=True,
                tracing_enabled=True,
                throttling_rate_limit=max(throttle_rate * 10, 100),
                throttling_burst_limit=max(throttle_burst * 10, 200),
            ),
        )
        self.execution_logs = logs.LogGroup(
            self,
            "ExecutionLogs",
            log_group_name=f"API-Gateway-Execution-Logs_{self.api.rest_api_id}/{STAGE}",
            retention=log_retention,
            removal_policy=removal_policy,
        )
        self.api.deployment_stage.node.add_dependency(self.execution_logs)
        v1 = self.api.root.add_resource("v1")
        health = v1.add_resource("health")
        health.add_method("GET", integration, api_key_required=False)
        self.authorizer: apigw.RequestAuthorizer | None = None
        if key_authorizer is not None:
            self.authorizer = apigw.RequestAuthorizer(
                self,
                "KeyAuthorizer",
                handler=key_authorizer,
                # Either header may carry the key; a cached REQUEST authorizer needs every
                # identity source present, so results are not cached (one call per request).
                identity_sources=[],
                results_cache_ttl=Duration.seconds(0),
            )
        keyed: dict[str, Any] = {"api_key_required": True}
        if self.authorizer is not None:
            keyed.update(
                authorizer=self.authorizer, authorization_type=apigw.AuthorizationType.CUSTOM
            )
        proxy = v1.add_resource("{proxy+}")
        proxy.add_method("ANY", integration, **keyed)
        # The OpenAI-compatible surface (spec openai.md): /openai/v1/..., the same Lambda.
        openai_proxy = self.api.root.add_resource("openai").add_resource("{proxy+}")
        openai_proxy.add_method("ANY", integration, **keyed)
        for rtype, (status, code) in GATEWAY_ERRORS.items():
            # Readable on both surfaces: api.md's code/message/details plus OpenAI's type/param.
            body = json.dumps(gateway_error_body(int(status), code, "MESSAGE")).replace(
                '"MESSAGE"', "$context.error.messageString"
            )
            self.api.add_gateway_response(
                f"Gw{rtype}",
                type=apigw.ResponseType.of(rtype),
                status_code=status,
                templates={"application/json": body},
            )
        self.usage_plan = self.api.add_usage_plan(
            "UsagePlan",
            description="asyncinfer default plan (per API key = per tenant)",
            throttle=apigw.ThrottleSettings(rate_limit=throttle_rate, burst_limit=throttle_burst),
            quota=apigw.QuotaSettings(
                limit=quota_limit, period=getattr(apigw.Period, quota_period)
            ),
            api_stages=[apigw.UsagePlanPerApiStage(api=self.api, stage=self.api.deployment_stage)],
        )
        self.default_key = self.api.add_api_key("DefaultKey", description="asyncinfer first tenant")
        self.usage_plan.add_api_key(self.default_key)
        self.web_acl: wafv2.CfnWebACL | None = None
        if waf_max_body_kb or lambda_body_guard:
            self.web_acl = add_web_acl(
                self, self.api, waf_max_body_kb, lambda_body_guard, waf_rate_limit
            )
