"""The Lambda REQUEST authorizer: the key from either header, looked up among the enabled API
keys (moto in-process), answered as the usage identifier; 401 on /openai, Deny (403) on /v1."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import boto3
import pytest
from moto import mock_aws

from asyncinfer.aws import clients
from asyncinfer.openai_api import authorizer
from asyncinfer.openai_api.authorizer import KeyDirectory, authorize, load_keys

ARN = "arn:aws:execute-api:us-east-1:123456789012:abc/prod/GET/openai/v1/files"


@pytest.fixture
def keys(clean_env: pytest.MonkeyPatch) -> Iterator[dict[str, str]]:
    clean_env.setenv("AWS_DEFAULT_REGION", "us-east-1")
    with mock_aws():
        clients.reset()
        gw = boto3.client("apigateway", region_name="us-east-1")
        on = gw.create_api_key(name="a", value="secret-a-0123456789abcdef", enabled=True)
        gw.create_api_key(name="b", value="secret-b-0123456789abcdef", enabled=False)
        yield {"secret-a-0123456789abcdef": on["id"]}
        clients.reset()


def event(resource: str, headers: dict[str, str]) -> dict[str, Any]:
    return {"type": "REQUEST", "methodArn": ARN, "resource": resource, "headers": headers}


def test_bearer_and_x_api_key_map_to_the_key_and_its_id(keys: dict[str, str]) -> None:
    ((value, key_id),) = keys.items()
    directory = KeyDirectory(load_keys)
    for headers in ({"Authorization": f"Bearer {value}"}, {"x-api-key": value}):
        for resource in ("/openai/{proxy+}", "/v1/{proxy+}"):
            out = authorize(event(resource, headers), directory)
            assert out["usageIdentifierKey"] == value
            assert out["principalId"] == key_id and out["context"] == {"apiKeyId": key_id}
            stmt = out["policyDocument"]["Statement"][0]
            assert stmt["Effect"] == "Allow" and stmt["Resource"] == ARN


@pytest.mark.parametrize(
    "headers",
    [{}, {"Authorization": "Bearer wrong"}, {"x-api-key": "secret-b-0123456789abcdef"}],
)
def test_missing_wrong_or_disabled_key(keys: dict[str, str], headers: dict[str, str]) -> None:
    directory = KeyDirectory(load_keys)
    with pytest.raises(Exception, match=r"^Unauthorized$"):
        authorize(event("/openai/{proxy+}", headers), directory)
    out = authorize(event("/v1/{proxy+}", headers), directory)
    assert out["policyDocument"]["Statement"][0]["Effect"] == "Deny"
    assert "usageIdentifierKey" not in out


def test_key_list_is_cached_and_reloaded_for_an_unknown_key() -> None:
    now = [0.0]
    loads: list[float] = []
    table = {"k1": "id1"}

    def load() -> dict[str, str]:
        loads.append(now[0])
        return dict(table)

    d = KeyDirectory(load, clock=lambda: now[0])
    assert d.lookup("k1") == "id1" and d.lookup("k1") == "id1"
    assert loads == [0.0]
    table["k2"] = "id2"
    assert d.lookup("k2") is None  # a miss within MISS_REFRESH_SECONDS: no reload
    now[0] = authorizer.MISS_REFRESH_SECONDS
    assert d.lookup("k2") == "id2" and len(loads) == 2
    del table["k1"]
    now[0] += authorizer.KEY_CACHE_SECONDS
    assert d.lookup("k1") is None  # stale: reloaded, the deleted key is gone
