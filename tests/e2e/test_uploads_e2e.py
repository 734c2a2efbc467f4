"""End to end: a large input uploaded to the local stack the way a user would (``curl -X PUT
--data-binary``, which sends ``application/x-www-form-urlencoded``; or the capped POST form)
round-trips byte for byte, and its job succeeds with the input as the output."""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.e2e.conftest import LocalStackProcess, local_stack

pytestmark = pytest.mark.e2e

#: An input a form parser would mangle: '=', '&', '+', '%' and non-ASCII text.
INPUT = {"texts": ["a=b&c=d", "key=x+y", "100% ok"], "blob": "é" * 40_000, "n": 3}


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalStackProcess]:
    with local_stack(tmp_path_factory.mktemp("state"), "--models", "echo") as s:
        yield s


def submit_and_wait(stack: LocalStackProcess, input_url: str) -> dict:
    with stack.client() as c:
        resp = c.post("/v1/jobs", json={"model": "echo", "input_url": input_url})
        assert resp.status_code == 202, resp.text
        job_id = resp.json()["id"]
    job = stack.wait_status(job_id, {"succeeded", "failed"})
    assert job["status"] == "succeeded", job
    if job["output"] is None:  # above 64 KB: a presigned GET
        return dict(httpx.get(job["output_url"], timeout=60).json())
    return dict(job["output"])


@pytest.mark.skipif(shutil.which("curl") is None, reason="needs curl")
def test_curl_put_upload_round_trips(stack: LocalStackProcess, tmp_path: Path) -> None:
    body = json.dumps(INPUT).encode()
    path = tmp_path / "input.json"
    path.write_bytes(body)
    with stack.client() as c:
        up = c.post("/v1/uploads").json()
    out = subprocess.run(
        ["curl", "-sS", "-f", "-X", "PUT", "--data-binary", f"@{path}", up["upload_url"]],
        capture_output=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    output = submit_and_wait(stack, up["input_url"])
    assert {k: output[k] for k in INPUT} == INPUT


def test_form_upload_round_trips(stack: LocalStackProcess) -> None:
    body = json.dumps(INPUT).encode()
    with stack.client() as c:
        up = c.post("/v1/uploads").json()
    assert up["max_bytes"] > len(body)
    form = up["upload_form"]
    resp = httpx.post(form["url"], data=form["fields"], files={"file": body}, timeout=60)
    assert resp.status_code in (200, 201, 204), resp.text
    output = submit_and_wait(stack, up["input_url"])
    assert {k: output[k] for k in INPUT} == INPUT
