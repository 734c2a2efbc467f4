"""Inputs are bounded and only the tenant's own (issue 14, behaviour 4): input_url rules, the
upload cap in the presigned request, and the worker's read of an input from S3."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest

from asyncinfer.aws import clients
from asyncinfer.aws.payloads import MAX_JSON_DEPTH, PayloadStore
from asyncinfer.core.errors import InvalidInput
from asyncinfer.core.settings import Settings
from asyncinfer.local.resources import Resources
from tests.conftest import ApiCaller, apply_env
from tests.unit.helpers import count_calls


def s3() -> Any:
    return clients.client("s3")


# ---------------------------------------------------------------------------- input_url
def refusal(api: ApiCaller, url: str) -> tuple[int, Any]:
    status, resp, _ = api("POST", "/v1/jobs", {"model": "echo", "input_url": url})
    return status, resp


def test_input_url_errors_do_not_tell_what_exists(api: ApiCaller, resources: Resources) -> None:
    s3().create_bucket(Bucket="someone-elses")
    s3().put_object(Bucket="someone-elses", Key="secret.json", Body=b"{}")
    s3().put_object(Bucket=resources.bucket, Key="outputs/tenant-b/job.json", Body=b"{}")
    answers = []
    for url in (
        "s3://someone-elses/secret.json",  # exists
        "s3://someone-elses/nothing.json",  # bucket exists, key does not
        "s3://no-such-bucket-anywhere/x.json",  # nothing exists
        f"s3://{resources.bucket}/outputs/tenant-b/job.json",  # another tenant's output
        f"s3://{resources.bucket}/uploads/tenant-b/x.json",  # another tenant's upload
        f"s3://{resources.bucket}/uploads/tenant-a/../tenant-b/x.json",  # dot segments
        f"s3://{resources.bucket}/uploads/tenant-ab/x.json",  # a tenant id with ours as prefix
    ):
        status, resp = refusal(api, url)
        assert status == 422, url
        assert resp["error"]["details"][0]["field"] == "input_url"
        answers.append(json.dumps(resp))
    assert len(set(answers)) == 1  # the same answer, byte for byte


def test_operator_allowed_locations(
    api: ApiCaller, resources: Resources, clean_env: pytest.MonkeyPatch
) -> None:
    apply_env(clean_env, {"ASYNCINFER_INPUT_LOCATIONS": "shared-data/public, whole-bucket"})
    assert refusal(api, "s3://shared-data/public/a.json")[0] == 202
    assert refusal(api, "s3://whole-bucket/any/key.json")[0] == 202
    assert refusal(api, "s3://shared-data/public-not/a.json")[0] == 422  # prefix is a folder
    assert refusal(api, "s3://shared-data/private/a.json")[0] == 422
    assert refusal(api, f"s3://{resources.bucket}/uploads/tenant-a/ok.json")[0] == 202


def test_allowed_locations_never_open_the_service_bucket(
    api: ApiCaller, resources: Resources, clean_env: pytest.MonkeyPatch
) -> None:
    apply_env(
        clean_env, {"ASYNCINFER_INPUT_LOCATIONS": f"{resources.bucket},{resources.bucket}/outputs"}
    )
    assert refusal(api, f"s3://{resources.bucket}/outputs/tenant-b/job.json")[0] == 422
    assert refusal(api, f"s3://{resources.bucket}/uploads/tenant-b/x.json")[0] == 422


# ---------------------------------------------------------------------------- uploads
def test_upload_is_capped_by_its_presigned_policy(
    api: ApiCaller, resources: Resources, clean_env: pytest.MonkeyPatch
) -> None:
    apply_env(clean_env, {"ASYNCINFER_MAX_INPUT_BYTES": "5000"})
    status, up, _ = api("POST", "/v1/uploads")
    assert status == 201
    assert {"upload_url", "input_url", "expires_at"} <= set(up)  # the spec's fields stay
    assert up["max_bytes"] == 5000
    fields = up["upload_form"]["fields"]
    policy = json.loads(base64.b64decode(fields["policy"]))
    assert ["content-length-range", 1, 5000] in policy["conditions"]
    key = up["input_url"].split("/", 3)[3]
    assert fields["key"] == key and key.startswith("uploads/tenant-a/")
    assert {"key": key} in policy["conditions"] or ["eq", "$key", key] in policy["conditions"]


# ---------------------------------------------------------------------------- worker reads
def test_worker_read_checks_the_size_before_reading(resources: Resources) -> None:
    settings = Settings.from_env().model_copy(update={"max_input_bytes": 100})
    s3().put_object(
        Bucket=resources.bucket, Key="uploads/t/big.json", Body=b"[" + b"1," * 99 + b"1]"
    )
    s3().put_object(Bucket=resources.bucket, Key="uploads/t/ok.json", Body=b'{"a": 1}')
    store = PayloadStore(settings)
    calls = count_calls(store.s3)
    with pytest.raises(InvalidInput, match="larger than 100 bytes"):
        store.read_json(f"s3://{resources.bucket}/uploads/t/big.json")
    assert calls["GetObject"] == 0 and calls["HeadObject"] == 1
    assert store.read_json(f"s3://{resources.bucket}/uploads/t/ok.json") == {"a": 1}


def test_worker_read_errors_are_one_message(resources: Resources) -> None:
    store = PayloadStore(Settings.from_env())
    s3().create_bucket(Bucket="other-bucket")
    messages = set()
    for uri in ("s3://other-bucket/missing.json", "s3://no-such-bucket-zz/missing.json"):
        with pytest.raises(InvalidInput) as info:
            store.read_json(uri)
        messages.add(str(info.value).replace(uri, "URI"))
    assert len(messages) == 1
    assert "NoSuch" not in messages.pop()


@pytest.mark.parametrize(
    ("body", "why"),
    [
        (b"[" * 5000 + b"]" * 5000, "nested too deeply"),  # a RecursionError before
        (b'{"a": ' + b"[" * 70 + b"]" * 70 + b"}", "nested"),  # past the API's 64 levels
        (b'{"x": 1e400}', "out of range"),
        (b"\xff\xfe", "not JSON"),
    ],
)
def test_worker_read_holds_the_submit_limits(resources: Resources, body: bytes, why: str) -> None:
    s3().put_object(Bucket=resources.bucket, Key="uploads/t/x.json", Body=body)
    with pytest.raises(InvalidInput, match=why):
        PayloadStore(Settings.from_env()).read_json(f"s3://{resources.bucket}/uploads/t/x.json")


def test_depth_limit_is_the_same_for_upload_and_inline() -> None:
    from asyncinfer.aws.payloads import json_problem

    ok: Any = {}
    for _ in range(MAX_JSON_DEPTH - 1):
        ok = {"a": ok}
    assert json_problem(ok) is None
    assert json_problem({"a": ok}) is not None


@pytest.mark.parametrize(
    "body", [b"[" * 5000 + b"]" * 5000, b'{"a": ' + b"[" * 70 + b"]" * 70 + b"}"]
)
def test_sagemaker_endpoint_holds_the_same_limits(body: bytes) -> None:
    from asyncinfer.models.echo import EchoHandler
    from asyncinfer.models.registry import MODELS
    from asyncinfer.worker.sagemaker_server import InvocationsApp

    app = InvocationsApp("echo", handler=EchoHandler(spec=MODELS["echo"]))
    status, resp = app.invoke(body)
    assert status == 400 and resp["error"]["code"] == "invalid_input"
