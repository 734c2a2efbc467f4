"""What the shared layers read of the settings: one protocol per need.

The job layer (:mod:`asyncinfer.jobs`), the AWS adapters (:mod:`asyncinfer.aws`) and the webhook
secret store serve several components, so they are typed with what they read rather than with one
component's part: :class:`~asyncinfer.core.settings.Settings` and every part of
:mod:`asyncinfer.core.settings_parts` that carries those fields satisfy these protocols (mypy
checks each component's part against the collaborators it builds). Members are read-only
properties: a part is frozen, and ``lease_interval`` is a property of ``Settings``.
"""

from __future__ import annotations

from typing import Protocol


class AwsConfig(Protocol):
    """Where boto3 clients connect (:func:`asyncinfer.aws.clients.client`)."""

    @property
    def endpoint_url(self) -> str | None:
        """The AWS endpoint (the local stack's emulator); ``None`` in AWS."""

    @property
    def region(self) -> str:
        """The AWS region."""


class TableConfig(AwsConfig, Protocol):
    """The job table (batch records and webhook secrets live in it too)."""

    @property
    def table_name(self) -> str:
        """The DynamoDB table of job records."""


class StoreConfig(TableConfig, Protocol):
    """What :class:`asyncinfer.jobs.store.JobStore` reads."""

    @property
    def lease_interval(self) -> int:
        """Seconds a running job's lease lasts from its start or last renewal."""

    @property
    def visibility_timeout_seconds(self) -> int:
        """The job queues' visibility timeout, seconds (a hand-back's requeue deadline)."""


class PayloadConfig(AwsConfig, Protocol):
    """What :class:`asyncinfer.aws.payloads.PayloadStore` reads."""

    @property
    def bucket(self) -> str:
        """The S3 bucket of inputs and outputs."""

    @property
    def max_input_bytes(self) -> int:
        """Largest input a job may have, bytes."""


class EventsConfig(StoreConfig, PayloadConfig, Protocol):
    """What :class:`asyncinfer.jobs.events.EventPublisher` reads (it builds a store and a payload
    store of its own when not given them)."""

    @property
    def topic_arn(self) -> str:
        """The SNS topic of job events."""


class TakeoverConfig(Protocol):
    """What a lease takeover reads (:func:`asyncinfer.jobs.leases.take_back`)."""

    @property
    def max_receive_count(self) -> int:
        """SQS maxReceiveCount: the attempts a job gets."""


class InputsConfig(Protocol):
    """What the input checks read (:mod:`asyncinfer.jobs.inputs`)."""

    @property
    def bucket(self) -> str:
        """The S3 bucket of uploads."""

    @property
    def max_input_bytes(self) -> int:
        """Largest input a job may have, bytes."""

    @property
    def input_locations(self) -> list[str]:
        """``bucket`` or ``bucket/prefix`` entries ``input_url`` may name besides uploads."""


class SecretsConfig(TableConfig, Protocol):
    """What :class:`asyncinfer.webhooks.secrets.SecretStore` reads."""

    @property
    def webhook_secrets_key(self) -> str:
        """The KMS key (id, ARN or alias) of tenants' webhook signing secrets."""
