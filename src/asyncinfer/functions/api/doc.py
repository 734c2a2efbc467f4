"""What the OpenAPI document (``GET /v1/openapi.json``) says beyond the routes' own types: the
responses of each operation with the spec's error body, the ``x-api-key`` security scheme, and
the links from a submitted job to reading and cancelling it. Everything goes through Powertools'
OpenAPI generation (route ``responses``/``security``, ``get_openapi_json_schema``); nothing is
edited into the JSON afterwards.

Statuses (spec ``../shared/spec/api.md``, "Errors"): every keyed operation may meet 403
``forbidden`` (API Gateway: no or unknown key), every operation 429 ``rate_limited`` (stage and
usage-plan throttling), 500 ``internal``, 400 ``invalid_json`` (a body, where one is sent, that
is not strict JSON) and 413 ``payload_too_large``; the routes add their own (404, 409, 422).
"""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools.event_handler import APIGatewayRestResolver
from aws_lambda_powertools.event_handler.openapi.models import APIKey, APIKeyIn
from aws_lambda_powertools.event_handler.openapi.types import OpenAPIResponse

from asyncinfer.functions.api.schemas import ErrorBody

#: Name of the security scheme (API Gateway API keys, header ``x-api-key``).
SCHEME = "apiKey"
#: ``security`` of every operation but ``GET /v1/health``.
API_KEY: list[dict[str, list[str]]] = [{SCHEME: []}]
#: Description of the ``job_id`` path parameter.
JOB_ID = "A job id (job_ + ULID); an id of another shape, or another key's job, is 404"

#: OpenAPI links from a job object in a response to the operations on that job.
JOB_LINKS: dict[str, Any] = {
    "GetJob": {
        "operationId": "get_job",
        "parameters": {"job_id": "$response.body#/id"},
        "description": "Read the job (GET /v1/jobs/{job_id})",
    },
    "CancelJob": {
        "operationId": "cancel_job",
        "parameters": {"job_id": "$response.body#/id"},
        "description": "Cancel the job (POST /v1/jobs/{job_id}/cancel)",
    },
}

_COMMON: dict[int, str] = {
    400: "A request body, where one is sent, that is not strict JSON (invalid_json)",
    413: "The request body is larger than the API takes (payload_too_large)",
    422: "Invalid request (invalid_request)",
    429: "Too many requests for this key or stage (rate_limited)",
    500: "A fault of the service, never of the input (internal)",
}
_FORBIDDEN = "No x-api-key header, or not a valid key (forbidden)"


def ok(
    description: str,
    model: type,
    *,
    location: bool = False,
    links: dict[str, Any] | None = None,
) -> OpenAPIResponse:
    """A success response whose JSON body is ``model``; ``location`` declares the ``Location``
    header (the job's URL path), ``links`` the OpenAPI links from its body."""
    resp: OpenAPIResponse = {
        "description": description,
        "content": {"application/json": {"model": model}},
    }
    if location:
        resp["headers"] = {
            "Location": {
                "description": "Path of the job: /v1/jobs/{id}",
                "schema": {"type": "string"},
            }
        }
    if links:
        resp["links"] = links
    return resp


def error(description: str) -> OpenAPIResponse:
    """An error response with the spec's body ``{"error": {"code", "message", "details"}}``."""
    return {"description": description, "content": {"application/json": {"model": ErrorBody}}}


def responses(own: dict[int, OpenAPIResponse], *, keyed: bool = True) -> dict[int, OpenAPIResponse]:
    """``own`` (the route's successes and errors) and the statuses every operation can answer
    (see the module docstring); ``keyed`` adds 403 for operations that need an API key."""
    out: dict[int, OpenAPIResponse] = {code: error(text) for code, text in _COMMON.items()}
    if keyed:
        out[403] = error(_FORBIDDEN)
    out.update(own)
    return dict(sorted(out.items()))


def configure(app: APIGatewayRestResolver, version: str) -> None:
    """Set the document's title, version, description and the ``x-api-key`` security scheme on
    ``app`` (Powertools ``configure_openapi``); ``app.get_openapi_json_schema()`` then makes the
    OpenAPI 3.1 document."""
    app.configure_openapi(
        title="asyncinfer",
        version=version,
        description="Asynchronous model inference: submit jobs, poll or wait for them, receive "
        "signed webhooks. Contract: shared/spec/api.md.",
        security_schemes={
            SCHEME: APIKey.model_validate(
                {
                    "name": "x-api-key",
                    "in": APIKeyIn.header,
                    "description": "An API Gateway API key; its id is the tenant",
                }
            )
        },
    )
