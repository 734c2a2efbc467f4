"""Per-tenant webhook signing secrets, with rotation.

Stored in the job table as one item per tenant, ``job_id = "whsec#<tenant>"``, with no ``tenant``
attribute so that it stays out of the tenant index (like the idempotency items). Attributes:
``secret`` (S, the current ``whsec_`` secret), ``created_at``, and after a rotation
``previous_secret`` and ``previous_expires_at`` (RFC 3339).

A tenant's secret is made on first use (``GET /v1/webhooks/secret`` or its first delivery) with a
conditional put, so concurrent first uses agree. Rotation makes a new current secret; the old one
stays valid for :data:`ROTATION_GRACE_SECONDS`, and deliveries meanwhile carry a signature with
each (``webhook-signature: v1,<new> v1,<old>``), so a receiver may switch at any time in between.
"""

from __future__ import annotations

import base64
import secrets as _secrets
from datetime import timedelta
from typing import Any

from botocore.exceptions import ClientError
from pydantic import BaseModel

from asyncinfer import clients
from asyncinfer.settings import Settings
from asyncinfer.timeutil import iso, now, parse

SECRET_PREFIX = "whsec_"
#: Random bytes in a new secret (Standard Webhooks: 24..64).
SECRET_BYTES = 32
#: How long the previous secret stays valid after a rotation, seconds.
ROTATION_GRACE_SECONDS = 24 * 3600

_PREFIX = "whsec#"


def new_secret() -> str:
    """A fresh ``whsec_<base64 of 32 random bytes>`` secret, as ``standardwebhooks`` takes it."""
    return SECRET_PREFIX + base64.b64encode(_secrets.token_bytes(SECRET_BYTES)).decode()


class WebhookSecretView(BaseModel):
    """``GET /v1/webhooks/secret``: the tenant's signing secret and, after a rotation, the previous
    one while it is still valid."""

    secret: str
    created_at: str
    previous_secret: str | None = None
    previous_expires_at: str | None = None


class SecretStore:
    """Reads, creates and rotates tenants' webhook secrets."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.table = settings.table_name
        self.ddb = clients.client("dynamodb", settings)

    def _key(self, tenant: str) -> dict[str, Any]:
        return {"job_id": {"S": _PREFIX + tenant}}

    def _read(self, tenant: str) -> dict[str, Any] | None:
        item = self.ddb.get_item(TableName=self.table, Key=self._key(tenant), ConsistentRead=True)
        return item.get("Item")

    @staticmethod
    def _view(item: dict[str, Any]) -> WebhookSecretView:
        prev = item.get("previous_secret", {}).get("S")
        prev_until = item.get("previous_expires_at", {}).get("S")
        if prev and (not prev_until or parse(prev_until) <= now()):
            prev = prev_until = None
        return WebhookSecretView(
            secret=item["secret"]["S"],
            created_at=item["created_at"]["S"],
            previous_secret=prev,
            previous_expires_at=prev_until,
        )

    def get(self, tenant: str) -> WebhookSecretView:
        """The tenant's secret, made now if it has none."""
        item = self._read(tenant)
        if item is not None:
            return self._view(item)
        item = {
            **self._key(tenant),
            "secret": {"S": new_secret()},
            "created_at": {"S": iso(now())},
        }
        try:
            self.ddb.put_item(
                TableName=self.table, Item=item, ConditionExpression="attribute_not_exists(job_id)"
            )
        except ClientError as exc:
            if exc.response["Error"]["Code"] != "ConditionalCheckFailedException":
                raise
            item = self._read(tenant) or item  # another request made it first: use that one
        return self._view(item)

    def signing_secrets(self, tenant: str) -> list[str]:
        """The secrets a delivery is signed with now: the current one first, then the previous one
        while it is valid."""
        view = self.get(tenant)
        return [view.secret] + ([view.previous_secret] if view.previous_secret else [])

    def rotate(self, tenant: str) -> WebhookSecretView:
        """Make a new current secret; the old one stays valid for ``ROTATION_GRACE_SECONDS``.
        Conditional on the secret being rotated, so two concurrent rotations do not both win."""
        for _ in range(5):
            current = self.get(tenant)
            t = now()
            try:
                resp = self.ddb.update_item(
                    TableName=self.table,
                    Key=self._key(tenant),
                    UpdateExpression="SET #s = :new, #c = :t, #p = :old, #u = :until",
                    ConditionExpression="#s = :old",
                    ExpressionAttributeNames={
                        "#s": "secret",
                        "#c": "created_at",
                        "#p": "previous_secret",
                        "#u": "previous_expires_at",
                    },
                    ExpressionAttributeValues={
                        ":new": {"S": new_secret()},
                        ":old": {"S": current.secret},
                        ":t": {"S": iso(t)},
                        ":until": {"S": iso(t + timedelta(seconds=ROTATION_GRACE_SECONDS))},
                    },
                    ReturnValues="ALL_NEW",
                )
            except ClientError as exc:
                if exc.response["Error"]["Code"] != "ConditionalCheckFailedException":
                    raise
                continue
            return self._view(resp["Attributes"])
        raise RuntimeError("the webhook secret kept changing during rotation")
