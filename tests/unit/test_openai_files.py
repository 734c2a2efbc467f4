"""The Files routes of ``/openai/v1`` (spec openai.md, "Files") through the unchanged ``openai``
SDK, its HTTP client wired to the API handler in-process (moto in-process holds the bucket), with
the local gateway's key rule in front."""

from __future__ import annotations

import base64
import io
import json
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any
from urllib.parse import unquote, urlsplit

import httpx2
import openai
import pytest

from asyncinfer.aws import clients
from asyncinfer.core.settings import get_settings
from asyncinfer.local.gateway import build_event, unauthorized
from asyncinfer.local.lambda_runtime import LocalContext
from asyncinfer.local.resources import Resources
from asyncinfer.openai_api import routes_files
from asyncinfer.openai_api.auth import api_key
from asyncinfer.openai_api.files import FileStore, file_key

KEYS = {"key-a": "tenant-a", "key-b": "tenant-b"}
API = "http://api.test"


def _serve_s3(request: httpx2.Request) -> httpx2.Response:
    """A presigned GET of the moto bucket (what a 302 of /content points at)."""
    parts = urlsplit(str(request.url))
    host, path = parts.netloc, unquote(parts.path).lstrip("/")
    if host.startswith("s3.") or host.startswith("127.") or host == "localhost":
        bucket, _, key = path.partition("/")
    else:
        bucket, key = host.split(".", 1)[0], path
    obj = clients.client("s3").get_object(Bucket=bucket, Key=key)
    return httpx2.Response(200, content=obj["Body"].read())


def _transport(request: httpx2.Request) -> httpx2.Response:
    from asyncinfer.functions.api.app import handler

    if not str(request.url).startswith(API):
        return _serve_s3(request)
    headers = list(request.headers.items())
    key = api_key(headers)
    if KEYS.get(key or "") is None:
        return httpx2.Response(401, json=unauthorized(key))
    target = request.url.raw_path.decode()
    event = build_event(
        request.method,
        target,
        headers,
        request.read(),
        api_key=key,
        api_key_id=KEYS[key or ""],
        source_ip="127.0.0.1",
    )
    resp = handler(event, LocalContext())
    body = resp.get("body") or ""
    data = base64.b64decode(body) if resp.get("isBase64Encoded") else body.encode()
    out = dict(resp.get("headers") or {})
    out.update({k: ", ".join(v) for k, v in (resp.get("multiValueHeaders") or {}).items()})
    return httpx2.Response(resp["statusCode"], headers=out, content=data)


def sdk(key: str = "key-a") -> openai.OpenAI:
    return openai.OpenAI(
        base_url=f"{API}/openai/v1",
        api_key=key,
        max_retries=0,
        # The SDK's own client class (its defaults: redirects followed), over the handler.
        http_client=openai.DefaultHttpxClient(transport=httpx2.MockTransport(_transport)),
    )


@pytest.fixture
def client(resources: Resources) -> Iterator[openai.OpenAI]:
    with sdk() as c:
        yield c


LINES = b'{"custom_id": "a", "method": "POST", "url": "/v1/embeddings", "body": {}}\n'


def test_create_retrieve_content_list_delete(client: openai.OpenAI) -> None:
    f = client.files.create(file=("req.jsonl", io.BytesIO(LINES)), purpose="batch")
    assert f.id.startswith("file-") and f.object == "file" and f.purpose == "batch"
    assert f.bytes == len(LINES) and f.filename == "req.jsonl" and f.created_at > 0
    assert client.files.retrieve(f.id) == f
    assert client.files.content(f.id).content == LINES
    g = client.files.create(file=("two.jsonl", io.BytesIO(LINES * 2)), purpose="batch")
    assert [x.id for x in client.files.list()] == [g.id, f.id]  # newest first
    deleted = client.files.delete(f.id)
    assert deleted.id == f.id and deleted.deleted is True and deleted.object == "file"
    with pytest.raises(openai.NotFoundError) as err:
        client.files.retrieve(f.id)
    assert err.value.status_code == 404 and err.value.body["type"] == "invalid_request_error"
    assert [x.id for x in client.files.list()] == [g.id]


def test_binary_and_crlf_bytes_come_back_unchanged(client: openai.OpenAI) -> None:
    data = b'{"x": 1}\r\n' + bytes(range(256)) + b"\r\n--\r\n"
    f = client.files.create(file=("blob.jsonl", data), purpose="batch")
    assert f.bytes == len(data)
    assert client.files.content(f.id).content == data


def test_list_pages_with_limit_and_after(client: openai.OpenAI) -> None:
    ids = [client.files.create(file=(f"{i}.jsonl", LINES), purpose="batch").id for i in range(5)]
    newest = list(reversed(ids))
    page = client.files.list(limit=2)
    assert [x.id for x in page.data] == newest[:2] and page.has_more is True
    every = [x.id for x in client.files.list(limit=2)]  # the SDK's pager follows `after`
    assert every == newest
    after = client.files.list(limit=10, after=newest[1])
    assert [x.id for x in after.data] == newest[2:] and after.has_more is False
    asc = client.files.list(order="asc", limit=10)
    assert [x.id for x in asc.data] == ids


def test_list_page_is_capped(client: openai.OpenAI, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(routes_files, "PAGE_MAX", 2)
    for i in range(3):
        client.files.create(file=(f"{i}.jsonl", LINES), purpose="batch")
    page = client.files.list(limit=10000)
    assert len(page.data) == 2 and page.has_more is True


def test_another_tenant_gets_404(client: openai.OpenAI) -> None:
    f = client.files.create(file=("req.jsonl", LINES), purpose="batch")
    with sdk("key-b") as other:
        with pytest.raises(openai.NotFoundError):
            other.files.retrieve(f.id)
        with pytest.raises(openai.NotFoundError):
            other.files.content(f.id)
        with pytest.raises(openai.NotFoundError):
            other.files.delete(f.id)
        assert list(other.files.list()) == []
    assert client.files.retrieve(f.id).id == f.id  # still there


def test_a_wrong_key_is_an_authentication_error(resources: Resources) -> None:
    with sdk("nope") as c, pytest.raises(openai.AuthenticationError) as err:
        c.files.list()
    assert err.value.status_code == 401 and err.value.code == "invalid_api_key"
    assert err.value.body["type"] == "authentication_error"


def test_an_id_that_is_no_file_id_is_404(client: openai.OpenAI) -> None:
    for bad in ("file-x", "file-..x", "job_01J00000000000000000000000"):
        with pytest.raises(openai.NotFoundError):
            client.files.retrieve(bad)


def test_purpose_other_than_batch_is_refused(client: openai.OpenAI) -> None:
    with pytest.raises(openai.UnprocessableEntityError) as err:
        client.files.create(file=("a.jsonl", LINES), purpose="fine-tune")
    assert err.value.body["param"] == "purpose"
    with pytest.raises(openai.UnprocessableEntityError) as err:
        client.files.create(file=("a.jsonl", b""), purpose="batch")
    assert err.value.body["param"] == "file"


def test_too_large_multipart_is_413(client: openai.OpenAI, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(routes_files, "MAX_MULTIPART_BYTES", 1000)
    with pytest.raises(openai.APIStatusError) as err:
        client.files.create(file=("big.jsonl", b"x" * 2000), purpose="batch")
    assert err.value.status_code == 413 and err.value.code == "payload_too_large"
    assert "POST /v1/uploads" in err.value.message
    assert list(client.files.list()) == []


def _upload(tenant: str, data: bytes) -> str:
    settings = get_settings()
    key = f"uploads/{tenant}/01JUPLOAD.json"
    clients.client("s3").put_object(Bucket=settings.bucket, Key=key, Body=data)
    return f"s3://{settings.bucket}/{key}"


def test_create_from_an_upload(client: openai.OpenAI) -> None:
    url = _upload("tenant-a", LINES * 3)
    body: dict[str, Any] = {"purpose": "batch", "input_url": url, "filename": "big.jsonl"}
    f = client.post("/files", body=body, cast_to=openai.types.FileObject)
    assert f.bytes == len(LINES) * 3 and f.filename == "big.jsonl"
    assert client.files.content(f.id).content == LINES * 3


def test_upload_of_another_tenant_or_elsewhere_is_refused(client: openai.OpenAI) -> None:
    settings = get_settings()
    for url in (
        _upload("tenant-b", LINES),
        f"s3://{settings.bucket}/outputs/tenant-a/x.json",
        f"s3://{settings.bucket}/uploads/tenant-a/missing.json",
        "https://example.com/x",
    ):
        with pytest.raises(openai.UnprocessableEntityError) as err:
            client.post(
                "/files",
                body={"purpose": "batch", "input_url": url},
                cast_to=openai.types.FileObject,
            )
        assert err.value.body["param"] == "input_url", url
    with pytest.raises(openai.UnprocessableEntityError) as err:
        client.post("/files", body={"purpose": "batch"}, cast_to=openai.types.FileObject)
    assert err.value.body["param"] == "input_url"


def test_large_content_is_a_redirect_the_sdk_follows(
    client: openai.OpenAI, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(routes_files, "INLINE_CONTENT_BYTES", 10)
    f = client.files.create(file=("req.jsonl", LINES), purpose="batch")
    assert client.files.content(f.id).content == LINES
    from tests.conftest import ApiCaller

    status, _, headers = ApiCaller("tenant-a")("GET", f"/openai/v1/files/{f.id}/content")
    assert status == 302 and "Signature=" in headers["location"]
    assert f"openai/files/tenant-a/{f.id}" in unquote(headers["location"])


def test_validation_and_unknown_routes_use_openai_errors(client: openai.OpenAI) -> None:
    with pytest.raises(openai.UnprocessableEntityError) as err:
        client.files.list(limit=0)
    assert err.value.body["param"] == "limit" and err.value.code == "invalid_request"
    with pytest.raises(openai.NotFoundError) as nf:
        client.get("/nothing", cast_to=object)
    assert set(nf.value.body) == {"message", "type", "param", "code"}


def test_store_keeps_filename_and_purpose(resources: Resources) -> None:
    settings = get_settings()
    files = FileStore(clients.client("s3"), settings.bucket)
    made = files.create("t", b"abc", filename='r\u00e9sum\u00e9 "q".jsonl', purpose="batch_output")
    head = clients.client("s3").head_object(Bucket=settings.bucket, Key=file_key("t", made["id"]))
    assert head["Metadata"]["purpose"] == "batch_output"
    assert files.get("t", made["id"])["filename"] == 'r\u00e9sum\u00e9 "q".jsonl'
    assert files.read("t", made["id"]) == b"abc"
    assert files.list("t", limit=10, purpose="batch")[0] == []
    assert [f["id"] for f in files.list("t", limit=10, purpose="batch_output")[0]] == [made["id"]]
    assert json.loads(json.dumps(files.get("t", made["id"])))["object"] == "file"


def test_bad_bodies_are_4xx_and_store_nothing(client: openai.OpenAI) -> None:
    from tests.conftest import ApiCaller

    call = ApiCaller("tenant-a")
    status, body, _ = call(
        "POST",
        "/openai/v1/files",
        raw=b"--B\r\nno headers\r\n",
        headers={"content-type": "multipart/form-data"},
    )
    assert status == 400 and body["error"]["type"] == "invalid_request_error"
    status, body, _ = call(
        "POST", "/openai/v1/files", raw=b"x", headers={"content-type": "text/plain"}
    )
    assert status == 415 and body["error"]["param"] == "Content-Type"
    status, body, _ = call("POST", "/openai/v1/files", raw=b"{nope")
    assert status == 400 and body["error"]["code"] == "invalid_json"
    assert list(client.files.list()) == []


def test_store_maps_only_absent_objects_to_not_found() -> None:
    from botocore.exceptions import ClientError

    from asyncinfer.core.errors import NotFound

    class S3:
        exceptions = SimpleNamespace(ClientError=ClientError)

        def __init__(self, status: int) -> None:
            self.status = status

        def head_object(self, **_: Any) -> Any:
            raise ClientError(
                {
                    "Error": {"Code": str(self.status)},
                    "ResponseMetadata": {"HTTPStatusCode": self.status},
                },
                "HeadObject",
            )

    for status in (403, 404):
        with pytest.raises(NotFound):
            FileStore(S3(status), "b").get("t", "file-x")
    with pytest.raises(ClientError):  # throttling, outages: not a missing file
        FileStore(S3(503), "b").get("t", "file-x")


def test_tenant_from_the_authorizer_context(resources: Resources) -> None:
    from asyncinfer.functions.api.app import handler

    for path in ("/v1/jobs", "/openai/v1/files", "/openai/v1/batches"):
        event = build_event(
            "GET", path, [], b"", api_key=None, api_key_id=None, source_ip="127.0.0.1"
        )
        event["requestContext"]["authorizer"] = {"apiKeyId": "tenant-a", "principalId": "x"}
        assert handler(event, LocalContext())["statusCode"] == 200, path
        event["requestContext"]["authorizer"] = None
        want = 401 if path.startswith("/openai/") else 500
        assert handler(event, LocalContext())["statusCode"] == want, path


def test_the_v1_openapi_document_leaves_the_openai_surface_out(resources: Resources) -> None:
    from tests.conftest import ApiCaller

    status, doc, _ = ApiCaller("tenant-a")("GET", "/v1/openapi.json")
    assert status == 200 and doc["paths"]
    assert all(p.startswith("/v1/") for p in doc["paths"])


def test_a_json_body_nested_too_deeply_is_400(client: openai.OpenAI) -> None:
    from tests.conftest import ApiCaller

    raw = b"[" * 30_000 + b"]" * 30_000  # under the 64 KB JSON cap, deeper than the decoder
    status, body, _ = ApiCaller("tenant-a")("POST", "/openai/v1/files", raw=raw)
    assert status == 400 and body["error"]["code"] == "invalid_json"
    assert list(client.files.list()) == []


def test_a_long_multibyte_filename_fits_s3_user_metadata(resources: Resources) -> None:
    # S3 takes at most 2 KB of user metadata (moto does not check): 255 emoji percent-encode to
    # 3,060 bytes, and AWS would refuse the PUT (a 500 to the client).
    settings = get_settings()
    s3 = clients.client("s3")
    files = FileStore(s3, settings.bucket)
    made = files.create("t", b"abc", filename="\U0001f600" * 255, purpose="batch")
    meta = s3.head_object(Bucket=settings.bucket, Key=file_key("t", made["id"]))["Metadata"]
    assert sum(len(k) + len(v) for k, v in meta.items()) <= 2048
    assert made["filename"] == files.get("t", made["id"])["filename"]
    assert made["filename"].startswith("\U0001f600") and set(made["filename"]) == {"\U0001f600"}
