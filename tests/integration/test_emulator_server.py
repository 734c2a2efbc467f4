"""The local stack's emulator (``python -m asyncinfer.local.emulator``, moto server) under
concurrent requests: a TransactWriteItems that DynamoDB cancels must not wipe what other requests
wrote meanwhile (unpatched moto restores its pre-transaction copy of the table over them)."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

import boto3
import pytest
from botocore.exceptions import ClientError

from asyncinfer.local.emulator import start_emulator
from asyncinfer.local.stack import free_port, wait_http


@pytest.fixture(scope="module")
def endpoint() -> Iterator[str]:
    port = free_port()
    proc = start_emulator(port)
    url = f"http://127.0.0.1:{port}"
    wait_http(url + "/moto-api/", 30)
    yield url
    proc.terminate()
    try:
        proc.wait(timeout=5)
    except Exception:
        proc.kill()


def _client(endpoint: str) -> Any:
    return boto3.client(
        "dynamodb",
        endpoint_url=endpoint,
        region_name="us-east-1",
        aws_access_key_id="local",
        aws_secret_access_key="local",
    )


def test_cancelled_transactions_do_not_wipe_concurrent_writes(endpoint: str) -> None:
    ddb = _client(endpoint)
    ddb.create_table(
        TableName="jobs",
        KeySchema=[{"AttributeName": "id", "KeyType": "HASH"}],
        AttributeDefinitions=[{"AttributeName": "id", "AttributeType": "S"}],
        BillingMode="PAY_PER_REQUEST",
    )
    for i in range(64):
        ddb.put_item(TableName="jobs", Item={"id": {"S": f"j{i}"}, "status": {"S": "running"}})

    def update(i: int, status: str) -> dict[str, Any]:
        return {
            "Update": {
                "TableName": "jobs",
                "Key": {"id": {"S": f"j{i}"}},
                "UpdateExpression": "SET progress_tokens = :n",
                "ConditionExpression": "#s = :s",
                "ExpressionAttributeNames": {"#s": "status"},
                "ExpressionAttributeValues": {":n": {"N": str(i)}, ":s": {"S": status}},
            }
        }

    # The last item's condition fails: DynamoDB cancels the whole transaction.
    failing = [update(i, "running") for i in range(63)] + [update(63, "succeeded")]
    stop = threading.Event()

    def cancelled() -> None:
        client = _client(endpoint)
        while not stop.is_set():
            with contextlib.suppress(ClientError):
                client.transact_write_items(TransactItems=failing)

    threads = [threading.Thread(target=cancelled) for _ in range(2)]
    for t in threads:
        t.start()
    try:
        for i in range(100):
            ddb.put_item(TableName="jobs", Item={"id": {"S": f"new{i}"}, "status": {"S": "queued"}})
    finally:
        stop.set()
        for t in threads:
            t.join()
    ids = {it["id"]["S"] for it in ddb.scan(TableName="jobs")["Items"]}
    lost = {f"new{i}" for i in range(100)} - ids
    assert not lost, f"{len(lost)} acknowledged writes were lost"
