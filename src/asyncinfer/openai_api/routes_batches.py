"""``/openai/v1/batches`` routes (spec openai.md, "Batches"): a Powertools ``Router`` that
``asyncinfer.functions.api.app`` mounts under ``/openai/v1``.

``POST /batches`` -> 200 Batch object (``validating``); ``GET /batches/{id}``;
``GET /batches?limit=&after=`` (newest first, OpenAI's list page); ``POST /batches/{id}/cancel``
(idempotent). Errors are OpenAI's error body (:func:`.errors.from_api_error`), raised and mapped
inside each route, so the router adds no exception handler to the app (a router's handlers
would apply to every route of the app).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from functools import lru_cache
from typing import Any

from aws_lambda_powertools.event_handler import Response
from aws_lambda_powertools.event_handler.api_gateway import Router

from asyncinfer.core.errors import ApiError, InvalidJson, InvalidRequest, Unauthorized
from asyncinfer.core.settings import get_settings
from asyncinfer.openai_api.batches import BatchService, parse_request
from asyncinfer.openai_api.errors import from_api_error

router = Router()

#: ``limit`` of ``GET /batches`` (OpenAI's: 1..100, default 20).
LIST_DEFAULT, LIST_MAX = 20, 100


@lru_cache(maxsize=1)
def service() -> BatchService:
    """The batch service of this process (built once, on first use)."""
    return BatchService(get_settings().openai)


def _tenant() -> str:
    """The caller's tenant: ``requestContext.identity.apiKeyId``, or the ``apiKeyId`` the Lambda
    authorizer put in ``requestContext.authorizer`` (API key source ``AUTHORIZER``), as on
    ``/v1`` and the Files routes; neither is :class:`Unauthorized` (401)."""
    ctx = router.current_event.raw_event.get("requestContext") or {}
    key_id = str((ctx.get("identity") or {}).get("apiKeyId") or "").strip()
    if not key_id:
        key_id = str((ctx.get("authorizer") or {}).get("apiKeyId") or "").strip()
    if not key_id:
        raise Unauthorized("no API key identity in the request")
    return key_id


def _json(status: int, body: dict[str, Any]) -> Response[dict]:
    return Response(status_code=status, content_type="application/json", body=body)


def openai_errors(fn: Callable[[], Any]) -> Response[dict]:
    """Run ``fn`` (a route's work): 200 with its result, or an :class:`ApiError` as OpenAI's
    error body at its status."""
    try:
        return _json(200, fn())
    except ApiError as exc:
        status, body = from_api_error(exc)
        return _json(status, body)


@router.post("/batches", include_in_schema=False)
def create_batch() -> Response[dict]:
    """Create a batch from an uploaded ``purpose=batch`` file."""
    return openai_errors(_create)


def _create() -> dict[str, Any]:
    try:
        body = json.loads(router.current_event.body or "")
    except (ValueError, RecursionError):  # RecursionError: nested deeper than the decoder
        raise InvalidJson("the request body is not valid JSON") from None
    return service().create(_tenant(), parse_request(body))


@router.get("/batches", include_in_schema=False)
def list_batches() -> Response[dict]:
    """The caller's batches, newest first."""
    return openai_errors(_list)


def _list() -> dict[str, Any]:
    params = router.current_event.query_string_parameters or {}
    raw = params.get("limit")
    try:
        limit = LIST_DEFAULT if raw in (None, "") else int(str(raw))
    except ValueError:
        limit = 0
    if not 1 <= limit <= LIST_MAX:
        raise InvalidRequest(
            f"limit must be an integer from 1 to {LIST_MAX}",
            [{"field": "limit", "message": f"1..{LIST_MAX}"}],
        )
    after = params.get("after") or None
    return service().list(_tenant(), limit=limit, after=after)


@router.get("/batches/<batch_id>", include_in_schema=False)
def get_batch(batch_id: str) -> Response[dict]:
    """One batch, ``request_counts`` as they stand now."""
    return openai_errors(lambda: service().get(_tenant(), batch_id))


@router.post("/batches/<batch_id>/cancel", include_in_schema=False)
def cancel_batch(batch_id: str) -> Response[dict]:
    """Cancel a batch (idempotent)."""
    return openai_errors(lambda: service().cancel(_tenant(), batch_id))
