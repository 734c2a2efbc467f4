"""Least privilege on the data bucket (issue 14, item 8): the API Lambda and the OpenAI batch
functions get object rights only on the prefixes they use (infra/components/bucket_access.py),
never s3:PutObject or s3:DeleteObject on the whole bucket; one test per function. And the
prefixes granted are the ones the code builds its keys under."""

from __future__ import annotations

import fnmatch
import json
from typing import Any

import pytest

API = "asyncinfer REST API"
EXPANDER = "asyncinfer OpenAI batch expander"
COUNTER = "asyncinfer OpenAI batch line counter"


def _bucket_lid(s: Any) -> str:
    """The data bucket's logical id (the one with lifecycle rules; the other holds access logs)."""
    (lid,) = [
        k
        for k, r in s.resources("AWS::S3::Bucket").items()
        if any(
            rule.get("Prefix") == "inputs/"
            for rule in r["Properties"].get("LifecycleConfiguration", {}).get("Rules", [])
        )
    ]
    return lid


def _role_of(s: Any, description: str) -> str:
    (fn,) = [
        r
        for r in s.resources("AWS::Lambda::Function").values()
        if r["Properties"].get("Description", "").startswith(description)
    ]
    role: str = fn["Properties"]["Role"]["Fn::GetAtt"][0]
    return role


def _object_rights(s: Any, description: str) -> dict[str, set[str]]:
    """S3 action -> the key patterns (``prefix/*``, ``*`` for the whole bucket) of the data
    bucket that the function's role gets it on."""
    bucket, role = _bucket_lid(s), _role_of(s, description)
    rights: dict[str, set[str]] = {}
    for p in s.props("AWS::IAM::Policy"):
        if {"Ref": role} not in p.get("Roles", []):
            continue
        for st in p["PolicyDocument"]["Statement"]:
            actions = st["Action"] if isinstance(st["Action"], list) else [st["Action"]]
            resources = st["Resource"] if isinstance(st["Resource"], list) else [st["Resource"]]
            for r in resources:
                parts = r.get("Fn::Join", ["", []])[1] if isinstance(r, dict) else []
                if len(parts) == 2 and parts[0] == {"Fn::GetAtt": [bucket, "Arn"]}:
                    for a in actions:
                        if a.startswith("s3:"):
                            rights.setdefault(a, set()).add(parts[1].removeprefix("/"))
    return rights


def _check(s: Any, description: str, access: Any) -> None:
    rights = _object_rights(s, description)
    assert rights, f"{description}: no object rights on the data bucket"
    for action, keys in rights.items():
        assert "*" not in keys, f"{description}: {action} on the whole bucket"
    assert rights.get("s3:GetObject*") == set(access.read)
    assert rights.get("s3:PutObject", set()) == set(access.put)
    assert rights.get("s3:DeleteObject*", set()) == set(access.delete)


def test_api_function_gets_only_its_prefixes(any_mode: Any) -> None:
    from infra.components import bucket_access

    _check(any_mode, API, bucket_access.API)
    rights = _object_rights(any_mode, API)
    # Presigned PUT and POST of POST /v1/uploads are signed by the API's role.
    assert "uploads/*" in rights["s3:PutObject"]
    assert "outputs/*" not in rights["s3:PutObject"]


def test_batch_expander_gets_only_its_prefixes(any_mode: Any) -> None:
    from infra.components import bucket_access

    _check(any_mode, EXPANDER, bucket_access.BATCH_EXPANDER)


def test_batch_counter_gets_only_its_prefixes(any_mode: Any) -> None:
    from infra.components import bucket_access

    _check(any_mode, COUNTER, bucket_access.BATCH_COUNTER)
    assert "s3:DeleteObject*" not in _object_rights(any_mode, COUNTER)


@pytest.mark.parametrize(
    ("pattern", "key"),
    [
        ("inputs/*", "input"),
        ("outputs/*", "output"),
        ("uploads/*", "upload"),
        ("openai/files/*", "file"),
        ("openai/batches/*", "chunk"),
    ],
)
def test_granted_prefixes_are_where_the_code_puts_its_keys(pattern: str, key: str) -> None:
    from asyncinfer.aws.payloads import PayloadStore
    from asyncinfer.core.settings import Settings
    from asyncinfer.jobs.inputs import upload_prefix
    from asyncinfer.openai_api.chunks import chunk_key
    from asyncinfer.openai_api.files import file_key
    from infra.components import bucket_access

    class RecordingS3:
        key = ""

        def put_object(self, **kwargs: Any) -> None:
            self.key = kwargs["Key"]

    store = PayloadStore.__new__(PayloadStore)
    store.settings = Settings.model_construct(bucket="b")
    store.s3 = s3 = RecordingS3()
    store.put_input("t", "job_1", b"{}")
    input_key = s3.key
    store.put_output("t", "job_1", b"{}")
    keys = {
        "input": input_key,
        "output": s3.key,
        "upload": f"{upload_prefix('t')}01J.json",
        "file": file_key("t", "file-01J"),
        "chunk": chunk_key("t", "batch_1", 0),
    }
    assert pattern in bucket_access.PREFIXES
    assert fnmatch.fnmatchcase(keys[key], pattern)
    assert not any(
        fnmatch.fnmatchcase(keys[key], other)
        for other in bucket_access.PREFIXES
        if other != pattern
    )


# ------------------------------------------------- the rights are enough for what the code does
#: What every function may do beside the bucket in this check (the test is about S3 only).
_NOT_S3 = ["dynamodb:*", "sqs:*", "sns:*", "kms:*", "ecs:*", "sagemaker:*", "sts:*"]


def _bucket_statements(s: Any, description: str, bucket: str) -> list[dict[str, Any]]:
    """The function role's synthesized statements on the data bucket, with the bucket's ARN
    (a CloudFormation token in the template) put in as ``arn:aws:s3:::<bucket>``."""
    lid, role = _bucket_lid(s), _role_of(s, description)
    arn = {"Fn::GetAtt": [lid, "Arn"]}
    out = []
    for p in s.props("AWS::IAM::Policy"):
        if {"Ref": role} not in p.get("Roles", []):
            continue
        for st in p["PolicyDocument"]["Statement"]:
            resources = st["Resource"] if isinstance(st["Resource"], list) else [st["Resource"]]
            literal = []
            for r in resources:
                parts = r.get("Fn::Join", ["", []])[1] if isinstance(r, dict) else []
                if r == arn:
                    literal.append(f"arn:aws:s3:::{bucket}")
                elif len(parts) == 2 and parts[0] == arn:
                    literal.append(f"arn:aws:s3:::{bucket}{parts[1]}")
            if literal:
                out.append({"Effect": st["Effect"], "Action": st["Action"], "Resource": literal})
    return out


def _user(iam: Any, name: str, statements: list[dict[str, Any]]) -> dict[str, str]:
    """An IAM user of moto with ``statements`` plus everything outside S3; its credentials."""
    doc = {"Version": "2012-10-17", "Statement": [*statements]}
    doc["Statement"].append({"Effect": "Allow", "Action": _NOT_S3, "Resource": "*"})
    iam.create_user(UserName=name)
    iam.put_user_policy(UserName=name, PolicyName="p", PolicyDocument=json.dumps(doc))
    key = iam.create_access_key(UserName=name)["AccessKey"]
    return {
        "AWS_ACCESS_KEY_ID": key["AccessKeyId"],
        "AWS_SECRET_ACCESS_KEY": key["SecretAccessKey"],
    }


def test_synthesized_bucket_rights_are_enough_for_the_api_and_the_batch_functions(
    ecs: Any, clean_env: pytest.MonkeyPatch
) -> None:
    """moto with IAM enforced (``enable_iam_authentication``): each function runs as a principal
    holding exactly its role's synthesized bucket statements, through a large job input, an
    upload (the PUT its URL signs), a file made from it, a batch expanded (large line inputs),
    its lines ended (one output in S3), counted and finalized, the output file read and a file
    deleted. Any S3 call outside its grants fails with AccessDenied and the flow with it."""
    import boto3
    from moto import mock_aws
    from moto.core import enable_iam_authentication

    from asyncinfer.aws import clients
    from asyncinfer.aws.payloads import PayloadStore, split_uri
    from asyncinfer.core import envvars as ev
    from asyncinfer.core.settings import Settings
    from asyncinfer.jobs.events import EventPublisher
    from asyncinfer.jobs.store import JobStore
    from asyncinfer.local.resources import create_resources
    from asyncinfer.models.registry import MODELS
    from tests.conftest import ApiCaller, apply_env
    from tests.unit.batch_helpers import chat_line, line_jobs, run_batch_queue, run_events

    monkeypatch = clean_env
    with mock_aws():
        res = create_resources(Settings(visibility_timeout_seconds=30), list(MODELS))
        apply_env(monkeypatch, {**res.env(), "ASYNCINFER_LOCAL": "0", ev.INLINE_INPUT_BYTES: "64"})
        bucket = Settings.from_env().bucket
        iam = boto3.client("iam", region_name="us-east-1")
        users = {
            "api": _user(iam, "api", _bucket_statements(ecs, API, bucket)),
            "expander": _user(iam, "expander", _bucket_statements(ecs, EXPANDER, bucket)),
            "counter": _user(iam, "counter", _bucket_statements(ecs, COUNTER, bucket)),
            "admin": _user(iam, "admin", [{"Effect": "Allow", "Action": "*", "Resource": "*"}]),
        }

        def act_as(name: str) -> Settings:
            apply_env(monkeypatch, users[name])
            return Settings.from_env()

        with enable_iam_authentication():
            act_as("api")
            call = ApiCaller("tenant-a")
            status, job, _ = call("POST", "/v1/jobs", {"model": "echo", "input": {"x": "y" * 200}})
            assert status == 202, job
            status, up, _ = call("POST", "/v1/uploads")
            assert status == 201, up
            lines = [json.dumps(chat_line(f"line-{i}-{'z' * 100}")) for i in range(3)]
            up_bucket, up_key = split_uri(up["input_url"])
            # What the presigned PUT does, signed by the API's principal.
            clients.client("s3").put_object(
                Bucket=up_bucket, Key=up_key, Body="\n".join(lines).encode() + b"\n"
            )
            body = {"purpose": "batch", "input_url": up["input_url"], "filename": "in.jsonl"}
            status, file, _ = call("POST", "/openai/v1/files", body)
            assert status == 200, file
            status, listed, _ = call("GET", "/openai/v1/files")
            assert status == 200 and [f["id"] for f in listed["data"]] == [file["id"]], listed
            status, batch, _ = call(
                "POST",
                "/openai/v1/batches",
                {"input_file_id": file["id"], "endpoint": "/v1/chat/completions"},
            )
            assert status == 200, batch

            assert run_batch_queue(act_as("expander")) >= 1

            settings = act_as("admin")  # the workers: end each line job, one output in S3
            store, payloads = JobStore(settings), PayloadStore(settings)
            records = [r for r in line_jobs(settings, "tenant-a") if r["job_id"] != job["id"]]
            assert len(records) == 3
            assert all(r.get("input_ref", "").startswith(f"s3://{bucket}/inputs/") for r in records)
            for i, rec in enumerate(records):
                running = store.transition(
                    rec["job_id"],
                    from_status="queued",
                    to_status="running",
                    increment_attempts=True,
                )
                output = {"text": "ok", "usage": {"prompt_tokens": 1, "completion_tokens": 1}}
                fields: dict[str, Any] = {"completed_at": running["created_at"]}
                if i == 0:
                    data = json.dumps(output).encode()
                    fields["output_ref"] = payloads.put_output("tenant-a", rec["job_id"], data)
                else:
                    fields["output"] = json.dumps(output)
                ended = store.transition(
                    rec["job_id"],
                    from_status="running",
                    to_status="succeeded",
                    attempts=running["attempts"],
                    set_fields=fields,
                )
                EventPublisher(settings).publish(ended)

            run_events(act_as("counter"))

            act_as("api")
            status, done, _ = call("GET", f"/openai/v1/batches/{batch['id']}")
            assert status == 200 and done["status"] == "completed", done
            assert done["request_counts"]["completed"] == 3, done
            status, content, _ = call("GET", f"/openai/v1/files/{done['output_file_id']}/content")
            assert status == 200 and content, content
            status, gone, _ = call("DELETE", f"/openai/v1/files/{file['id']}")
            assert status == 200 and gone["deleted"] is True, gone
