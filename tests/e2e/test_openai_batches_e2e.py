"""End to end: ``asyncinfer local --models echo,all-minilm-l6-v2`` as a subprocess, driven by the
``openai`` SDK unchanged (``OpenAI(base_url=f"{api}/openai/v1", api_key=KEY)``, the key sent as
``Authorization: Bearer``): input files uploaded with ``client.files.create`` and outputs read
with ``client.files.content``; a chat batch to ``completed`` with every ``custom_id`` answered
and parsed by the SDK's types, a line whose model errors in the error file; an embeddings batch;
a cancel mid-batch; a short window that expires with partial output; another tenant gets 404.
"""

from __future__ import annotations

import io
import json
import time
from collections.abc import Iterator
from typing import Any

import boto3
import openai
import pytest
from openai.types.chat import ChatCompletion

from asyncinfer.openai_api.files import FileStore
from tests.e2e.conftest import LocalStackProcess, local_stack

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalStackProcess]:
    with local_stack(
        tmp_path_factory.mktemp("state"),
        *("--models", "echo,all-minilm-l6-v2", "--extra-key", "other"),
    ) as s:
        yield s


def files(stack: LocalStackProcess) -> FileStore:
    """The stack's file store itself (for checks behind the API; the tests use the SDK)."""
    s3 = boto3.client(
        "s3", endpoint_url=stack.local["aws_endpoint_url"], region_name=stack.local["region"]
    )
    return FileStore(s3, stack.local["bucket"])


def tenant_of(stack: LocalStackProcess, key: str) -> str:
    """The tenant (API key id) of ``key``, from ``local.json``."""
    ids: dict[str, str] = {stack.key: stack.local["api_key_id"]}
    for name, key_id in stack.local.get("extra_key_ids", {}).items():
        ids[stack.local["extra_keys"][name]] = key_id
    return ids[key]


def sdk(stack: LocalStackProcess, key: str | None = None) -> openai.OpenAI:
    """The SDK as a user builds it: base URL and key, nothing else (no retries, so that an
    error shows)."""
    return openai.OpenAI(
        base_url=f"{stack.api}/openai/v1", api_key=key or stack.key, max_retries=0, timeout=60
    )


def upload(stack: LocalStackProcess, lines: list[dict[str, Any]]) -> str:
    """The id of a batch input file of ``lines`` (JSONL), uploaded with ``client.files.create``."""
    data = b"".join(json.dumps(x).encode() + b"\n" for x in lines)
    with sdk(stack) as client:
        return client.files.create(file=("in.jsonl", io.BytesIO(data)), purpose="batch").id


def content_lines(client: openai.OpenAI, file_id: str) -> list[dict[str, Any]]:
    """The JSON lines of a file, read with ``client.files.content``."""
    return [json.loads(x) for x in client.files.content(file_id).text.splitlines() if x.strip()]


def line(cid: str, **body: Any) -> dict[str, Any]:
    return {
        "custom_id": cid,
        "method": "POST",
        "url": "/v1/chat/completions",
        "body": {"model": "echo", "messages": [{"role": "user", "content": cid}], **body},
    }


def wait(client: openai.OpenAI, batch_id: str, states: set[str], timeout: float = 240) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        b = client.batches.retrieve(batch_id)
        if b.status in states:
            return b
        assert time.monotonic() < deadline, f"{batch_id} still {b.status}: {b.request_counts}"
        time.sleep(0.5)


def test_chat_batch_completes_with_an_error_line(stack: LocalStackProcess) -> None:
    lines = [line(f"req-{i}") for i in range(20)]
    lines.append(line("bad", fail={"kind": "permanent"}))
    fid = upload(stack, lines)
    client = sdk(stack)
    batch = client.batches.create(
        input_file_id=fid, endpoint="/v1/chat/completions", completion_window="24h"
    )
    assert batch.status == "validating"
    done = wait(client, batch.id, {"completed", "failed", "expired", "cancelled"})
    assert done.status == "completed", done
    assert done.request_counts is not None
    assert (done.request_counts.total, done.request_counts.completed) == (21, 20)
    assert done.request_counts.failed == 1
    assert done.output_file_id and done.error_file_id
    outputs = content_lines(client, done.output_file_id)
    assert sorted(o["custom_id"] for o in outputs) == sorted(f"req-{i}" for i in range(20))
    for o in outputs:
        ChatCompletion.model_validate(o["response"]["body"])
    errors = content_lines(client, done.error_file_id)
    assert [e["custom_id"] for e in errors] == ["bad"]
    assert errors[0]["response"] is None and errors[0]["error"]["code"]
    # The line jobs are jobs of the tenant, with the batch and custom ids in their metadata.
    with stack.client() as c:
        jobs = c.get("/v1/jobs", params={"limit": 100}).json()["jobs"]
    mine = [j for j in jobs if j["metadata"].get("batch_id") == batch.id]
    assert len(mine) == 21 and {j["priority"] for j in mine} == {"low"}
    # Another tenant sees neither the batch, nor its cancel, nor its output file.
    other = sdk(stack, stack.local["extra_keys"]["other"])
    with pytest.raises(openai.NotFoundError):
        other.files.content(done.output_file_id)
    with pytest.raises(openai.NotFoundError):
        other.batches.retrieve(batch.id)
    with pytest.raises(openai.NotFoundError):
        other.batches.cancel(batch.id)
    assert batch.id not in [b.id for b in other.batches.list()]
    assert batch.id in [b.id for b in client.batches.list(limit=5)]


def test_cancel_mid_batch(stack: LocalStackProcess) -> None:
    fid = upload(stack, [line(f"slow-{i}", sleep_seconds=3) for i in range(12)])
    client = sdk(stack)
    batch = client.batches.create(
        input_file_id=fid, endpoint="/v1/chat/completions", completion_window="24h"
    )
    wait(client, batch.id, {"in_progress"}, timeout=120)
    cancelling = client.batches.cancel(batch.id)
    assert cancelling.status in ("cancelling", "cancelled")
    assert client.batches.cancel(batch.id).status in ("cancelling", "cancelled")  # idempotent
    done = wait(client, batch.id, {"cancelled", "completed", "failed"}, timeout=180)
    assert done.status == "cancelled", done
    assert done.request_counts is not None
    counts = done.request_counts
    assert counts.completed + counts.failed == counts.total == 12
    assert counts.failed >= 1


def test_embeddings_batch_completes_with_vectors(stack: LocalStackProcess) -> None:
    from openai.types import CreateEmbeddingResponse

    lines = [
        {
            "custom_id": f"e{i}",
            "method": "POST",
            "url": "/v1/embeddings",
            "body": {"model": "all-minilm-l6-v2", "input": f"sentence {i}"},
        }
        for i in range(3)
    ]
    lines.append(
        {
            "custom_id": "many",
            "method": "POST",
            "url": "/v1/embeddings",
            "body": {"model": "all-minilm-l6-v2", "input": ["a", "b"]},
        }
    )
    fid = upload(stack, lines)
    client = sdk(stack)
    batch = client.batches.create(
        input_file_id=fid, endpoint="/v1/embeddings", completion_window="24h"
    )
    done = wait(client, batch.id, {"completed", "failed", "expired", "cancelled"}, timeout=420)
    assert done.status == "completed", done
    assert done.request_counts is not None and done.request_counts.completed == 4
    assert done.output_file_id
    outputs = {
        o["custom_id"]: CreateEmbeddingResponse.model_validate(o["response"]["body"])
        for o in content_lines(client, done.output_file_id)
    }
    assert sorted(outputs) == ["e0", "e1", "e2", "many"]
    assert len(outputs["many"].data) == 2
    assert all(len(d.embedding) == 384 for r in outputs.values() for d in r.data)


def test_short_window_expires_with_partial_output(stack: LocalStackProcess) -> None:
    lines = [line(f"fast-{i}") for i in range(3)]
    # The slow lines outlast the 60 s window (they start after it begins): the batch's check at
    # the window's end ends it expired, whether their cancel or their end comes first; the fast
    # lines (run in the same echo batch) are in the output either way.
    lines += [line(f"slow-{i}", sleep_seconds=60) for i in range(2)]
    fid = upload(stack, lines)
    client = sdk(stack)
    batch = client.batches.create(
        input_file_id=fid, endpoint="/v1/chat/completions", completion_window="1m"
    )
    done = wait(client, batch.id, {"completed", "failed", "expired", "cancelled"}, timeout=240)
    assert done.status == "expired", done
    assert done.expired_at is not None
    counts = done.request_counts
    assert counts is not None and counts.total == 5 and counts.completed >= 3
    assert counts.completed + counts.failed == 5
    assert done.output_file_id
    outputs = content_lines(client, done.output_file_id)
    assert {f"fast-{i}" for i in range(3)} <= {o["custom_id"] for o in outputs}
