"""The one settings object. Every component reads the environment here and nowhere else.

Environment variables (all optional unless a component needs the resource):

==================================  ===========================================================
``ASYNCINFER_TABLE``                DynamoDB table of job records
``ASYNCINFER_BUCKET``               S3 bucket for large inputs and outputs
``ASYNCINFER_TOPIC_ARN``            SNS topic of job events
``ASYNCINFER_QUEUE_URLS``           JSON object ``{model_id: queue_url}``
``ASYNCINFER_MODELS``               comma list of deployed model ids (default: keys of the above)
``ASYNCINFER_MAX_RECEIVE_COUNT``    SQS maxReceiveCount of every queue's redrive policy (3)
``ASYNCINFER_VISIBILITY_TIMEOUT``   visibility timeout, seconds, the worker keeps extending (120)
``ASYNCINFER_HEARTBEAT_SECONDS``    heartbeat interval, seconds (default visibility timeout / 3)
``ASYNCINFER_RECEIVE_WAIT``         ReceiveMessage WaitTimeSeconds, 0..20 (20)
``ASYNCINFER_DRAIN_SECONDS``        after SIGTERM, how long running jobs may go on (10)
``ASYNCINFER_RETRY_DELAY``          base delay, seconds, before a retryable failure is retried (2)
``ASYNCINFER_INLINE_INPUT_BYTES``   inputs larger than this travel through S3 (65536)
``ASYNCINFER_RECORD_RETENTION``     seconds a job record lives after creation (TTL; 30 days)
``ASYNCINFER_MODEL_CACHE``          where converted checkpoints are cached (~/.cache/asyncinfer)
``ASYNCINFER_LOCAL``                ``1`` on the local stack: webhooks may use http and loopback
``AWS_ENDPOINT_URL``                AWS endpoint (the local stack's emulator); unset in AWS
``AWS_REGION``                      region (us-east-1)
==================================  ===========================================================
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from functools import lru_cache
from pathlib import Path

from pydantic import BaseModel, Field

from asyncinfer.errors import ConfigError

#: The inline limit of outputs in the job object, bytes of JSON (spec: "at most 64 KB").
INLINE_OUTPUT_LIMIT_BYTES = 64 * 1024


class Settings(BaseModel):
    """Runtime settings. Build with :meth:`from_env`; tests may build one directly."""

    table_name: str = ""
    bucket: str = ""
    topic_arn: str = ""
    queue_urls: dict[str, str] = Field(default_factory=dict)
    models: list[str] = Field(default_factory=list)
    max_receive_count: int = 3
    visibility_timeout_seconds: int = 120
    heartbeat_seconds: float = 0.0
    receive_wait_seconds: int = 20
    receive_max_messages: int = 10
    drain_seconds: float = 10.0
    retry_delay_seconds: float = 2.0
    inline_input_limit_bytes: int = 64 * 1024
    record_retention_seconds: int = 30 * 24 * 3600
    model_cache_dir: Path = Field(default_factory=lambda: Path.home() / ".cache" / "asyncinfer")
    local_mode: bool = False
    endpoint_url: str | None = None
    region: str = "us-east-1"

    @property
    def heartbeat_interval(self) -> float:
        """Seconds between visibility extensions: the set value, else a third of the timeout."""
        return self.heartbeat_seconds or self.visibility_timeout_seconds / 3

    def queue_url(self, model: str) -> str:
        """The SQS queue URL of ``model``; :class:`ConfigError` if it has none."""
        try:
            return self.queue_urls[model]
        except KeyError:
            raise ConfigError(f"no queue configured for model {model!r}") from None

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        """Read settings from ``env`` (default ``os.environ``). Raises :class:`ConfigError`
        listing every malformed variable at once."""
        env = os.environ if env is None else env
        values: dict[str, object] = {}
        problems: list[str] = []

        def take(var: str, field: str, conv: type = str) -> None:
            raw = env.get(var)
            if raw is None or raw == "":
                return
            try:
                values[field] = conv(raw)
            except (TypeError, ValueError):
                problems.append(f"{var}={raw!r} is not a valid {conv.__name__}")

        take("ASYNCINFER_TABLE", "table_name")
        take("ASYNCINFER_BUCKET", "bucket")
        take("ASYNCINFER_TOPIC_ARN", "topic_arn")
        take("ASYNCINFER_MAX_RECEIVE_COUNT", "max_receive_count", int)
        take("ASYNCINFER_VISIBILITY_TIMEOUT", "visibility_timeout_seconds", int)
        take("ASYNCINFER_HEARTBEAT_SECONDS", "heartbeat_seconds", float)
        take("ASYNCINFER_RECEIVE_WAIT", "receive_wait_seconds", int)
        take("ASYNCINFER_DRAIN_SECONDS", "drain_seconds", float)
        take("ASYNCINFER_RETRY_DELAY", "retry_delay_seconds", float)
        take("ASYNCINFER_INLINE_INPUT_BYTES", "inline_input_limit_bytes", int)
        take("ASYNCINFER_RECORD_RETENTION", "record_retention_seconds", int)
        take("ASYNCINFER_MODEL_CACHE", "model_cache_dir", Path)
        take("AWS_ENDPOINT_URL", "endpoint_url")
        region = env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION")
        if region:
            values["region"] = region
        values["local_mode"] = env.get("ASYNCINFER_LOCAL", "") in ("1", "true", "yes")
        raw_queues = env.get("ASYNCINFER_QUEUE_URLS")
        if raw_queues:
            try:
                queues = json.loads(raw_queues)
                if not isinstance(queues, dict):
                    raise ValueError
                values["queue_urls"] = {str(k): str(v) for k, v in queues.items()}
            except ValueError:
                problems.append("ASYNCINFER_QUEUE_URLS is not a JSON object {model: url}")
        raw_models = env.get("ASYNCINFER_MODELS")
        if raw_models:
            values["models"] = [m.strip() for m in raw_models.split(",") if m.strip()]
        else:
            values["models"] = list(values.get("queue_urls", {}) or {})  # type: ignore[call-overload]
        if problems:
            raise ConfigError("; ".join(problems))
        return cls.model_validate(values)


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """The process-wide settings, read once from the environment."""
    return Settings.from_env()
