"""Least privilege on the data bucket (issue 14, item 8): the API Lambda and the OpenAI batch
functions get object rights only on the prefixes they use (infra/components/bucket_access.py),
never s3:PutObject or s3:DeleteObject on the whole bucket; one test per function. And the
prefixes granted are the ones the code builds its keys under."""

from __future__ import annotations

import fnmatch
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
