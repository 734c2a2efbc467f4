"""boto3 clients built from the settings (endpoint URL of the local emulator, region), one per
service and thread-safe, created on first use.

All clients come from one boto3 session, so botocore reads its endpoint rules and the list of
services, and registers its event handlers, once per process rather than once per client (~50 ms
a client on two cores; a worker builds four at start). A session is not thread-safe, so clients
are created under a lock; the clients themselves are, and each has its own copy of the session's
event hooks."""

from __future__ import annotations

import threading
from typing import Any

import boto3
from botocore.config import Config

from asyncinfer.core.settings import get_settings
from asyncinfer.core.settings_needs import AwsConfig

_lock = threading.Lock()
_cache: dict[tuple[str, str | None, str], Any] = {}
_session: Any = None

_CONFIG = Config(
    retries={"max_attempts": 5, "mode": "standard"},
    connect_timeout=5,
    read_timeout=30,
    max_pool_connections=32,
)


def client(service: str, settings: AwsConfig | None = None) -> Any:
    """A cached boto3 client for ``service`` ("sqs", "dynamodb", "s3", "sns", ...), for the
    endpoint and region of ``settings`` (the whole settings or a component's part; default
    :func:`get_settings`)."""
    global _session
    s = settings or get_settings()
    key = (service, s.endpoint_url, s.region)
    with _lock:
        if key not in _cache:
            if _session is None:
                _session = boto3.session.Session()
            _cache[key] = _session.client(
                service, region_name=s.region, endpoint_url=s.endpoint_url, config=_CONFIG
            )
        return _cache[key]


def reset() -> None:
    """Forget every cached client and the session (tests that change endpoints or
    credentials)."""
    global _session
    with _lock:
        _cache.clear()
        _session = None
