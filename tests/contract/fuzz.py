"""Running schemathesis (pinned in the ``dev`` extra) against a running API, as ``st run`` does:
every ``/v1`` operation of ``GET /v1/openapi.json``, every check, all four phases (examples,
coverage, fuzzing, stateful with the document's links), a bounded number of examples and a
fixed seed. :func:`fuzz` returns the failures as text, one entry per failed check.

A few rules depend on state or the network and no JSON Schema can state them; the document
describes them in words and the hooks here keep generated requests within them, as a careful
client would:

* ``input_url`` must be one of the caller's own uploads: schema-valid requests use a real one.
* a list ``cursor`` is issued by the API: schema-valid requests use a real one.
* ``metadata``'s 2 KB total: schema-valid bodies over it are trimmed to fit.
* webhook URLs must not reach the network (the project's rule: tests talk to 127.0.0.1 only,
  and the service resolves and then delivers to what a job names): schema-valid requests name
  a closed loopback port; any other generated request that names a host outside 127.0.0.1 is
  dropped before it is sent.

And two of schemathesis's probes meet API Gateway, not this API (the CDK app's resource methods
are ``GET /v1/health`` and ``ANY /v1/{proxy+}``; anything else is its
``MISSING_AUTHENTICATION_TOKEN`` response, 404 in this app): TRACE and QUERY, which no REST API
method can have, are not probed, and ``unsupported_method`` is off for ``/v1/health`` (its other
methods are that 404 in AWS too; making them 405 is a change to ``infra/components/api.py``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import httpx
import schemathesis
from schemathesis.engine import events, from_schema

#: Hosts a generated webhook URL may name: 127.0.0.1 only, no user info, no odd characters.
LOOPBACK_URL = re.compile(r"^https?://127\.0\.0\.1(:[0-9]{1,5})?(/[A-Za-z0-9._~/-]*)?$")
METADATA_MAX_BYTES = 2048


@dataclass
class Fixtures:
    """Real server-issued values for the rules JSON Schema cannot state."""

    input_url: str
    cursor: str
    webhook_url: str


def prepare(api: str, key: str, webhook_port: int) -> Fixtures:
    """Make an upload with content and a page cursor through the API itself."""
    with httpx.Client(base_url=api, headers={"x-api-key": key}, timeout=60) as c:
        up = c.post("/v1/uploads")
        assert up.status_code == 201, up.text
        put = httpx.put(up.json()["upload_url"], content=b'{"n": 1}', timeout=60)
        assert put.status_code == 200, put.text
        for i in range(2):
            assert c.post("/v1/jobs", json={"model": "echo", "input": {"i": i}}).status_code == 202
        page = c.get("/v1/jobs", params={"limit": 1}).json()
        assert page["next_cursor"], page
    return Fixtures(
        up.json()["input_url"], page["next_cursor"], f"http://127.0.0.1:{webhook_port}/"
    )


def _metadata_bytes(meta: dict[str, Any]) -> int:
    return sum(len(str(k).encode()) + len(str(v).encode()) for k, v in meta.items())


def _positive(case: schemathesis.Case) -> bool:
    return case.meta is not None and case.meta.generation.mode.is_positive


def _off_loopback(body: Any) -> bool:
    """Whether a body names a webhook URL outside 127.0.0.1 (which the service would resolve
    and deliver to)."""
    hook = body.get("webhook") if isinstance(body, dict) else None
    url = hook.get("url") if isinstance(hook, dict) else None
    return isinstance(url, str) and not LOOPBACK_URL.match(url)


def install_hooks(schema: Any, fx: Fixtures) -> None:
    """Schema-scoped hooks (see the module docstring)."""

    @schema.hook
    def map_case(ctx: schemathesis.HookContext, case: schemathesis.Case) -> schemathesis.Case:
        if not _positive(case):
            return case
        body = case.body
        if isinstance(body, dict):
            if isinstance(body.get("input_url"), str):
                body["input_url"] = fx.input_url
            meta = body.get("metadata")
            if isinstance(meta, dict):
                while meta and _metadata_bytes(meta) > METADATA_MAX_BYTES:
                    meta.pop(next(iter(meta)))
            if _off_loopback(body):
                body["webhook"]["url"] = fx.webhook_url
        if isinstance(case.query, dict) and isinstance(case.query.get("cursor"), str):
            case.query["cursor"] = fx.cursor
        return case

    @schema.hook
    def filter_case(ctx: schemathesis.HookContext, case: schemathesis.Case) -> bool:
        return not _off_loopback(case.body)


def config(api: str, key: str, *, seed: int, max_examples: int) -> schemathesis.Config:
    """The run's configuration (schemathesis.toml keys)."""
    return schemathesis.Config.from_dict(
        {
            "base-url": api,
            "headers": {"x-api-key": key},
            "seed": seed,
            "continue-on-failure": True,
            "request-timeout": 60,
            "generation": {"max-examples": max_examples, "mode": "all"},
            "checks": {"enabled": True},
            "phases": {
                "coverage": {
                    "unexpected-methods": ["get", "put", "post", "delete", "patch", "options"]
                },
                "stateful": {"max-steps": 20},
            },
            "operations": [
                {"include-path": "/v1/health", "checks": {"unsupported_method": {"enabled": False}}}
            ],
        }
    )


def _describe(label: str, checks: Iterable[Any]) -> list[str]:
    out = []
    for check in checks:
        info = check.failure_info
        if info is None:
            continue
        failure = info.failure
        out.append(f"{label}: {check.name}: {failure.title}\n{failure.message}\n{info.code_sample}")
    return out


def fuzz(api: str, key: str, fx: Fixtures, *, seed: int, max_examples: int) -> list[str]:
    """Run every phase on every ``/v1`` operation; the failures and errors found, as text."""
    cfg = config(api, key, seed=seed, max_examples=max_examples)
    schema = schemathesis.openapi.from_url(
        f"{api}/v1/openapi.json", config=cfg, headers={"x-api-key": key}, timeout=60
    )
    install_hooks(schema, fx)
    problems: list[str] = []
    operations: set[str] = set()
    for event in from_schema(schema).execute():
        if isinstance(event, events.ScenarioFinished):
            operations.add(event.recorder.label)
            for checks in event.recorder.checks.values():
                problems.extend(_describe(event.recorder.label, checks))
        elif isinstance(event, events.NonFatalError):
            problems.append(f"{event.label}: error: {event.info.format()}")
        elif isinstance(event, events.FatalError):
            problems.append(f"fatal: {event.exception!r}")
        elif isinstance(event, events.EngineFinished):
            for failure in event.failures:
                problems.append(f"after run: {failure.title}\n{failure.message}")
    raw = httpx.get(f"{api}/v1/openapi.json", headers={"x-api-key": key}, timeout=60).json()
    expected = {f"{m.upper()} {p}" for p, item in raw["paths"].items() for m in item}
    missing = expected - operations
    if missing:
        problems.append(f"operations never tested: {sorted(missing)}")
    return sorted(set(problems))


if __name__ == "__main__":  # a run against a stack started by hand
    import sys

    from asyncinfer.local.stack import free_port

    api_url, api_key = sys.argv[1], sys.argv[2]
    found = fuzz(api_url, api_key, prepare(api_url, api_key, free_port()), seed=1, max_examples=20)
    print(json.dumps(found, indent=1))
    print(len(found), "problems")
