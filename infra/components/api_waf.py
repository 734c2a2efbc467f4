"""The REST API's optional AWS WAF web ACL (:func:`add_web_acl`): a per-IP rate rule, and 413
rules for bodies the API Lambda cannot take (over the Lambda's 6 MB event, multipart over the
Files limit, or over ``waf_max_body_kb``), each answering the contract's error body."""

from __future__ import annotations

import json
from typing import Any

from aws_cdk import aws_apigateway as apigw
from aws_cdk import aws_wafv2 as wafv2
from constructs import Construct

from asyncinfer.openai_api.errors import gateway_error_body
from asyncinfer.openai_api.limits import MAX_MULTIPART_BYTES

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


def add_web_acl(
    scope: Construct, api: apigw.RestApi, max_kb: int, guard: bool, rate_limit: int
) -> wafv2.CfnWebACL:
    """The web ACL of ``api``'s stage, in ``scope`` (ids ``WebAcl``, ``WebAclAssociation``): in
    priority order, a rate rule (``rate_limit`` requests per 5 minutes per IP, 0 for none), with
    ``guard`` the 413 rules for a ``Content-Length`` over :data:`LAMBDA_BODY_LIMIT` and for
    multipart over :data:`~asyncinfer.openai_api.limits.MAX_MULTIPART_BYTES`, and with
    ``max_kb`` (1..64) a 413 rule on the inspected body size; each blocked request gets the
    contract's error body. Request body inspection is the smallest of 16/32/48/64 KB that covers
    ``max_kb``."""
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
        scope,
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
        scope,
        "WebAclAssociation",
        resource_arn=api.deployment_stage.stage_arn,
        web_acl_arn=acl.attr_arn,
    )
    return acl
