"""Checks of a proxy event before routing: the body is strict JSON of at most
:data:`MAX_BODY_BYTES` (400 ``invalid_json`` / 413 ``payload_too_large``), and the content type is
taken as JSON. Moved out of :mod:`asyncinfer.functions.api.app` unchanged."""

from __future__ import annotations

import base64
import json
from typing import Any

from asyncinfer.core.errors import ApiError, InvalidJson, InvalidRequest, PayloadTooLarge

#: Largest request body the handler takes, bytes. A Lambda proxy request is capped at 6 MB;
#: larger inputs go through POST /v1/uploads.
MAX_BODY_BYTES = 6 * 1024 * 1024


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def is_text(value: Any) -> bool:
    """Whether every string of the JSON ``value`` is Unicode text (encodable as UTF-8: no lone
    UTF-16 surrogate escape such as ``"\\ud800"``, which ``json.loads`` accepts).

    Raises:
        RecursionError: ``value`` is nested too deeply to encode.
    """
    try:
        json.dumps(value, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def body_error(event: dict[str, Any]) -> ApiError | None:
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
        if not is_text(parsed):
            return InvalidJson("the request body has an unpaired UTF-16 surrogate escape (\\uD800)")
    except RecursionError:
        return InvalidJson("the request body is nested too deeply")
    return None


def normalise(event: dict[str, Any]) -> dict[str, Any]:
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


def request_error(errors: list[Any]) -> ApiError:
    """The error of a request that failed the routes' pydantic validation (Powertools'
    ``RequestValidationError.errors()``): 400 ``invalid_json`` for a body that is not JSON, else
    422 ``invalid_request`` with one detail per error, ``{"field", "message", "type"}``, the
    field dotted without its ``body``/``query``/``path``/``header`` prefix and a header named as
    the spec writes it (``Idempotency-Key``). Used by both surfaces (``/v1``, ``/openai/v1``)."""
    if any(e.get("type") == "json_invalid" for e in errors):
        return InvalidJson("the request body is not valid JSON")
    details = []
    for err in errors:
        loc = [str(p) for p in err.get("loc", ())]
        if loc and loc[0] == "header" and len(loc) > 1:
            loc = ["-".join(w.capitalize() for w in loc[1].split("-")), *loc[2:]]
        elif loc and loc[0] in ("body", "query", "path", "header"):
            loc = loc[1:]
        details.append(
            {
                "field": ".".join(loc) or "body",
                "message": err.get("msg", ""),
                "type": err.get("type"),
            }
        )
    fields = ", ".join(d["field"] for d in details)
    return InvalidRequest(f"invalid request: {fields}", details)
