"""The OpenAPI document tells the truth (issue 17): every status an operation answers is
declared with the spec's error body, the constraints the service enforces are in the schemas,
the x-api-key scheme is described, and a submitted job links to get and cancel."""

from __future__ import annotations

import base64
import json
from typing import Any

import jsonschema
import pytest
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012

from tests.conftest import ApiCaller

OPS = {
    ("post", "/v1/jobs"),
    ("get", "/v1/jobs"),
    ("get", "/v1/jobs/{job_id}"),
    ("post", "/v1/jobs/{job_id}/cancel"),
    ("get", "/v1/models"),
    ("get", "/v1/health"),
    ("post", "/v1/uploads"),
    ("get", "/v1/webhooks/secret"),
    ("post", "/v1/webhooks/secret/rotate"),
}


@pytest.fixture
def doc(api: ApiCaller) -> dict[str, Any]:
    status, body, _ = api("GET", "/v1/openapi.json")
    assert status == 200
    return dict(body)


def op(doc: dict[str, Any], method: str, path: str) -> dict[str, Any]:
    return dict(doc["paths"][path][method])


def validator(doc: dict[str, Any], name: str) -> jsonschema.Draft202012Validator:
    """A validator for ``components.schemas[name]`` resolving the document's own refs."""
    resource = Resource.from_contents(doc, default_specification=DRAFT202012)
    registry: Registry = Registry().with_resource("urn:doc", resource)
    schema = {"$ref": f"urn:doc#/components/schemas/{name}"}
    return jsonschema.Draft202012Validator(schema, registry=registry)


def test_every_operation_is_documented(doc: dict[str, Any]) -> None:
    found = {(m, p) for p, item in doc["paths"].items() for m in item}
    assert found == OPS


@pytest.mark.parametrize(
    ("method", "path", "statuses"),
    [
        ("post", "/v1/jobs", {200, 202, 400, 403, 409, 413, 422, 429, 500}),
        ("get", "/v1/jobs/{job_id}", {200, 403, 404, 422, 429, 500}),
        ("post", "/v1/jobs/{job_id}/cancel", {200, 403, 404, 409, 429, 500}),
        ("get", "/v1/jobs", {200, 403, 422, 429, 500}),
        ("post", "/v1/uploads", {201, 403, 429, 500}),
        ("get", "/v1/health", {200, 429, 500}),
    ],
)
def test_statuses_are_declared_with_the_error_body(
    doc: dict[str, Any], method: str, path: str, statuses: set[int]
) -> None:
    responses = op(doc, method, path)["responses"]
    assert statuses <= {int(s) for s in responses}
    for status, resp in responses.items():
        ref = resp["content"]["application/json"]["schema"]["$ref"]
        if int(status) >= 400:
            assert ref == "#/components/schemas/ErrorBody", (status, ref)
    body = validator(doc, "ErrorBody")
    body.validate({"error": {"code": "not_found", "message": "x", "details": []}})
    assert not body.is_valid({"error": {"code": "nope", "message": "x", "details": []}})
    assert "HTTPValidationError" not in str(doc["paths"])


def test_security_scheme_is_the_api_key_header(doc: dict[str, Any]) -> None:
    assert doc["components"]["securitySchemes"]["apiKey"] == {
        "type": "apiKey",
        "in": "header",
        "name": "x-api-key",
        "description": "An API Gateway API key; its id is the tenant",
    }
    for method, path in OPS - {("get", "/v1/health")}:
        assert op(doc, method, path)["security"] == [{"apiKey": []}], path
    assert "security" not in op(doc, "get", "/v1/health")
    assert "security" not in doc


def test_submit_links_to_get_and_cancel(doc: dict[str, Any]) -> None:
    for status in ("200", "202"):
        resp = op(doc, "post", "/v1/jobs")["responses"][status]
        links = resp["links"]
        assert links["GetJob"]["operationId"] == op(doc, "get", "/v1/jobs/{job_id}")["operationId"]
        assert (
            links["CancelJob"]["operationId"]
            == op(doc, "post", "/v1/jobs/{job_id}/cancel")["operationId"]
        )
        assert links["GetJob"]["parameters"] == {"job_id": "$response.body#/id"}
        assert "Location" in resp["headers"]


def params(doc: dict[str, Any], method: str, path: str) -> dict[str, dict[str, Any]]:
    return {p["name"].lower(): p["schema"] for p in op(doc, method, path).get("parameters", [])}


def test_parameter_constraints(doc: dict[str, Any]) -> None:
    listing = params(doc, "get", "/v1/jobs")
    assert listing["cursor"]["anyOf"][0]["pattern"] == "^[A-Za-z0-9_-]{0,512}$"
    assert listing["status"]["anyOf"][0]["enum"] == [
        "queued", "running", "succeeded", "failed", "cancelled", "expired"
    ]  # fmt: skip
    assert (listing["limit"]["minimum"], listing["limit"]["maximum"]) == (1, 100)
    wait = params(doc, "get", "/v1/jobs/{job_id}")["wait"]
    assert (wait["minimum"], wait["maximum"]) == (0, 20)
    job_id = params(doc, "get", "/v1/jobs/{job_id}")["job_id"]
    assert job_id["pattern"] == "^job_[0-9A-HJKMNP-TV-Z]{26}$"
    key = params(doc, "post", "/v1/jobs")["idempotency-key"]["anyOf"][0]
    assert (key["minLength"], key["maxLength"]) == (1, 255)


@pytest.mark.parametrize(
    ("body", "valid"),
    [
        ({"model": "echo", "input": {}}, True),
        ({"model": "echo", "input_url": "s3://b/uploads/t/x.json"}, True),
        ({"model": "echo", "input": None, "input_url": "s3://b/k"}, True),
        ({"model": "echo"}, False),
        ({"model": "echo", "input": None, "input_url": None}, False),
        ({"model": "echo", "input": {}, "input_url": "s3://b/k"}, False),
        ({"model": "echo", "input_url": "https://b/k"}, False),
        ({"model": "not-deployed", "input": {}}, False),
        ({"model": "echo", "input": {}, "ttl_seconds": 9}, False),
        ({"model": "echo", "input": {}, "timeout_seconds": 3601}, False),
        ({"model": "echo", "input": {}, "priority": "urgent"}, False),
        ({"model": "echo", "input": {}, "metadata": {str(i): "v" for i in range(17)}}, False),
        ({"model": "echo", "input": {}, "metadata": {"": "v"}}, False),
        ({"model": "echo", "input": {}, "metadata": {"k": 1}}, False),
        ({"model": "echo", "input": {}, "webhook": {"url": "ftp://x/y"}}, False),
        ({"model": "echo", "input": {}, "webhook": {"url": "https://x/y", "events": []}}, False),
        ({"model": "echo", "input": {}, "extra": 1}, False),
    ],
)
def test_job_request_schema_agrees_with_the_service(
    doc: dict[str, Any], api: ApiCaller, body: dict[str, Any], valid: bool
) -> None:
    assert validator(doc, "JobRequest").is_valid(body) is valid
    if not valid:
        status, resp, _ = api("POST", "/v1/jobs", body)
        assert status == 422, resp


def test_deployed_models_are_the_model_enum(doc: dict[str, Any]) -> None:
    model = doc["components"]["schemas"]["JobRequest"]["properties"]["model"]
    assert set(model["enum"]) == {"smollm2-135m-instruct", "all-minilm-l6-v2", "echo"}


@pytest.mark.parametrize(
    ("ttl", "status"), [(355.0, 202), (355, 202), (355.5, 422), ("355", 422), (True, 422)]
)
def test_integral_seconds_are_integers_as_json_schema_says(
    api: ApiCaller, ttl: Any, status: int
) -> None:
    body = {"model": "echo", "input": {}, "ttl_seconds": ttl, "timeout_seconds": ttl}
    got, resp, _ = api("POST", "/v1/jobs", body)
    assert got == status, resp
    if status == 202:
        assert resp["expires_at"] > resp["created_at"]


def test_schema_valid_query_values_are_accepted(api: ApiCaller) -> None:
    for query in ("status=expired", "model=echo", "limit=100", "limit=1"):
        status, resp, _ = api("GET", f"/v1/jobs?{query}")
        assert status == 200, (query, resp)


@pytest.mark.parametrize("cursor", ["a" * 513, "abc=", "a/b", "a+b"])
def test_cursor_of_another_shape_is_422_naming_cursor(api: ApiCaller, cursor: str) -> None:
    status, resp, _ = api("GET", f"/v1/jobs?cursor={cursor}")
    assert status == 422, resp
    assert resp["error"]["details"][0]["field"] == "cursor"


def test_well_shaped_forged_cursor_gets_a_declared_status(
    api: ApiCaller, doc: dict[str, Any]
) -> None:
    forged = base64.urlsafe_b64encode(b'{"x": 1}').decode().rstrip("=")
    status, resp, _ = api("GET", f"/v1/jobs?cursor={forged}")
    assert str(status) in op(doc, "get", "/v1/jobs")["responses"]
    assert status in (400, 422) and resp["error"]["details"][0]["field"] == "cursor"


@pytest.mark.parametrize(
    ("method", "path", "allow"),
    [
        ("DELETE", "/v1/jobs", "GET, HEAD, POST"),
        ("PUT", "/v1/models", "GET, HEAD"),
        ("GET", "/v1/jobs/job_01ARZ3NDEKTSV4RRFFQ69G5FAV/cancel", "POST"),
        ("HEAD", "/v1/uploads", "POST"),
        ("PATCH", "/v1/jobs/job_01ARZ3NDEKTSV4RRFFQ69G5FAV", "GET, HEAD"),
        ("POST", "/v1/openapi.json", "GET, HEAD"),
    ],
)
def test_known_path_with_another_method_is_405_with_allow(
    api: ApiCaller, method: str, path: str, allow: str
) -> None:
    status, resp, headers = api(method, path)
    assert status == 405
    assert resp["error"]["code"] == "method_not_allowed"
    assert headers["allow"] == allow


def test_head_is_answered_as_get(api: ApiCaller) -> None:
    assert api("HEAD", "/v1/models")[:2] == api("GET", "/v1/models")[:2]
    status, resp, _ = api("HEAD", "/v1/jobs/job_01ARZ3NDEKTSV4RRFFQ69G5FAV")
    assert status == 404 and resp["error"]["code"] == "not_found"


def test_idempotency_key_header_out_of_range_is_422(api: ApiCaller) -> None:
    status, resp, _ = api(
        "POST", "/v1/jobs", {"model": "echo", "input": {}}, headers={"Idempotency-Key": "k" * 256}
    )
    assert status == 422
    assert resp["error"]["details"][0]["field"] == "Idempotency-Key"


@pytest.mark.parametrize(
    ("sent", "server"),
    [
        ("/v1/openapi.json", "/"),
        ("/prod/v1/openapi.json", "/prod"),
        ("/a/b/v1/openapi.json", "/a/b"),
    ],
)
def test_server_is_the_path_the_api_is_served_under(resources: Any, sent: str, server: str) -> None:
    from asyncinfer.functions.api.app import handler
    from asyncinfer.local.gateway import build_event
    from asyncinfer.local.lambda_runtime import LocalContext

    event = build_event(
        "GET", "/v1/openapi.json", [], b"", api_key="k", api_key_id="t", source_ip="127.0.0.1"
    )
    event["requestContext"]["path"] = sent
    resp = handler(event, LocalContext())
    assert resp["statusCode"] == 200
    assert [s["url"] for s in json.loads(resp["body"])["servers"]] == [server]
