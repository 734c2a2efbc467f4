"""Which API key a request carries, one rule for the Lambda authorizer (AWS) and the local
gateway (spec openai.md, "Base path and auth").

A key is sent as ``x-api-key: <key>`` (the ``/v1`` surface's header, api.md) or as
``Authorization: Bearer <key>`` (what the ``openai`` SDK sends). Where both are present,
``x-api-key`` is taken: it is the service's own header, and a proxy in front may set
``Authorization`` for itself. Header names are case-insensitive (RFC 9110 5.1); the ``Bearer``
scheme too (RFC 9110 11.1).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

#: Where the ``/openai/v1`` surface starts (spec openai.md).
OPENAI_PREFIX = "/openai/"


def is_openai_path(path: str) -> bool:
    """Whether ``path`` (the request path, no stage) is on the ``/openai/v1`` surface."""
    return path.startswith(OPENAI_PREFIX)


def api_key(headers: Mapping[str, str] | Iterable[tuple[str, str]] | None) -> str | None:
    """The API key of a request from its headers (a mapping or ``(name, value)`` pairs), or
    ``None`` when it has none. Surrounding whitespace is dropped; an empty key is none."""
    if headers is None:
        return None
    items = headers.items() if isinstance(headers, Mapping) else headers
    x_key: str | None = None
    bearer: str | None = None
    for name, value in items:
        lname = name.lower()
        if lname == "x-api-key" and value and value.strip():
            x_key = value.strip()
        elif lname == "authorization" and value:
            scheme, _, token = value.strip().partition(" ")
            if scheme.lower() == "bearer" and token.strip():
                bearer = token.strip()
    return x_key or bearer
