"""The REST API on Powertools' ``APIGatewayRestResolver`` with data validation.

Routes (spec, "Endpoints"): ``POST /v1/jobs``, ``GET /v1/jobs/{id}`` (``?wait=N``),
``POST /v1/jobs/{id}/cancel``, ``GET /v1/jobs``, ``GET /v1/models``, ``GET /v1/health``,
``GET /v1/openapi.json``, ``POST /v1/uploads``, ``GET /v1/webhooks/secret``,
``POST /v1/webhooks/secret/rotate``.

The tenant is ``requestContext.identity.apiKeyId`` of the proxy event (API Gateway API keys).
Errors map to responses by type: :class:`~asyncinfer.errors.ApiError` subclasses carry their code
and status; Powertools' ``RequestValidationError`` becomes 400 ``invalid_json`` or 422
``invalid_request`` naming the fields.
"""

from __future__ import annotations

import base64
import json
from functools import lru_cache
from typing import Annotated, Any

from aws_lambda_powertools.event_handler import APIGatewayRestResolver, Response
from aws_lambda_powertools.event_handler.exceptions import NotFoundError
from aws_lambda_powertools.event_handler.openapi.exceptions import RequestValidationError
from aws_lambda_powertools.event_handler.openapi.params import Body, Query
from aws_lambda_powertools.event_handler.openapi.types import OpenAPIResponse
from aws_lambda_powertools.utilities.typing import LambdaContext

from asyncinfer import __version__, clients
from asyncinfer.api.schemas import ErrorBody, JobList, JobRequest, JobView, UploadView
from asyncinfer.errors import ApiError, InvalidJson, InvalidRequest, NotFound, PayloadTooLarge
from asyncinfer.inputs import UPLOAD_URL_SECONDS, new_upload
from asyncinfer.jobs import JobService
from asyncinfer.lifecycle import STATUSES
from asyncinfer.observability import instrument, powertools, single
from asyncinfer.settings import get_settings
from asyncinfer.webhooks.secrets import SecretStore, WebhookSecretView

logger, tracer, metrics = powertools("asyncinfer-api")

#: Largest request body the handler takes, bytes. A Lambda proxy request is capped at 6 MB;
#: larger inputs go through POST /v1/uploads.
MAX_BODY_BYTES = 6 * 1024 * 1024
__all__ = ["UPLOAD_URL_SECONDS", "app", "handler"]

app = APIGatewayRestResolver(enable_validation=True)


@lru_cache(maxsize=1)
def service() -> JobService:
    """The job service of this process (built once, on first use)."""
    return JobService(get_settings())


def tenant() -> str:
    """The caller's tenant: the API key id API Gateway put in the request context."""
    key_id = (app.current_event.request_context.identity.api_key_id or "").strip()
    if not key_id:
        # API Gateway rejects keyless calls before they reach us; this guards misconfiguration.
        raise ApiError("no API key identity in the request")
    return key_id


def _doc(description: str, model: type) -> OpenAPIResponse:
    return {"description": description, "content": {"application/json": {"model": model}}}


def json_response(status: int, body: Any, headers: dict[str, str] | None = None) -> Response:
    """A JSON response (the body serialized by Powertools)."""
    return Response(status_code=status, content_type="application/json", body=body, headers=headers)


# ---------------------------------------------------------------------------- routes
@app.get("/v1/health")
def health() -> dict[str, str]:
    """Liveness: ``{"status": "ok"}``. Needs no API key."""
    return {"status": "ok"}


@app.get("/v1/models")
def models() -> dict[str, Any]:
    """The deployed models: ``{"models": [{"id", "task", "input_schema", "max_batch_size"}]}``."""
    return {"models": service().deployed_models()}


@app.get("/v1/openapi.json", include_in_schema=False)
def openapi() -> Response[dict]:
    """The OpenAPI 3 document of this API, generated from the routes and pydantic models."""
    doc = app.get_openapi_json_schema(
        title="asyncinfer", version=__version__, description="Asynchronous model inference"
    )
    return json_response(200, json.loads(doc))


@app.post(
    "/v1/jobs",
    responses={
        202: _doc("Created", JobView),
        200: _doc("Idempotent replay of an earlier submit", JobView),
        409: _doc("Idempotency-Key reused with another body", ErrorBody),
        422: _doc("Invalid request", ErrorBody),
    },
)
def submit_job(body: Annotated[JobRequest, Body()]) -> Response[JobView]:
    """Create a job; 202 with the job object and ``Location``. ``Idempotency-Key`` header: the
    same key and body return the original job (200), another body 409."""
    key = app.current_event.headers.get("idempotency-key")  # case-insensitive
    job, created = service().submit(tenant(), body, idempotency_key=key)
    logger.set_correlation_id(job["id"])
    if created:
        single("JobsSubmitted", dimensions={"Model": body.model})
    return json_response(202 if created else 200, job, {"Location": job["urls"]["get"]})


@app.get("/v1/jobs/<job_id>")
def get_job(job_id: str, wait: Annotated[float, Query(ge=0, le=20)] = 0.0) -> JobView:
    """The job object; ``?wait=N`` (0..20 s) holds until the job is terminal or N s pass."""
    logger.set_correlation_id(job_id)
    return JobView.model_validate(service().get(tenant(), job_id, wait=wait))


@app.post("/v1/jobs/<job_id>/cancel")
def cancel_job(job_id: str) -> JobView:
    """Cancel a job: queued at once, running at the next step; 409 for a terminal job."""
    logger.set_correlation_id(job_id)
    return JobView.model_validate(service().cancel(tenant(), job_id))


@app.get("/v1/jobs")
def list_jobs(
    status: Annotated[str | None, Query()] = None,
    model: Annotated[str | None, Query()] = None,
    limit: Annotated[int, Query(ge=1, le=100)] = 20,
    cursor: Annotated[str | None, Query(max_length=2048)] = None,
) -> JobList:
    """The caller's jobs, newest first: ``{"jobs": [...], "next_cursor": ...}``."""
    if status is not None and status not in STATUSES:
        raise InvalidRequest(
            f"unknown status {status!r}",
            [{"field": "status", "message": f"must be one of {list(STATUSES)}"}],
        )
    page = service().list(tenant(), limit=limit, cursor=cursor, status=status, model=model)
    return JobList.model_validate(page)


@app.post(
    "/v1/uploads",
    responses={201: _doc("Created", UploadView)},
)
def create_upload() -> Response[UploadView]:
    """Where to upload a large input: 201 ``{"upload_url", "input_url", "expires_at",
    "max_bytes", "upload_form"}``. POST the file with ``upload_form`` (S3 refuses one over
    ``max_bytes``) or PUT it to ``upload_url``, then submit a job with ``input_url``."""
    svc = service()
    body = new_upload(svc.settings, clients.client("s3", svc.settings), tenant())
    return json_response(201, body)


@app.get("/v1/webhooks/secret")
def get_webhook_secret() -> WebhookSecretView:
    """The caller's webhook signing secret (``whsec_...``; made on first use) and, after a
    rotation, the previous one while it is still valid. Deliveries are signed with both then."""
    return SecretStore(service().settings).get(tenant())


@app.post("/v1/webhooks/secret/rotate")
def rotate_webhook_secret() -> WebhookSecretView:
    """Make a new webhook signing secret; the previous one stays valid for 24 h."""
    return SecretStore(service().settings).rotate(tenant())


# ---------------------------------------------------------------------------- errors
def error_response(exc: ApiError) -> Response:
    """The spec's error body for ``exc`` at its HTTP status."""
    return json_response(exc.http_status, exc.body())


@app.exception_handler(ApiError)
def on_api_error(exc: ApiError) -> Response:
    if exc.http_status >= 500:
        logger.exception("api error")
    return error_response(exc)


@app.exception_handler(RequestValidationError)
def on_validation_error(exc: RequestValidationError) -> Response:
    errors = list(exc.errors())
    if any(e.get("type") == "json_invalid" for e in errors):
        return error_response(InvalidJson("the request body is not valid JSON"))
    details = []
    for err in errors:
        loc = [str(p) for p in err.get("loc", ())]
        if loc and loc[0] in ("body", "query", "path", "header"):
            loc = loc[1:]
        details.append(
            {
                "field": ".".join(loc) or "body",
                "message": err.get("msg", ""),
                "type": err.get("type"),
            }
        )
    fields = ", ".join(d["field"] for d in details)
    return error_response(InvalidRequest(f"invalid request: {fields}", details))


@app.not_found
def on_not_found(exc: NotFoundError) -> Response:
    return error_response(NotFound("no such route"))


@app.exception_handler(Exception)
def on_unexpected(exc: Exception) -> Response:
    logger.exception("unexpected error")
    return error_response(ApiError("internal error"))


# ---------------------------------------------------------------------------- entry point
def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def _body_error(event: dict[str, Any]) -> ApiError | None:
    """Check the body before routing, as strict JSON: too large (413); not UTF-8, not JSON,
    ``NaN``/``Infinity``, nested too deeply, or unpaired surrogates (400 ``invalid_json``); and
    no body at all where one is required (400). ``None`` when the body is fine."""
    raw = event.get("body")
    if raw is None or raw == "":
        if event.get("httpMethod") == "POST" and (event.get("path") or "") == "/v1/jobs":
            return InvalidJson("the request body is empty; send a JSON object")
        return None
    data: bytes
    if event.get("isBase64Encoded"):
        try:
            data = base64.b64decode(raw)
        except ValueError:
            return InvalidJson("the request body is not valid base64")
    else:
        data = raw.encode("utf-8", "surrogatepass") if isinstance(raw, str) else raw
    if len(data) > MAX_BODY_BYTES:
        return PayloadTooLarge(
            f"request body is larger than {MAX_BODY_BYTES} bytes; "
            "upload large inputs with POST /v1/uploads and submit input_url"
        )
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return InvalidJson("the request body is not UTF-8")
    try:
        parsed = json.loads(text, parse_constant=_reject_constant)
    except RecursionError:
        return InvalidJson("the request body is nested too deeply")
    except ValueError as exc:
        return InvalidJson(f"the request body is not valid JSON: {exc}")
    try:
        json.dumps(parsed, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        return InvalidJson("the request body has an unpaired UTF-16 surrogate escape (\\uD800)")
    except RecursionError:
        return InvalidJson("the request body is nested too deeply")
    return None


def _normalise(event: dict[str, Any]) -> dict[str, Any]:
    """The API takes JSON only: treat a missing or other content type as JSON (curl -d sends form
    encoding by default) rather than parsing forms."""
    headers = event.get("headers") or {}
    for name in list(headers):
        if name.lower() == "content-type":
            del headers[name]
    headers["content-type"] = "application/json"
    event["headers"] = headers
    if event.get("multiValueHeaders"):
        event["multiValueHeaders"] = {
            k: v for k, v in event["multiValueHeaders"].items() if k.lower() != "content-type"
        }
        event["multiValueHeaders"]["content-type"] = ["application/json"]
    return event


@instrument(logger, tracer, metrics, correlation_id_path="requestContext.requestId")
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    """The API Lambda's entry point (API Gateway REST proxy integration)."""
    error = _body_error(event)
    if error is not None:
        return {
            "statusCode": error.http_status,
            "headers": {"Content-Type": "application/json"},
            "body": json.dumps(error.body()),
            "isBase64Encoded": False,
        }
    return app.resolve(_normalise(event), context)
