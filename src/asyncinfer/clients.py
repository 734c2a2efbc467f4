"""boto3 clients built from the settings (endpoint URL of the local emulator, region), one per
service and thread-safe, created on first use."""

from __future__ import annotations

import threading
from typing import Any

import boto3
from botocore.config import Config

from asyncinfer.settings import Settings, get_settings

_lock = threading.Lock()
_cache: dict[tuple[str, str | None, str], Any] = {}

_CONFIG = Config(
    retries={"max_attempts": 5, "mode": "standard"},
    connect_timeout=5,
    read_timeout=30,
    max_pool_connections=32,
)


def client(service: str, settings: Settings | None = None) -> Any:
    """A cached boto3 client for ``service`` ("sqs", "dynamodb", "s3", "sns", ...)."""
    s = settings or get_settings()
    key = (service, s.endpoint_url, s.region)
    with _lock:
        if key not in _cache:
            session: Any = boto3.session.Session()
            _cache[key] = session.client(
                service, region_name=s.region, endpoint_url=s.endpoint_url, config=_CONFIG
            )
        return _cache[key]


def reset() -> None:
    """Forget every cached client (tests that change endpoints)."""
    with _lock:
        _cache.clear()
