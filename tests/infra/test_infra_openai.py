"""CDK assertions for the ``/openai/v1`` surface and the key authorizer (issue 15): one test per
property."""

from __future__ import annotations

import json
from typing import Any

from asyncinfer.openai_api.limits import BINARY_MEDIA_TYPES


def _resource_paths(synth: Any) -> dict[str, str]:
    """Logical id -> full path of every API resource (resolved through ParentId refs)."""
    res = synth.resources("AWS::ApiGateway::Resource")
    rest = next(iter(synth.resources("AWS::ApiGateway::RestApi")))

    def path(lid: str) -> str:
        props = res[lid]["Properties"]
        parent = props["ParentId"]
        head = (
            ""
            if "Fn::GetAtt" in parent and parent["Fn::GetAtt"][0] == rest
            else path(parent["Ref"])
        )
        return f"{head}/{props['PathPart']}"

    return {lid: path(lid) for lid in res}


def test_api_keys_come_from_the_authorizer(any_mode: Any) -> None:
    (api,) = any_mode.props("AWS::ApiGateway::RestApi")
    assert api["ApiKeySourceType"] == "AUTHORIZER"


def test_binary_media_types_cover_multipart_and_file_content(any_mode: Any) -> None:
    (api,) = any_mode.props("AWS::ApiGateway::RestApi")
    assert set(api["BinaryMediaTypes"]) == set(BINARY_MEDIA_TYPES)
    assert "multipart/form-data" in api["BinaryMediaTypes"]


def test_openai_proxy_is_keyed_and_authorized(any_mode: Any) -> None:
    paths = _resource_paths(any_mode)
    methods = any_mode.resources("AWS::ApiGateway::Method")
    by_path = {
        paths[m["Properties"]["ResourceId"]["Ref"]]: m["Properties"] for m in methods.values()
    }
    for path in ("/openai/{proxy+}", "/v1/{proxy+}"):
        m = by_path[path]
        assert m["HttpMethod"] == "ANY" and m["ApiKeyRequired"] is True
        assert m["AuthorizationType"] == "CUSTOM" and "AuthorizerId" in m
        assert m["Integration"]["Type"] == "AWS_PROXY"
    health = by_path["/v1/health"]
    assert health["AuthorizationType"] == "NONE" and health["ApiKeyRequired"] is False


def test_authorizer_is_an_uncached_request_authorizer(any_mode: Any) -> None:
    (auth,) = any_mode.props("AWS::ApiGateway::Authorizer")
    assert auth["Type"] == "REQUEST"
    assert auth["AuthorizerResultTtlInSeconds"] == 0
    assert not auth.get("IdentitySource")


def test_authorizer_function_may_only_read_the_api_keys(any_mode: Any) -> None:
    fns = any_mode.resources("AWS::Lambda::Function")
    (lid,) = [
        k
        for k, f in fns.items()
        if f["Properties"]
        .get("Environment", {})
        .get("Variables", {})
        .get("POWERTOOLS_SERVICE_NAME")
        == "authorizer"
    ]
    role = fns[lid]["Properties"]["Role"]["Fn::GetAtt"][0]
    statements = [
        s
        for p in any_mode.props("AWS::IAM::Policy")
        if {"Ref": role} in p["Roles"]
        for s in p["PolicyDocument"]["Statement"]
    ]
    assert len(statements) >= 1
    gets = [s for s in statements if s["Action"] == "apigateway:GET"]
    assert len(gets) == 1
    resource = json.dumps(gets[0]["Resource"])
    assert "/apikeys" in resource and "*" not in resource
    assert all("s3:" not in json.dumps(s["Action"]) for s in statements)
    assert all("dynamodb:" not in json.dumps(s["Action"]) for s in statements)


def test_gateway_errors_carry_openai_type_and_a_401(any_mode: Any) -> None:
    responses = {r["ResponseType"]: r for r in any_mode.props("AWS::ApiGateway::GatewayResponse")}
    assert responses["UNAUTHORIZED"]["StatusCode"] == "401"
    assert responses["ACCESS_DENIED"]["StatusCode"] == "403"
    body = responses["UNAUTHORIZED"]["ResponseTemplates"]["application/json"]
    assert '"type": "authentication_error"' in body and '"code": "invalid_api_key"' in body
    throttled = responses["THROTTLED"]["ResponseTemplates"]["application/json"]
    assert '"type": "rate_limit_error"' in throttled and '"details": []' in throttled


def test_multipart_bodies_over_their_limit_get_413_from_waf(any_mode: Any) -> None:
    import re

    from asyncinfer.openai_api.limits import MAX_MULTIPART_BYTES

    (acl,) = any_mode.props("AWS::WAFv2::WebACL")
    rule = {r["Name"]: r for r in acl["Rules"]}["multipart-over-lambda-limit"]
    assert rule["Action"]["Block"]["CustomResponse"]["ResponseCode"] == 413
    length, ctype = rule["Statement"]["AndStatement"]["Statements"]
    rx = re.compile(length["RegexMatchStatement"]["RegexString"])
    assert length["RegexMatchStatement"]["FieldToMatch"] == {
        "SingleHeader": {"Name": "content-length"}
    }
    for n in (0, 1, MAX_MULTIPART_BYTES - 1, MAX_MULTIPART_BYTES):
        assert not rx.match(str(n)), n
    for n in (MAX_MULTIPART_BYTES + 1, 4_500_000, 9_999_999, 10_000_000, 123_456_789):
        assert rx.match(str(n)) and rx.match(f"00{n}"), n
    match = ctype["ByteMatchStatement"]
    assert match["SearchString"] == "multipart/form-data"
    assert match["PositionalConstraint"] == "STARTS_WITH"
    assert match["TextTransformations"][0]["Type"] == "LOWERCASE"
    body = json.loads(acl["CustomResponseBodies"]["multipart_too_large"]["Content"])
    assert body["error"]["code"] == "payload_too_large"
    assert body["error"]["type"] == "invalid_request_error"
