"""The emulator's test-only fault injection (asyncinfer.local.faults): which requests fail, when."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

from asyncinfer.local.faults import FaultInjector, request_service, write_faults

SNS_AUTH = "AWS4-HMAC-SHA256 Credential=local/20261201/us-east-1/sns/aws4_request, Signature=x"
S3_AUTH = "AWS4-HMAC-SHA256 Credential=local/20261201/us-east-1/s3/aws4_request, Signature=x"


def call(injector: FaultInjector, environ: dict[str, Any]) -> tuple[str, bytes]:
    got: list[str] = []
    body = b"".join(injector(environ, lambda status, headers: got.append(status)))
    return got[0], body


def app(environ: dict[str, Any], start_response: Any) -> list[bytes]:
    start_response("200 OK", [])
    return [environ["wsgi.input"].read()]


def sns(action: str) -> dict[str, Any]:
    body = f"Action={action}&TopicArn=arn".encode()
    return {
        "REQUEST_METHOD": "POST",
        "HTTP_AUTHORIZATION": SNS_AUTH,
        "CONTENT_LENGTH": str(len(body)),
        "wsgi.input": io.BytesIO(body),
    }


def s3(method: str) -> dict[str, Any]:
    return {"REQUEST_METHOD": method, "HTTP_AUTHORIZATION": S3_AUTH, "wsgi.input": io.BytesIO()}


def test_nothing_fails_without_the_file(tmp_path: Path) -> None:
    injector = FaultInjector(app, tmp_path / "faults.json")
    assert call(injector, sns("Publish"))[0] == "200 OK"
    assert call(injector, s3("PUT"))[0] == "200 OK"


def test_sns_publish_fails_in_its_window_and_keeps_its_body_otherwise(tmp_path: Path) -> None:
    path = tmp_path / "faults.json"
    injector = FaultInjector(app, path)
    write_faults(path, {"sns": 30})
    assert call(injector, sns("Publish"))[0].startswith("500")
    status, body = call(injector, sns("PublishBatch"))
    assert status.startswith("500") and b"InternalError" in body
    # Other actions pass, with their body intact after it was read for the action.
    status, body = call(injector, sns("ListTopics"))
    assert status == "200 OK" and body == b"Action=ListTopics&TopicArn=arn"
    assert call(injector, s3("PUT"))[0] == "200 OK"  # S3 has no window


def test_s3_reads_and_writes_fail_not_posts_nor_deletes(tmp_path: Path) -> None:
    path = tmp_path / "faults.json"
    injector = FaultInjector(app, path)
    write_faults(path, {"s3": 30})
    for method in ("GET", "HEAD", "PUT"):
        status, body = call(injector, s3(method))
        assert status.startswith("503") and b"SlowDown" in body
    assert call(injector, s3("POST"))[0] == "200 OK"
    assert call(injector, s3("DELETE"))[0] == "200 OK"
    assert call(injector, sns("Publish"))[0] == "200 OK"


def test_windows_close_when_they_pass_or_are_cleared(tmp_path: Path) -> None:
    path = tmp_path / "faults.json"
    injector = FaultInjector(app, path)
    write_faults(path, {"s3": -1})
    assert call(injector, s3("GET"))[0] == "200 OK"
    write_faults(path, {"s3": 30}, status={"s3": 500})
    assert call(injector, s3("GET"))[0].startswith("500")
    write_faults(path, {})
    assert call(injector, s3("GET"))[0] == "200 OK"


def test_the_service_comes_from_the_credential_scope() -> None:
    assert request_service({"HTTP_AUTHORIZATION": SNS_AUTH}) == "sns"
    presigned = (
        "X-Amz-Algorithm=AWS4&X-Amz-Credential=local%2F20261201%2Fus-east-1%2Fs3%2Faws4_request"
    )
    assert request_service({"QUERY_STRING": presigned}) == "s3"
    assert request_service({}) is None
