"""``asyncinfer batch --server`` (client/server_batch.py): upload, create, wait on
``request_counts``, download the output and error files. The HTTP calls reach the API handler
in process (moto); the Files routes are stood in for by the tenant's file store, and each poll
runs the expander, a worker's ends of the line jobs and the counter."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from asyncinfer.aws import clients
from asyncinfer.client.server_batch import ServerBatches
from asyncinfer.core.settings import Settings
from asyncinfer.openai_api.files import FileStore
from tests.conftest import ApiCaller
from tests.unit.batch_helpers import (
    chat_line,
    echo_ok,
    finish,
    line_jobs,
    run_batch_queue,
    run_events,
)

TENANT = "tenant-a"


def transport(settings: Settings) -> httpx.MockTransport:
    api = ApiCaller(TENANT)
    files = FileStore(clients.client("s3", settings), settings.bucket)

    def handle(request: httpx.Request) -> httpx.Response:
        path = request.url.path
        assert request.headers["x-api-key"] == "KEY"
        if path == "/openai/v1/files" and request.method == "POST":
            boundary = request.headers["content-type"].split("boundary=")[1].encode()
            parts = request.read().split(b"--" + boundary)
            (part,) = [p for p in parts if b'name="file"' in p]
            data = part.split(b"\r\n\r\n", 1)[1].removesuffix(b"\r\n")
            return httpx.Response(
                200, json=files.create(TENANT, data, filename="in.jsonl", purpose="batch")
            )
        if path.startswith("/openai/v1/files/") and path.endswith("/content"):
            return httpx.Response(200, content=files.read(TENANT, path.split("/")[-2]))
        if request.method == "GET" and path.startswith("/openai/v1/batches/"):
            run_batch_queue(settings)
            for rec in line_jobs(settings, TENANT):
                finish(settings, rec, outcome)
            run_events(settings)
        raw = request.read() or None
        status, out, _ = api(
            request.method,
            path + (f"?{request.url.query.decode()}" if request.url.query else ""),
            raw=raw,
        )
        return httpx.Response(status, json=out)

    return httpx.MockTransport(handle)


def outcome(rec: dict[str, Any]) -> tuple[str, Any]:
    if json.loads(rec["metadata"])["custom_id"] == "bad":
        return "failed", {"code": "model_error", "message": "boom"}
    return echo_ok(rec)


def test_server_mode_uploads_runs_and_downloads(
    settings: Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    src = tmp_path / "in.jsonl"
    src.write_text("\n".join(json.dumps(chat_line(c)) for c in ("a", "b", "bad")) + "\n")
    runner = ServerBatches(
        "http://api.test", "KEY", http=httpx.Client(transport=transport(settings))
    )
    result = runner.run(src, tmp_path / "out.jsonl", progress=False, poll=0)
    assert result.batch["status"] == "completed"
    assert result.batch["request_counts"] == {"total": 3, "completed": 2, "failed": 1}
    assert result.output is not None and result.errors is not None
    outs = [json.loads(x) for x in result.output.read_text().splitlines()]
    assert sorted(o["custom_id"] for o in outs) == ["a", "b"]
    errs = [json.loads(x) for x in result.errors.read_text().splitlines()]
    assert [e["custom_id"] for e in errs] == ["bad"]
    assert result.errors.name == "out.jsonl.errors.jsonl"
    assert not result.ok
