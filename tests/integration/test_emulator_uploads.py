"""The local stack's emulator stores an upload's body as sent, whatever its content type, as S3
does (``curl -X PUT --data-binary`` sends ``application/x-www-form-urlencoded``, and moto server
used to parse that as a form and store what was left: nothing)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import boto3
import httpx
import pytest

from asyncinfer.local.emulator import start_emulator
from asyncinfer.local.stack import free_port, wait_http

BUCKET = "uploads-test"


@pytest.fixture(scope="module")
def s3() -> Iterator[Any]:
    port = free_port()
    proc = start_emulator(port)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_http(url + "/moto-api/", 30)
        client = boto3.client(
            "s3",
            endpoint_url=url,
            region_name="us-east-1",
            aws_access_key_id="local",
            aws_secret_access_key="local",
        )
        client.create_bucket(Bucket=BUCKET)
        yield client
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=5)
        except Exception:
            proc.kill()


BODIES = [
    b'{"texts": ["a=b&c=d", "key=x"], "n": 1}',
    b'{"prompt": "100% + 50% = ?", "s": "a b"}',
    b"key=value&file=other",  # what a form parser would take as a form with a "key"
    bytes(range(256)),
]
CONTENT_TYPES = [
    "application/x-www-form-urlencoded",  # curl --data-binary's default
    "multipart/form-data; boundary=xyz",
    "application/json",
    "text/plain",
    None,
]


@pytest.mark.parametrize("content_type", CONTENT_TYPES)
def test_presigned_put_stores_the_body_as_sent(s3: Any, content_type: str | None) -> None:
    for n, body in enumerate(BODIES):
        key = f"uploads/t/{n}-{content_type and content_type.split(';')[0]}.json"
        url = s3.generate_presigned_url(
            "put_object", Params={"Bucket": BUCKET, "Key": key}, ExpiresIn=60
        )
        headers = {"content-type": content_type} if content_type else {}
        resp = httpx.put(url, content=body, headers=headers, timeout=30)
        assert resp.status_code == 200, resp.text
        got = s3.get_object(Bucket=BUCKET, Key=key)
        assert got["Body"].read() == body
        assert got["ContentLength"] == len(body)
        if content_type:
            assert got["ContentType"] == content_type


def test_boto3_put_with_a_form_content_type_round_trips(s3: Any) -> None:
    body = b'{"a": "x=1&y=2"}'
    s3.put_object(
        Bucket=BUCKET, Key="k.json", Body=body, ContentType="application/x-www-form-urlencoded"
    )
    assert s3.get_object(Bucket=BUCKET, Key="k.json")["Body"].read() == body


def test_presigned_post_form_still_uploads(s3: Any) -> None:
    body = b'{"texts": ["a=b"]}'
    form = s3.generate_presigned_post(
        Bucket=BUCKET,
        Key="uploads/t/form.json",
        Conditions=[["content-length-range", 1, 1024]],
        ExpiresIn=60,
    )
    resp = httpx.post(form["url"], data=form["fields"], files={"file": body}, timeout=30)
    assert resp.status_code in (200, 201, 204), resp.text
    assert s3.get_object(Bucket=BUCKET, Key="uploads/t/form.json")["Body"].read() == body
