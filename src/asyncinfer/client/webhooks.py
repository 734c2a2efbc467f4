"""Verifying webhook requests (Standard Webhooks, with the ``standardwebhooks`` library).

The service signs each delivery with the API key's ``whsec_`` secret
(:meth:`Client.webhook_secret`): headers ``webhook-id``, ``webhook-timestamp`` (unix seconds) and
``webhook-signature`` (``v1,<base64 HMAC-SHA256 of "{id}.{timestamp}.{body}">``, one per valid
secret during a rotation). Verify the raw body bytes, before parsing them.

The checking itself is the service's own receiver helper, :func:`asyncinfer.webhooks.verify`
(which uses ``standardwebhooks``); this module adds the client's types and error class.
"""

from __future__ import annotations

import base64
import hmac
import json
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from typing import Any

from standardwebhooks.webhooks import Webhook
from standardwebhooks.webhooks import WebhookVerificationError as _LibError

from asyncinfer.client.errors import WebhookVerificationError
from asyncinfer.client.models import WebhookEvent, WebhookSecret
from asyncinfer.webhooks.signing import verify as _service_verify

#: Largest difference between ``webhook-timestamp`` and now that verification accepts, seconds
#: (the library's fixed tolerance).
DEFAULT_TOLERANCE_SECONDS = 300

Secrets = str | WebhookSecret | Iterable[str]


def _secrets(secret: Secrets) -> list[str]:
    if isinstance(secret, str):
        return [secret]
    if isinstance(secret, WebhookSecret):
        return secret.valid_secrets
    return list(secret)


def verify_webhook_payload(
    secret: Secrets,
    headers: Mapping[str, str],
    body: bytes | str,
    *,
    check_timestamp: bool = True,
) -> Any:
    """Verify a webhook request and return its parsed JSON body.

    Args:
        secret: the ``whsec_...`` secret; or several (a :class:`WebhookSecret`, or a list: the
            current and the previous one during a rotation), any of which may verify.
        headers: the request's headers (any case).
        body: the raw request body.
        check_timestamp: refuse timestamps more than 300 s from now (replay protection). Turn it
            off only to check a recorded request.

    Raises:
        WebhookVerificationError: a header is missing or malformed, the timestamp is out of
            tolerance, or no ``v1`` signature matches.
    """
    candidates = _secrets(secret)
    if not candidates:
        raise WebhookVerificationError("no secret given")
    hdrs = {k.lower(): v for k, v in headers.items()}
    try:
        if check_timestamp:
            return _service_verify(body, hdrs, candidates)
        data = body.decode("utf-8") if isinstance(body, bytes) else body
        return _verify_without_timestamp(candidates, data, hdrs)
    except WebhookVerificationError:
        raise
    except _LibError as exc:
        raise WebhookVerificationError(str(exc)) from None
    except (ValueError, TypeError) as exc:  # bad base64 secret or signature, bad JSON
        raise WebhookVerificationError(f"malformed webhook: {exc}") from None


def _verify_without_timestamp(secrets: list[str], data: str, headers: dict[str, str]) -> Any:
    msg_id = headers.get("webhook-id")
    ts = headers.get("webhook-timestamp")
    sigs = headers.get("webhook-signature")
    if not (msg_id and ts and sigs):
        raise WebhookVerificationError("Missing required headers")
    try:
        when = datetime.fromtimestamp(float(ts), tz=UTC)
    except (ValueError, OverflowError):
        raise WebhookVerificationError("Invalid Signature Headers") from None
    for secret in secrets:
        signed = Webhook(secret).sign(msg_id=msg_id, timestamp=when, data=data)
        expected = base64.b64decode(signed.split(",")[1])
        for versioned in sigs.split(" "):
            version, _, sig = versioned.partition(",")
            if version == "v1" and hmac.compare_digest(expected, base64.b64decode(sig)):
                return json.loads(data)
    raise WebhookVerificationError("No matching signature found")


def verify_webhook(
    secret: Secrets,
    headers: Mapping[str, str],
    body: bytes | str,
    *,
    check_timestamp: bool = True,
) -> WebhookEvent:
    """Verify a webhook request and return the event (``type``, ``timestamp``, ``data``: the
    job). Same arguments as :func:`verify_webhook_payload`.

    Raises:
        WebhookVerificationError: the request is not authentic, or its body is not an event.
    """
    payload = verify_webhook_payload(secret, headers, body, check_timestamp=check_timestamp)
    try:
        return WebhookEvent.model_validate(payload)
    except ValueError as exc:
        raise WebhookVerificationError(f"verified, but not a job event: {exc}") from None


def sign_webhook(secret: str, msg_id: str, timestamp: int, body: bytes | str) -> dict[str, str]:
    """The Standard Webhooks headers for ``body`` (for tests of receivers). ``timestamp``: unix
    seconds."""
    data = body.decode("utf-8") if isinstance(body, bytes) else body
    sig = Webhook(secret).sign(msg_id, datetime.fromtimestamp(timestamp, tz=UTC), data)
    return {"webhook-id": msg_id, "webhook-timestamp": str(timestamp), "webhook-signature": sig}
