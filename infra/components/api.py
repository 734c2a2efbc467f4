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
from asyncinfer.openai_api.limits import BINARY_MEDIA_TYPES, MAX_MULTIPART_BYTES

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


#: Largest request body passed to the API Lambda, bytes: a Lambda proxy event is capped at 6 MB
#: (Lambda quotas, "Invocation payload"), and the event adds headers and context to the body.
LAMBDA_BODY_LIMIT = 6_000_000
#: ``Content-Length`` values above :data:`LAMBDA_BODY_LIMIT` (7+ digit numbers from 6000001).
CONTENT_LENGTH_OVER_LIMIT = (
    r"^0*(600000[1-9]|60000[1-9][0-9]|6000[1-9][0-9]{2}|600[1-9][0-9]{3}|60[1-9][0-9]{4}"
    r"|6[1-9][0-9]{5}|[7-9][0-9]{6}|[1-9][0-9]{7,})$"
)


def integer_over(limit: int) -> str:
    """A regex matching the decimal integers above ``limit`` (leading zeros allowed), for a
    WAF match on a ``Content-Length`` header: longer numbers, or as long with a larger digit at
    the first place they differ."""
    digits = str(limit)
    n = len(digits)
    alts = []
    for i, d in enumerate(digits):
        if d != "9":
            rest = n - i - 1
            tail = f"[0-9]{{{rest}}}" if rest > 1 else ("[0-9]" if rest == 1 else "")
            lo = str(int(d) + 1)
            alts.append(f"{digits[:i]}{lo if lo == '9' else f'[{lo}-9]'}{tail}")
    alts.append(f"[1-9][0-9]{{{n},}}")
    return "^0*(" + "|".join(alts) + ")$"


#: ``Content-Length`` values above the multipart limit of ``POST /openai/v1/files``.
MULTIPART_OVER_LIMIT = integer_over(MAX_MULTIPART_BYTES)


#: The REST API's one stage.
STAGE = "prod"


def _json_error(code: str, message: str) -> Any:
    return wafv2.CfnWebACL.CustomResponseBodyProperty(
        content_type="APPLICATION_JSON",
        content=json.dumps({"error": {"code": code, "message": message, "details": []}}),
    )


def _json_413(message: str) -> Any:
    return _json_error("payload_too_large", message)


def _rate_rule(limit: int, priority: int) -> Any:
    """A rate-based rule: a client IP over ``limit`` requests per 5 minutes gets 429 with the
    contract's error body (AWS WAF developer guide, "Rate-based rule statement")."""
    return wafv2.CfnWebACL.RuleProperty(
        name="rate-limit-per-ip",
        priority=priority,
        action=wafv2.CfnWebACL.RuleActionProperty(
            block=wafv2.CfnWebACL.BlockActionProperty(
                custom_response=wafv2.CfnWebACL.CustomResponseProperty(
                    response_code=429, custom_response_body_key="rate_limited"
                )
            )
        ),
        statement=wafv2.CfnWebACL.StatementProperty(
            rate_based_statement=wafv2.CfnWebACL.RateBasedStatementProperty(
                limit=limit, aggregate_key_type="IP", evaluation_window_sec=300
            )
        ),
        visibility_config=wafv2.CfnWebACL.VisibilityConfigProperty(
            cloud_watch_metrics_enabled=True,
            metric_name="asyncinfer-rate-limit-per-ip",
            sampled_requests_enabled=True,
        ),
    )


def _header_regex(header: str, regex: str) -> Any:
    return wafv2.CfnWebACL.StatementProperty(
        regex_match_statement=wafv2.CfnWebACL.RegexMatchStatementProperty(
            regex_string=regex,
            field_to_match=wafv2.CfnWebACL.FieldToMatchProperty(single_header={"Name": header}),
            text_transformations=[
                wafv2.CfnWebACL.TextTransformationProperty(priority=0, type="NONE")
            ],
        )
    )


def _block_413(name: str, priority: int, statement: Any, body_key: str) -> Any:
    return wafv2.CfnWebACL.RuleProperty(
        name=name,
        priority=priority,
        action=wafv2.CfnWebACL.RuleActionProperty(
            block=wafv2.CfnWebACL.BlockActionProperty(
                custom_response=wafv2.CfnWebACL.CustomResponseProperty(
                    response_code=413, custom_response_body_key=body_key
                )
            )
        ),
        statement=statement,
        visibility_config=wafv2.CfnWebACL.VisibilityConfigProperty(
            cloud_watch_metrics_enabled=True,
            metric_name=f"asyncinfer-{name}",
            sampled_requests_enabled=True,
        ),
    )


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
            self.web_acl = self._web_acl(waf_max_body_kb, lambda_body_guard, waf_rate_limit)

    def _web_acl(self, max_kb: int, guard: bool, rate_limit: int) -> wafv2.CfnWebACL:
        inspect_kb = next(k for k in (16, 32, 48, 64) if k >= max(max_kb, 1))
        rules: list[Any] = []
        if rate_limit:
            rules.append(_rate_rule(rate_limit, len(rules)))
        if guard:
            rules.append(
                _block_413(
                    "content-length-over-lambda-limit",
                    len(rules),
                    wafv2.CfnWebACL.StatementProperty(
                        regex_match_statement=wafv2.CfnWebACL.RegexMatchStatementProperty(
                            regex_string=CONTENT_LENGTH_OVER_LIMIT,
                            field_to_match=wafv2.CfnWebACL.FieldToMatchProperty(
                                single_header={"Name": "content-length"}
                            ),
                            text_transformations=[
                                wafv2.CfnWebACL.TextTransformationProperty(priority=0, type="NONE")
                            ],
                        )
                    ),
                    "too_large_for_lambda",
                )
            )
            # multipart reaches the Lambda base64 (4/3 larger): its own, lower cut.
            rules.append(
                _block_413(
                    "multipart-over-lambda-limit",
                    len(rules),
                    wafv2.CfnWebACL.StatementProperty(
                        and_statement=wafv2.CfnWebACL.AndStatementProperty(
                            statements=[
                                _header_regex("content-length", MULTIPART_OVER_LIMIT),
                                wafv2.CfnWebACL.StatementProperty(
                                    byte_match_statement=wafv2.CfnWebACL.ByteMatchStatementProperty(
                                        field_to_match=wafv2.CfnWebACL.FieldToMatchProperty(
                                            single_header={"Name": "content-type"}
                                        ),
                                        positional_constraint="STARTS_WITH",
                                        search_string="multipart/form-data",
                                        text_transformations=[
                                            wafv2.CfnWebACL.TextTransformationProperty(
                                                priority=0, type="LOWERCASE"
                                            )
                                        ],
                                    )
                                ),
                            ]
                        )
                    ),
                    "multipart_too_large",
                )
            )
        if max_kb:
            rules.append(
                _block_413(
                    "body-size-limit",
                    len(rules),
                    wafv2.CfnWebACL.StatementProperty(
                        size_constraint_statement=wafv2.CfnWebACL.SizeConstraintStatementProperty(
                            comparison_operator="GT",
                            size=max_kb * 1024,
                            field_to_match=wafv2.CfnWebACL.FieldToMatchProperty(
                                body=wafv2.CfnWebACL.BodyProperty(oversize_handling="MATCH")
                            ),
                            text_transformations=[
                                wafv2.CfnWebACL.TextTransformationProperty(priority=0, type="NONE")
                            ],
                        )
                    ),
                    "too_large",
                )
            )
        acl = wafv2.CfnWebACL(
            self,
            "WebAcl",
            scope="REGIONAL",
            default_action=wafv2.CfnWebACL.DefaultActionProperty(allow={}),
            visibility_config=wafv2.CfnWebACL.VisibilityConfigProperty(
                cloud_watch_metrics_enabled=True,
                metric_name="asyncinfer-api",
                sampled_requests_enabled=True,
            ),
            association_config=wafv2.CfnWebACL.AssociationConfigProperty(
                request_body={
                    "API_GATEWAY": wafv2.CfnWebACL.RequestBodyAssociatedResourceTypeConfigProperty(
                        default_size_inspection_limit=f"KB_{inspect_kb}"
                    )
                }
            ),
            custom_response_bodies={
                "rate_limited": _json_error(
                    "rate_limited", f"over {rate_limit} requests in 5 minutes from this address"
                ),
                "too_large": _json_413(f"request body over {max_kb} KB"),
                "multipart_too_large": wafv2.CfnWebACL.CustomResponseBodyProperty(
                    content_type="APPLICATION_JSON",
                    content=json.dumps(
                        gateway_error_body(
                            413,
                            "payload_too_large",
                            f"multipart body over {MAX_MULTIPART_BYTES} bytes; upload large "
                            "files with POST /v1/uploads and create the file with input_url",
                        )
                    ),
                ),
                "too_large_for_lambda": _json_413(
                    f"request body over {LAMBDA_BODY_LIMIT} bytes; upload large inputs with "
                    "POST /v1/uploads and submit input_url"
                ),
            },
            rules=rules,
        )
        wafv2.CfnWebACLAssociation(
            self,
            "WebAclAssociation",
            resource_arn=self.api.deployment_stage.stage_arn,
            web_acl_arn=acl.attr_arn,
        )
        return acl
