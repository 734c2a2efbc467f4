"""Signed, SSRF-safe webhooks (spec, "Events").

* :mod:`.signing`: Standard Webhooks headers (``webhook-id``, ``webhook-timestamp``,
  ``webhook-signature``) made with the ``standardwebhooks`` library, and :func:`verify` for
  receivers.
* :mod:`.secrets`: one ``whsec_`` secret per tenant, stored as a KMS ciphertext only the API and
  the dispatcher can decrypt, with rotation (the previous secret stays valid for a grace period,
  and deliveries are signed with both meanwhile).
* :mod:`.sender`: one POST: the URL parsed by the submit check's parser, resolved once, forbidden
  addresses refused, connected to that address with the original Host header and TLS server
  name, one 10 s deadline for the whole attempt (:mod:`.deadline`), no redirects, at most 1 KB of
  the answer kept.
* :mod:`.dispatcher`: the Lambda handler fed by the webhook queue (subscribed to the events topic):
  retries with exponential backoff and jitter through message visibility for at least 24 h, then
  the webhook dead-letter queue; 410 stops. The records of a batch are delivered side by side
  within the Lambda's remaining time (:mod:`.batch`).
* :mod:`.queues`: the webhook queue and its DLQ, as the local stack creates them (and the
  dispatcher's timeout, batch size and visibility timeout the CDK app uses too).

Importing this package imports nothing else: the API Lambda uses :mod:`.secrets` alone (no
``standardwebhooks`` or ``httpx`` needed there); ``verify`` and ``sign_headers`` load
:mod:`.signing` on first use.
"""

from __future__ import annotations

from typing import Any

__all__ = ["WebhookVerificationError", "sign_headers", "verify"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from asyncinfer.webhooks import signing

        return getattr(signing, name)
    raise AttributeError(name)
