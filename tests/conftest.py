"""Shared fixtures: fake AWS credentials, a clean settings/client cache per test, and helpers that
call the API handler with real API Gateway proxy events."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from typing import Any

import pytest

# The network guard (tests/netguard/sitecustomize.py): this process, and every Python process the
# tests start (the local stack, its emulator, fork server and workers inherit PYTHONPATH), may
# reach loopback addresses only; a name other than localhost is never sent to a DNS resolver.
_NETGUARD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "netguard")
os.environ["PYTHONPATH"] = os.pathsep.join(
    p for p in (_NETGUARD, os.environ.get("PYTHONPATH", "")) if p
)
from tests.netguard import sitecustomize as _netguard  # noqa: E402

_netguard.install()

os.environ.setdefault("AWS_ACCESS_KEY_ID", "testing")
os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "testing")
os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
os.environ.setdefault("AWS_REGION", "us-east-1")
os.environ.setdefault("POWERTOOLS_TRACE_DISABLED", "true")
os.environ.setdefault("POWERTOOLS_METRICS_DISABLED", "true")
os.environ.setdefault("POWERTOOLS_LOG_LEVEL", "WARNING")
os.environ.setdefault("HF_HUB_OFFLINE", "1")


def reset_caches() -> None:
    """Forget cached settings, clients and services (each test sets its own environment)."""
    from asyncinfer.aws import clients
    from asyncinfer.core.settings import get_settings
    from asyncinfer.functions.api import app as api_app
    from asyncinfer.functions.dlq import _handler
    from asyncinfer.openai_api import expansion, routes_batches

    get_settings.cache_clear()
    api_app.service.cache_clear()
    routes_batches.service.cache_clear()
    expansion._expander.cache_clear()
    _handler.cache_clear()
    clients.reset()


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[pytest.MonkeyPatch]:
    """Remove asyncinfer and endpoint variables from the environment for the test."""
    for k in list(os.environ):
        if k.startswith("ASYNCINFER_") or k == "AWS_ENDPOINT_URL":
            monkeypatch.delenv(k)
    reset_caches()
    yield monkeypatch
    reset_caches()


def apply_env(monkeypatch: pytest.MonkeyPatch, env: dict[str, str]) -> None:
    """Set ``env`` for the test and drop caches built from the old environment."""
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    reset_caches()


class ApiCaller:
    """Calls the API Lambda handler in-process with proxy events built like the local gateway's."""

    def __init__(self, key_id: str = "tenant-a") -> None:
        self.key_id = key_id

    def __call__(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        raw: bytes | None = None,
        headers: dict[str, str] | None = None,
        key_id: str | None = "",
    ) -> tuple[int, Any, dict[str, str]]:
        from asyncinfer.functions.api.app import handler
        from asyncinfer.local.gateway import build_event
        from asyncinfer.local.lambda_runtime import LocalContext

        data = raw if raw is not None else (json.dumps(body).encode() if body is not None else b"")
        hdrs = [("content-type", "application/json"), *(headers or {}).items()]
        kid = self.key_id if key_id == "" else key_id
        event = build_event(
            method,
            path,
            hdrs,
            data,
            api_key="k" if kid else None,
            api_key_id=kid,
            source_ip="127.0.0.1",
        )
        resp = handler(event, LocalContext())
        out_headers = {k.lower(): v for k, v in (resp.get("headers") or {}).items()}
        for k, vs in (resp.get("multiValueHeaders") or {}).items():
            out_headers[k.lower()] = ", ".join(vs)
        text = resp.get("body") or ""
        try:
            parsed = json.loads(text) if text else None
        except ValueError:
            parsed = text
        return resp["statusCode"], parsed, out_headers


def drain_events(sqs: Any, queue_url: str) -> list[dict[str, Any]]:
    """Every job event waiting in an SQS queue subscribed to the topic with raw delivery (the
    stack's event-log queue), in arrival order, deleting them."""
    out: list[dict[str, Any]] = []
    while True:
        msgs = sqs.receive_message(
            QueueUrl=queue_url, MaxNumberOfMessages=10, WaitTimeSeconds=0
        ).get("Messages", [])
        if not msgs:
            return out
        for m in msgs:
            out.append(json.loads(m["Body"]))
            sqs.delete_message(QueueUrl=queue_url, ReceiptHandle=m["ReceiptHandle"])
