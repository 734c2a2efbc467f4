"""End to end: the unchanged ``openai`` SDK against the local stack's ``/openai/v1`` Files
surface (issue 15): create, list, retrieve, content, delete; a wrong key; another tenant; a
multipart upload over the limit; a large file through ``POST /v1/uploads`` + ``input_url``,
whose content comes back by the redirect the SDK follows."""

from __future__ import annotations

import io
from collections.abc import Iterator

import httpx
import openai
import pytest

from asyncinfer.openai_api.limits import INLINE_CONTENT_BYTES, MAX_MULTIPART_BYTES
from tests.e2e.conftest import LocalStackProcess, local_stack

pytestmark = pytest.mark.e2e

LINE = (
    b'{"custom_id": "r-%05d", "method": "POST", "url": "/v1/embeddings", '
    b'"body": {"model": "echo", "input": "caf\xc3\xa9"}}\n'
)


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalStackProcess]:
    with local_stack(
        tmp_path_factory.mktemp("state"), "--models", "echo", "--extra-key", "other"
    ) as s:
        yield s


def sdk(stack: LocalStackProcess, key: str | None = None) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{stack.api}/openai/v1", api_key=key or stack.key, timeout=60)


def test_files_round_trip_with_the_sdk(stack: LocalStackProcess) -> None:
    data = b"".join(LINE % i for i in range(50))
    with sdk(stack) as client:
        f = client.files.create(file=("requests.jsonl", io.BytesIO(data)), purpose="batch")
        assert f.id.startswith("file-") and f.bytes == len(data) and f.purpose == "batch"
        assert f.filename == "requests.jsonl"
        assert client.files.retrieve(f.id).id == f.id
        assert client.files.content(f.id).content == data
        g = client.files.create(file=("second.jsonl", data[:100]), purpose="batch")
        listed = [x.id for x in client.files.list()]
        assert listed[:2] == [g.id, f.id]  # newest first
        assert [x.id for x in client.files.list(limit=1)] == listed  # pager follows `after`
        gone = client.files.delete(g.id)
        assert gone.deleted is True and gone.id == g.id
        with pytest.raises(openai.NotFoundError):
            client.files.retrieve(g.id)
        assert g.id not in [x.id for x in client.files.list()]


def test_a_wrong_key_is_an_authentication_error(stack: LocalStackProcess) -> None:
    with sdk(stack, "not-a-key") as client, pytest.raises(openai.AuthenticationError) as err:
        client.files.list()
    assert err.value.status_code == 401 and err.value.code == "invalid_api_key"


def test_another_tenant_gets_not_found(stack: LocalStackProcess) -> None:
    with sdk(stack) as mine:
        f = mine.files.create(file=("mine.jsonl", LINE % 1), purpose="batch")
    with sdk(stack, stack.local["extra_keys"]["other"]) as theirs:
        with pytest.raises(openai.NotFoundError):
            theirs.files.retrieve(f.id)
        with pytest.raises(openai.NotFoundError):
            theirs.files.content(f.id)
        with pytest.raises(openai.NotFoundError):
            theirs.files.delete(f.id)
        assert f.id not in [x.id for x in theirs.files.list()]


def test_a_multipart_upload_over_the_limit_is_413(stack: LocalStackProcess) -> None:
    big = LINE * (MAX_MULTIPART_BYTES // len(LINE) + 10)
    with sdk(stack) as client, pytest.raises(openai.APIStatusError) as err:
        client.files.create(file=("big.jsonl", big), purpose="batch")
    assert err.value.status_code == 413 and err.value.code == "payload_too_large"
    assert "POST /v1/uploads" in err.value.message


def test_a_large_file_through_uploads_and_its_content_by_redirect(
    stack: LocalStackProcess,
) -> None:
    big = b"".join(LINE % (i % 100000) for i in range(INLINE_CONTENT_BYTES // len(LINE) + 2000))
    assert len(big) > INLINE_CONTENT_BYTES
    with stack.client() as c:
        up = c.post("/v1/uploads").json()
    put = httpx.put(up["upload_url"], content=big, timeout=120)
    assert put.status_code == 200, put.text
    with sdk(stack) as client:
        f = client.post(
            "/files",
            body={"purpose": "batch", "input_url": up["input_url"], "filename": "big.jsonl"},
            cast_to=openai.types.FileObject,
        )
        assert f.bytes == len(big) and f.filename == "big.jsonl"
        raw = client.files.with_raw_response.content(f.id)
        assert raw.http_response.history and raw.http_response.history[0].status_code == 302
        assert raw.http_response.content == big
