"""Standard Webhooks signatures (https://www.standardwebhooks.com/), made and checked with the
``standardwebhooks`` library.

Headers of every delivery:

* ``webhook-id``: the event's id, the same for every retry of one event;
* ``webhook-timestamp``: unix seconds of this attempt;
* ``webhook-signature``: ``v1,<base64 HMAC-SHA256 of "{id}.{timestamp}.{body}">``, one per valid
  secret of the tenant separated by spaces (two while a rotated secret is still valid).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from typing import Any

from standardwebhooks import Webhook, WebhookVerificationError

from asyncinfer.webhooks.secrets import new_secret

__all__ = ["WebhookVerificationError", "event_id", "new_secret", "sign_headers", "verify"]


def event_id(job_id: str, event_type: str, attempts: int) -> str:
    """The ``webhook-id`` of one event: derived from what makes the event unique (a job enters a
    status once per attempt), so that every retry, and a duplicate delivery of the same event by
    SNS, carries the same id and receivers can deduplicate on it."""
    digest = hashlib.sha256(f"{job_id}\0{event_type}\0{attempts}".encode()).hexdigest()
    return f"msg_{digest[:32]}"


def sign_headers(
    body: str, msg_id: str, secrets: Iterable[str], timestamp: datetime | None = None
) -> dict[str, str]:
    """The Standard Webhooks headers of ``body`` signed with each of ``secrets``.

    Args:
        body: the exact request body that will be sent (text; it is sent UTF-8 encoded).
        msg_id: the ``webhook-id``.
        secrets: ``whsec_`` secrets; the first is the current one. At least one.
        timestamp: the attempt's time (default now).
    """
    ts = (timestamp or datetime.now(UTC)).replace(microsecond=0)
    sigs = [Webhook(s).sign(msg_id, ts, body) for s in secrets]
    if not sigs:
        raise ValueError("no secret to sign with")
    return {
        "webhook-id": msg_id,
        "webhook-timestamp": str(int(ts.timestamp())),
        "webhook-signature": " ".join(sigs),
    }


def verify(body: bytes | str, headers: Mapping[str, str], secret: str | Iterable[str]) -> Any:
    """For receivers: check a delivery's signature and timestamp (5 minutes tolerance) with the
    ``standardwebhooks`` library and return the parsed event.

    ``secret`` may be several secrets (during a rotation, the new and the previous one): the
    delivery is accepted when any verifies. Raises :class:`WebhookVerificationError` otherwise.
    """
    candidates = [secret] if isinstance(secret, str) else list(secret)
    plain = {k: v for k, v in headers.items()}
    last: Exception = WebhookVerificationError("no secret given")
    for s in candidates:
        try:
            return Webhook(s).verify(body, plain)
        except WebhookVerificationError as exc:
            last = exc
    raise last
