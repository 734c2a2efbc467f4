"""Per-tenant webhook signing secrets, with rotation, readable only by the API and the dispatcher.

Stored in the job table as one item per tenant, ``job_id = "whsec#<tenant>"``, with no ``tenant``
attribute so that it stays out of the tenant index (like the idempotency items). The secrets
themselves are never stored in the clear: ``secret_ct`` (B) and, after a rotation,
``previous_secret_ct`` (B) are KMS ciphertexts made with the webhook secrets key
(``ASYNCINFER_WEBHOOK_SECRETS_KEY``) under the encryption context
``{"asyncinfer:purpose": "webhook-secret", "asyncinfer:tenant": <tenant>}``. Every function reads
the job table, but only the API and the webhook dispatcher may decrypt with that key and context
(in AWS: their IAM grants, conditioned on the context; ``infra/components/webhooks.py``); and a
ciphertext copied onto another tenant's item does not decrypt there. Other attributes:
``created_at`` and ``previous_expires_at`` (RFC 3339).

A tenant's secret is made on first use (``GET /v1/webhooks/secret`` or its first delivery) with a
conditional put, so concurrent first uses agree. Rotation makes a new current secret; the old one
stays valid for :data:`ROTATION_GRACE_SECONDS`, and deliveries meanwhile carry a signature with
each (``webhook-signature: v1,<new> v1,<old>``), so a receiver may switch at any time in between.

An item without ``secret_ct`` is treated as no secret: the next use replaces it with a fresh,
encrypted one (whatever else it held, e.g. a secret some table writer put there in the clear,
never signs a delivery).
"""

from __future__ import annotations

import base64
import secrets as _secrets
from collections import OrderedDict
from datetime import timedelta
from threading import Lock
from typing import Any

from botocore.exceptions import ClientError
from pydantic import BaseModel

from asyncinfer.aws import clients
from asyncinfer.core import envvars
from asyncinfer.core.errors import ConfigError
from asyncinfer.core.settings_needs import SecretsConfig
from asyncinfer.core.timeutil import iso, now, parse

SECRET_PREFIX = "whsec_"
#: Random bytes in a new secret (Standard Webhooks: 24..64).
SECRET_BYTES = 32
#: How long the previous secret stays valid after a rotation, seconds.
ROTATION_GRACE_SECONDS = 24 * 3600
#: The encryption context's keys (the IAM grants in the CDK app condition on the first).
PURPOSE_KEY, TENANT_KEY = "asyncinfer:purpose", "asyncinfer:tenant"
PURPOSE = "webhook-secret"
#: Decrypted ciphertexts kept per process (a ciphertext is decrypted once, not per delivery).
_CACHE_SIZE = 1024

_PREFIX = "whsec#"


def new_secret() -> str:
    """A fresh ``whsec_<base64 of 32 random bytes>`` secret, as ``standardwebhooks`` takes it."""
    return SECRET_PREFIX + base64.b64encode(_secrets.token_bytes(SECRET_BYTES)).decode()


def encryption_context(tenant: str) -> dict[str, str]:
    """The KMS encryption context of ``tenant``'s secrets."""
    return {PURPOSE_KEY: PURPOSE, TENANT_KEY: tenant}


class WebhookSecretView(BaseModel):
    """``GET /v1/webhooks/secret``: the tenant's signing secret and, after a rotation, the previous
    one while it is still valid."""

    secret: str
    created_at: str
    previous_secret: str | None = None
    previous_expires_at: str | None = None


class SecretStore:
    """Reads, creates and rotates tenants' webhook secrets.

    Raises:
        ConfigError: (at construction) no webhook secrets key is configured.
    """

    def __init__(self, settings: SecretsConfig) -> None:
        if not settings.webhook_secrets_key:
            raise ConfigError(f"{envvars.WEBHOOK_SECRETS_KEY} is not set")
        self.settings = settings
        self.table = settings.table_name
        self.key_id = settings.webhook_secrets_key
        self.ddb = clients.client("dynamodb", settings)
        self.kms = clients.client("kms", settings)
        self._plain: OrderedDict[tuple[str, bytes], str] = OrderedDict()
        self._lock = Lock()

    def _key(self, tenant: str) -> dict[str, Any]:
        return {"job_id": {"S": _PREFIX + tenant}}

    # ------------------------------------------------------------------ KMS
    def _encrypt(self, tenant: str, secret: str) -> bytes:
        blob: bytes = self.kms.encrypt(
            KeyId=self.key_id,
            Plaintext=secret.encode("ascii"),
            EncryptionContext=encryption_context(tenant),
        )["CiphertextBlob"]
        return blob

    def _decrypt(self, tenant: str, blob: bytes) -> str:
        with self._lock:
            if (tenant, blob) in self._plain:
                self._plain.move_to_end((tenant, blob))
                return self._plain[(tenant, blob)]
        plain: bytes = self.kms.decrypt(
            CiphertextBlob=blob, KeyId=self.key_id, EncryptionContext=encryption_context(tenant)
        )["Plaintext"]
        text = plain.decode("ascii")
        with self._lock:
            self._plain[(tenant, blob)] = text
            while len(self._plain) > _CACHE_SIZE:
                self._plain.popitem(last=False)
        return text

    # ------------------------------------------------------------------ items
    def _read(self, tenant: str) -> dict[str, Any] | None:
        """The tenant's item, or ``None`` where it has no secret (no item, or one without
        ``secret_ct``: see the module docstring)."""
        item = self.ddb.get_item(TableName=self.table, Key=self._key(tenant), ConsistentRead=True)
        found: dict[str, Any] | None = item.get("Item")
        return found if found is not None and "secret_ct" in found else None

    def _view(self, tenant: str, item: dict[str, Any]) -> WebhookSecretView:
        prev_ct = item.get("previous_secret_ct", {}).get("B")
        prev_until = item.get("previous_expires_at", {}).get("S")
        if prev_ct is None or (prev_until and parse(prev_until) <= now()):
            prev_ct = prev_until = None
        return WebhookSecretView(
            secret=self._decrypt(tenant, item["secret_ct"]["B"]),
            created_at=item["created_at"]["S"],
            previous_secret=self._decrypt(tenant, prev_ct) if prev_ct is not None else None,
            previous_expires_at=prev_until,
        )

    def get(self, tenant: str) -> WebhookSecretView:
        """The tenant's secret, made now if it has none."""
        item = self._read(tenant)
        if item is not None:
            return self._view(tenant, item)
        item = {
            **self._key(tenant),
            "secret_ct": {"B": self._encrypt(tenant, new_secret())},
            "created_at": {"S": iso(now())},
        }
        try:
            self.ddb.put_item(
                TableName=self.table,
                Item=item,
                ConditionExpression="attribute_not_exists(secret_ct)",
            )
        except ClientError as exc:
            if exc.response["Error"]["Code"] != "ConditionalCheckFailedException":
                raise
            item = self._read(tenant) or item  # another request made it first: use that one
        return self._view(tenant, item)

    def signing_secrets(self, tenant: str) -> list[str]:
        """The secrets a delivery is signed with now: the current one first, then the previous one
        while it is valid."""
        view = self.get(tenant)
        return [view.secret] + ([view.previous_secret] if view.previous_secret else [])

    def rotate(self, tenant: str) -> WebhookSecretView:
        """Make a new current secret; the old one stays valid for ``ROTATION_GRACE_SECONDS``.
        Conditional on the secret being rotated, so two concurrent rotations do not both win."""
        for _ in range(5):
            self.get(tenant)  # made (and encrypted) if it was not
            item = self._read(tenant)
            assert item is not None
            t = now()
            try:
                resp = self.ddb.update_item(
                    TableName=self.table,
                    Key=self._key(tenant),
                    UpdateExpression="SET #s = :new, #c = :t, #p = :old, #u = :until",
                    ConditionExpression="#s = :old",
                    ExpressionAttributeNames={
                        "#s": "secret_ct",
                        "#c": "created_at",
                        "#p": "previous_secret_ct",
                        "#u": "previous_expires_at",
                    },
                    ExpressionAttributeValues={
                        ":new": {"B": self._encrypt(tenant, new_secret())},
                        ":old": item["secret_ct"],
                        ":t": {"S": iso(t)},
                        ":until": {"S": iso(t + timedelta(seconds=ROTATION_GRACE_SECONDS))},
                    },
                    ReturnValues="ALL_NEW",
                )
            except ClientError as exc:
                if exc.response["Error"]["Code"] != "ConditionalCheckFailedException":
                    raise
                continue
            return self._view(tenant, resp["Attributes"])
        raise RuntimeError("the webhook secret kept changing during rotation")


def create_secrets_key(kms: Any, alias: str) -> str:
    """The ARN of the KMS key behind ``alias`` (``alias/...``), created if there is none, as the
    CDK app makes it (symmetric, for encrypt/decrypt); for the local stack and tests."""
    try:
        arn: str = kms.describe_key(KeyId=alias)["KeyMetadata"]["Arn"]
        return arn
    except ClientError as exc:
        if exc.response["Error"]["Code"] != "NotFoundException":
            raise
    meta = kms.create_key(Description="asyncinfer webhook secrets")["KeyMetadata"]
    kms.create_alias(AliasName=alias, TargetKeyId=meta["KeyId"])
    made: str = meta["Arn"]
    return made
