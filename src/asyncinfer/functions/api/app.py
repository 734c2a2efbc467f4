"""The REST API on Powertools' ``APIGatewayRestResolver`` with data validation.

Routes (spec, "Endpoints"): ``POST /v1/jobs``, ``GET /v1/jobs/{id}`` (``?wait=N``),
``POST /v1/jobs/{id}/cancel``, ``GET /v1/jobs``, ``GET /v1/models``, ``GET /v1/health``,
``GET /v1/openapi.json``, ``POST /v1/uploads``, ``GET /v1/webhooks/secret``,
``POST /v1/webhooks/secret/rotate``.

The tenant is ``requestContext.identity.apiKeyId`` of the proxy event (API Gateway API keys).
Errors map to responses by type: :class:`~asyncinfer.core.errors.ApiError` subclasses carry their
code
and status; Powertools' ``RequestValidationError`` becomes 400 ``invalid_json`` or 422
``invalid_request`` naming the fields.
"""

from __future__ import annotations

import json
import re
from functools import lru_cache
from typing import Annotated, Any

from aws_lambda_powertools.event_handler import APIGatewayRestResolver, Response
from aws_lambda_powertools.event_handler.exceptions import NotFoundError
from aws_lambda_powertools.event_handler.openapi.exceptions import RequestValidationError
from aws_lambda_powertools.event_handler.openapi.models import Server
from aws_lambda_powertools.event_handler.openapi.params import Body, Header, Path, Query
from aws_lambda_powertools.utilities.typing import LambdaContext

from asyncinfer import __version__
from asyncinfer.aws import clients
from asyncinfer.core.errors import (
    ApiError,
    MethodNotAllowed,
    NotFound,
)
from asyncinfer.core.observability import instrument, powertools, single
from asyncinfer.core.settings import get_settings
from asyncinfer.functions.api import doc
from asyncinfer.functions.api.body import body_error, normalise, request_error
from asyncinfer.functions.api.schemas import (
    IDEMPOTENCY_KEY_MAX,
    JOB_ID_PATTERN,
    HealthView,
    JobList,
    JobRequest,
    JobStatus,
    JobView,
    ModelList,
    UploadView,
)
from asyncinfer.jobs.cursors import CURSOR_PATTERN
from asyncinfer.jobs.inputs import UPLOAD_URL_SECONDS, new_upload
from asyncinfer.jobs.service import JobService
from asyncinfer.openai_api import app as openai_app
from asyncinfer.openai_api.auth import is_openai_path
from asyncinfer.webhooks.secrets import SecretStore, WebhookSecretView

logger, tracer, metrics = powertools("asyncinfer-api")

__all__ = ["UPLOAD_URL_SECONDS", "app", "handler"]

app = APIGatewayRestResolver(enable_validation=True)
doc.configure(app, __version__)


@lru_cache(maxsize=1)
def service() -> JobService:
    """The job service of this process (built once, on first use)."""
    return JobService(get_settings().api)


def tenant() -> str:
    """The caller's tenant: the API key id API Gateway put in the request context."""
    key_id = (app.current_event.request_context.identity.api_key_id or "").strip()
    if not key_id:  # API key source AUTHORIZER: the authorizer also passes the key's id
        authorizer = app.current_event.raw_event.get("requestContext", {}).get("authorizer")
        key_id = str((authorizer or {}).get("apiKeyId") or "").strip()
    if not key_id:
        # API Gateway rejects keyless calls before they reach us; this guards misconfiguration.
        raise ApiError("no API key identity in the request")
    return key_id


def json_response(status: int, body: Any, headers: dict[str, str] | None = None) -> Response:
    """A JSON response (the body serialized by Powertools)."""
    return Response(status_code=status, content_type="application/json", body=body, headers=headers)


# ---------------------------------------------------------------------------- routes
@app.get(
    "/v1/health",
    operation_id="health",
    responses=doc.responses({200: doc.ok("Alive", HealthView)}, keyed=False),
)
def health() -> HealthView:
    """Liveness: ``{"status": "ok"}``. Needs no API key."""
    return HealthView(status="ok")


@app.get(
    "/v1/models",
    operation_id="list_models",
    security=doc.API_KEY,
    responses=doc.responses({200: doc.ok("The models deployed here", ModelList)}),
)
def models() -> dict[str, Any]:
    """The deployed models: ``{"models": [{"id", "task", "input_schema", "max_batch_size"}]}``."""
    return {"models": service().deployed_models()}


@app.get("/v1/openapi.json", include_in_schema=False)
def openapi() -> Response[dict]:
    """The OpenAPI 3 document of this API, generated from the routes and pydantic models. Its
    server is the path the API is served under (:func:`base_path`), so that the document's
    paths resolve against the URL it was fetched from."""
    server = Server(url=base_path() or "/", description="This deployment")
    return json_response(200, json.loads(app.get_openapi_json_schema(servers=[server])))


def base_path() -> str:
    """The URL path in front of the API's own paths for this request: the stage (``/prod``) on
    the ``execute-api`` domain, a custom domain's base path mapping, or ``""``. It is
    ``requestContext.path`` (the path as the client sent it) less the resource ``path``."""
    event = app.current_event
    sent = event.request_context.path or ""
    own = event.path or ""
    if own and sent.endswith(own):
        return sent[: -len(own)].rstrip("/")
    return ""


@app.post(
    "/v1/jobs",
    operation_id="submit_job",
    security=doc.API_KEY,
    responses=doc.responses(
        {
            202: doc.ok("Created", JobView, location=True, links=doc.JOB_LINKS),
            200: doc.ok(
                "Idempotent replay of an earlier submit",
                JobView,
                location=True,
                links=doc.JOB_LINKS,
            ),
            400: doc.error("The body is not valid JSON (invalid_json)"),
            409: doc.error("Idempotency-Key reused with another body (conflict)"),
            413: doc.error("The body is larger than 6 MB; use POST /v1/uploads"),
            422: doc.error(
                "Invalid request, unknown model or an input the model refuses (invalid_request)"
            ),
        }
    ),
)
def submit_job(
    body: Annotated[JobRequest, Body()],
    idempotency_key: Annotated[
        str | None,
        Header(
            alias="Idempotency-Key",
            min_length=1,
            max_length=IDEMPOTENCY_KEY_MAX,
            description="The same key and body within 24 h return the original job (200); "
            "another body 409",
        ),
    ] = None,
) -> Response[JobView]:
    """Create a job; 202 with the job object and ``Location``. ``Idempotency-Key`` header: the
    same key and body return the original job (200), another body 409."""
    job, created = service().submit(tenant(), body, idempotency_key=idempotency_key)
    logger.set_correlation_id(job["id"])
    if created:
        single("JobsSubmitted", dimensions={"Model": body.model})
    return json_response(202 if created else 200, job, {"Location": job["urls"]["get"]})


JobId = Annotated[str, Path(json_schema_extra={"pattern": JOB_ID_PATTERN}, description=doc.JOB_ID)]


@app.get(
    "/v1/jobs/<job_id>",
    operation_id="get_job",
    security=doc.API_KEY,
    responses=doc.responses(
        {
            200: doc.ok("The job", JobView),
            404: doc.error("No such job for this API key (not_found)"),
            422: doc.error("wait out of range (invalid_request)"),
            429: doc.error(
                "More concurrent waits (?wait) for this API key than the service allows "
                "(rate_limited; Retry-After)"
            ),
        }
    ),
)
def get_job(
    job_id: JobId,
    wait: Annotated[
        float,
        Query(
            ge=0,
            le=20,
            allow_inf_nan=False,
            description="Seconds to hold the response until the job is terminal",
        ),
    ] = 0.0,
) -> JobView:
    """The job object; ``?wait=N`` (0..20 s) holds until the job is terminal or N s pass. A
    tenant may hold at most ``ASYNCINFER_MAX_WAITS_PER_TENANT`` waits at once; one more is 429
    ``rate_limited`` with ``Retry-After``, at once (:mod:`asyncinfer.jobs.waits`)."""
    logger.set_correlation_id(job_id)
    return JobView.model_validate(service().get(tenant(), job_id, wait=wait))


@app.post(
    "/v1/jobs/<job_id>/cancel",
    operation_id="cancel_job",
    security=doc.API_KEY,
    responses=doc.responses(
        {
            200: doc.ok("The job, cancelled (or stopping at its next step)", JobView),
            404: doc.error("No such job for this API key (not_found)"),
            409: doc.error("The job is already terminal (conflict)"),
        }
    ),
)
def cancel_job(job_id: JobId) -> JobView:
    """Cancel a job: queued at once, running at the next step; 409 for a terminal job."""
    logger.set_correlation_id(job_id)
    return JobView.model_validate(service().cancel(tenant(), job_id))


@app.get(
    "/v1/jobs",
    operation_id="list_jobs",
    security=doc.API_KEY,
    responses=doc.responses(
        {
            200: doc.ok("A page of jobs, newest first", JobList),
            422: doc.error(
                "A query parameter out of range, or a cursor this API did not issue "
                "to this key (invalid_request)"
            ),
        }
    ),
)
def list_jobs(
    status: Annotated[JobStatus | None, Query(description="Only jobs in this status")] = None,
    model: Annotated[
        str | None, Query(min_length=1, max_length=128, description="Only jobs of this model")
    ] = None,
    limit: Annotated[int, Query(ge=1, le=100, description="Page size")] = 20,
    cursor: Annotated[
        str | None,
        Query(pattern=CURSOR_PATTERN, description="next_cursor of the previous page"),
    ] = None,
) -> JobList:
    """The caller's jobs, newest first: ``{"jobs": [...], "next_cursor": ...}``."""
    page = service().list(tenant(), limit=limit, cursor=cursor, status=status, model=model)
    return JobList.model_validate(page)


@app.post(
    "/v1/uploads",
    operation_id="create_upload",
    security=doc.API_KEY,
    responses=doc.responses({201: doc.ok("Created", UploadView)}),
)
def create_upload() -> Response[UploadView]:
    """Where to upload a large input: 201 ``{"upload_url", "input_url", "expires_at",
    "max_bytes", "upload_form"}``. POST the file with ``upload_form`` (S3 refuses one over
    ``max_bytes``) or PUT it to ``upload_url``, then submit a job with ``input_url``."""
    svc = service()
    body = new_upload(svc.settings, clients.client("s3", svc.settings), tenant())
    return json_response(201, body)


@app.get(
    "/v1/webhooks/secret",
    operation_id="get_webhook_secret",
    security=doc.API_KEY,
    responses=doc.responses({200: doc.ok("The signing secrets", WebhookSecretView)}),
)
def get_webhook_secret() -> WebhookSecretView:
    """The caller's webhook signing secret (``whsec_...``; made on first use) and, after a
    rotation, the previous one while it is still valid. Deliveries are signed with both then."""
    return SecretStore(service().settings).get(tenant())


@app.post(
    "/v1/webhooks/secret/rotate",
    operation_id="rotate_webhook_secret",
    security=doc.API_KEY,
    responses=doc.responses(
        {200: doc.ok("The new secret and the previous one", WebhookSecretView)}
    ),
)
def rotate_webhook_secret() -> WebhookSecretView:
    """Make a new webhook signing secret; the previous one stays valid for 24 h."""
    return SecretStore(service().settings).rotate(tenant())


# ---------------------------------------------------------------------------- errors
def error_response(exc: ApiError, headers: dict[str, str] | None = None) -> Response:
    """The spec's error body for ``exc`` at its HTTP status, with the error's own headers
    (:meth:`ApiError.headers`, e.g. ``Retry-After`` of a 429) and ``headers``."""
    return json_response(exc.http_status, exc.body(), {**exc.headers(), **(headers or {})})


@lru_cache(maxsize=1)
def _route_table() -> tuple[tuple[re.Pattern[str], frozenset[str]], ...]:
    """``(path regex, methods)`` of every route, from the routes' OpenAPI paths (``{name}``
    matches one path segment, as Powertools' ``<name>`` does)."""
    paths: dict[str, set[str]] = {"/v1/openapi.json": {"GET"}}
    for path, item in (app.get_openapi_schema().paths or {}).items():
        methods = {m.upper() for m, op in item.model_dump(exclude_none=True).items() if op}
        paths.setdefault(path, set()).update(methods & _HTTP_METHODS)
    table = []
    for path, methods in paths.items():
        rx = "^" + re.sub(r"\\\{[^/]+?\\\}", "[^/]+", re.escape(path)) + "$"
        table.append((re.compile(rx), frozenset(methods)))
    return tuple(table)


_HTTP_METHODS = frozenset({"GET", "PUT", "POST", "DELETE", "OPTIONS", "HEAD", "PATCH", "TRACE"})


def allowed_methods(path: str) -> list[str]:
    """The methods the API has for ``path`` (empty when no route has the path); ``HEAD``
    wherever ``GET`` is (RFC 9110 9.3.2, answered by :func:`handler`)."""
    found: set[str] = set()
    for rx, methods in _route_table():
        if rx.match(path):
            found |= methods
    if "GET" in found:
        found.add("HEAD")
    return sorted(found)


@app.exception_handler(ApiError)
def on_api_error(exc: ApiError) -> Response:
    if exc.http_status >= 500:
        logger.exception("api error")
    return error_response(exc)


@app.exception_handler(RequestValidationError)
def on_validation_error(exc: RequestValidationError) -> Response:
    return error_response(request_error(list(exc.errors())))


@app.not_found
def on_not_found(exc: NotFoundError) -> Response:
    """No route for this method and path: 405 with ``Allow`` when the path exists with other
    methods (RFC 9110), else 404."""
    event = app.current_event
    allowed = allowed_methods(event.path)
    if allowed:
        exc_405 = MethodNotAllowed(f"{event.path} takes only {', '.join(allowed)}")
        return error_response(exc_405, {"Allow": ", ".join(allowed)})
    return error_response(NotFound("no such route"))


@app.exception_handler(Exception)
def on_unexpected(exc: Exception) -> Response:
    logger.exception("unexpected error")
    return error_response(ApiError("internal error"))


# ---------------------------------------------------------------------------- entry point
@instrument(logger, tracer, metrics, correlation_id_path="requestContext.requestId")
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    """The API Lambda's entry point (API Gateway REST proxy integration). ``HEAD`` is answered
    as ``GET`` (the gateway sends no body for it). Requests under ``/openai/`` go to the
    OpenAI-compatible surface (:mod:`asyncinfer.openai_api.app`), which takes its own bodies."""
    if event.get("httpMethod") == "HEAD":
        event = {**event, "httpMethod": "GET"}
    if is_openai_path(event.get("path") or ""):
        return openai_app.handle(event, context)
    error = body_error(event)
    if error is not None:
        return {
            "statusCode": error.http_status,
            "headers": {"Content-Type": "application/json"},
            "body": json.dumps(error.body()),
            "isBase64Encoded": False,
        }
    return app.resolve(normalise(event), context)
