"""The API's Lambda REQUEST authorizer (AWS only; the local gateway applies the same rule).

Why an authorizer: the ``openai`` SDK sends its key as ``Authorization: Bearer <key>``, and API
Gateway reads API keys only from ``x-api-key`` (``apiKeySource: HEADER``) or from a Lambda
authorizer's ``usageIdentifierKey`` (``apiKeySource: AUTHORIZER``; API Gateway developer guide,
"Choose an API key source", "Output from an API Gateway Lambda authorizer"). The source is one
setting of the whole RestApi: with ``AUTHORIZER``, a key-required method without an authorizer
has no key at all and every call to it is refused 403. So the CDK app puts this authorizer on
both ``ANY /v1/{proxy+}`` and ``ANY /openai/{proxy+}`` (``GET /v1/health`` stays open), and it:

* takes the key from ``x-api-key`` or ``Authorization: Bearer``
  (:func:`asyncinfer.openai_api.auth.api_key`);
* looks it up among the account's enabled API keys (``apigateway:GET /apikeys`` with values,
  cached :data:`KEY_CACHE_SECONDS` in the process), so a wrong key is refused here;
* allows the call with ``usageIdentifierKey`` = the key, so that API Gateway applies the usage
  plan (throttling, quota) and sets ``$context.identity.apiKeyId`` exactly as with
  ``x-api-key``; the key's id is also passed as ``context.apiKeyId`` (the tenant);
* refuses a missing or wrong key on ``/openai/`` with ``Unauthorized`` (API Gateway's 401
  ``UNAUTHORIZED`` response, which the SDK raises as ``AuthenticationError``), and on ``/v1/``
  with a Deny policy (403 ``ACCESS_DENIED``: the ``forbidden`` of api.md).

Results are not cached by API Gateway (TTL 0): a key may come in either header, and a cached
REQUEST authorizer needs every identity source present. This costs one authorizer invocation per
request; the key list itself is cached in the function.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from asyncinfer.aws import clients
from asyncinfer.openai_api.auth import api_key, is_openai_path

#: How long the function keeps the account's key list, seconds (a disabled or deleted key may
#: be taken this long after the change; a new key is looked up again at once, see
#: :data:`MISS_REFRESH_SECONDS`).
KEY_CACHE_SECONDS = 60.0
#: Least time between two reloads caused by an unknown key, seconds (a flood of wrong keys
#: costs at most one ``GetApiKeys`` walk per this interval).
MISS_REFRESH_SECONDS = 5.0


class KeyDirectory:
    """Key value -> key id of the enabled API keys, reloaded when stale.

    Args:
        load: returns the current ``{value: id}`` of enabled keys.
        clock: monotonic seconds.
    """

    def __init__(
        self, load: Callable[[], dict[str, str]], clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._load = load
        self._clock = clock
        self._keys: dict[str, str] = {}
        self._loaded_at: float | None = None
        self._lock = threading.Lock()

    def lookup(self, value: str) -> str | None:
        """The id of the enabled key ``value``, or ``None``."""
        with self._lock:
            now = self._clock()
            stale = self._loaded_at is None or now - self._loaded_at >= KEY_CACHE_SECONDS
            missing = value not in self._keys and (
                self._loaded_at is None or now - self._loaded_at >= MISS_REFRESH_SECONDS
            )
            if stale or missing:
                self._keys = self._load()
                self._loaded_at = now
            return self._keys.get(value)


def load_keys() -> dict[str, str]:
    """``{value: id}`` of the account's enabled API keys in this region (API Gateway
    ``GetApiKeys`` with ``includeValues``, every page)."""
    out: dict[str, str] = {}
    pages = clients.client("apigateway").get_paginator("get_api_keys")
    for page in pages.paginate(includeValues=True):
        for item in page.get("items", []):
            if item.get("enabled") and item.get("value"):
                out[item["value"]] = item["id"]
    return out


_directory = KeyDirectory(load_keys)


def _policy(principal: str, effect: str, resource: str) -> dict[str, Any]:
    return {
        "principalId": principal,
        "policyDocument": {
            "Version": "2012-10-17",
            "Statement": [{"Action": "execute-api:Invoke", "Effect": effect, "Resource": resource}],
        },
    }


def authorize(event: dict[str, Any], directory: KeyDirectory) -> dict[str, Any]:
    """The authorizer's answer to one REQUEST event (API Gateway developer guide, "Output from
    an API Gateway Lambda authorizer").

    Raises:
        Exception: ``"Unauthorized"`` (API Gateway answers 401) for a missing or wrong key on
            ``/openai/``.
    """
    key = api_key(event.get("headers") or {})
    key_id = directory.lookup(key) if key else None
    arn = str(event.get("methodArn") or "*")
    if key is None or key_id is None:
        where = str(event.get("resource") or event.get("path") or "")
        if is_openai_path(where):
            raise Exception("Unauthorized")  # API Gateway's contract: exactly this message
        return _policy("anonymous", "Deny", arn)
    return {
        **_policy(key_id, "Allow", arn),
        "usageIdentifierKey": key,
        "context": {"apiKeyId": key_id},
    }


def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    """The Lambda entry point (REQUEST authorizer)."""
    return authorize(event, _directory)
