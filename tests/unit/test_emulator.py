"""The local stack's emulator patches (:mod:`asyncinfer.local.emulator`): moto's TransactWriteItems
keeps rollback copies of the items a call names instead of copies of whole tables, and behaves
as before (a cancelled
transaction leaves every table as it was, a successful one applies every item). The item lock's
test runs against the emulator's server: tests/integration/test_emulator_server.py."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

import boto3
import pytest
from botocore.exceptions import ClientError
from moto import mock_aws

from asyncinfer.local.emulator import patch_dynamodb


@pytest.fixture
def ddb() -> Iterator[Any]:
    assert patch_dynamodb()
    assert patch_dynamodb()  # idempotent
    with mock_aws():
        client = boto3.client("dynamodb", region_name="us-east-1")
        for name in ("jobs", "other"):
            client.create_table(
                TableName=name,
                KeySchema=[{"AttributeName": "id", "KeyType": "HASH"}],
                AttributeDefinitions=[{"AttributeName": "id", "AttributeType": "S"}],
                BillingMode="PAY_PER_REQUEST",
            )
            for i in range(20):
                client.put_item(
                    TableName=name, Item={"id": {"S": f"j{i}"}, "status": {"S": "running"}}
                )
        yield client


def _update(table: str, i: int, status: str = "running") -> dict[str, Any]:
    return {
        "Update": {
            "TableName": table,
            "Key": {"id": {"S": f"j{i}"}},
            "UpdateExpression": "SET progress_tokens = :n",
            "ConditionExpression": "#s = :s",
            "ExpressionAttributeNames": {"#s": "status"},
            "ExpressionAttributeValues": {":n": {"N": str(i)}, ":s": {"S": status}},
        }
    }


def _progress(ddb: Any, table: str) -> dict[str, str | None]:
    items = ddb.scan(TableName=table)["Items"]
    return {it["id"]["S"]: it.get("progress_tokens", {}).get("N") for it in items}


def test_a_call_copies_only_the_items_it_names(ddb: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """No whole-table copy per call (it grew with the table: a 2,000-line batch's ~6,000 items
    copied by every job's start and end); only the items the call names are copied."""
    from moto.dynamodb.models.dynamo_type import Item
    from moto.dynamodb.models.table import Table

    tables: list[str] = []
    items: list[str] = []
    real = copy.deepcopy

    def counting(obj: Any, memo: Any = None) -> Any:
        if isinstance(obj, Table):
            tables.append(obj.name)
        elif isinstance(obj, Item):
            items.append(str(obj.hash_key.value))
        return real(obj, memo)

    monkeypatch.setattr(copy, "deepcopy", counting)
    ddb.transact_write_items(
        TransactItems=[_update("jobs", i) for i in range(10)]
        + [_update("other", i) for i in range(5)]
    )
    assert tables == []
    assert set(items) == {f"j{i}" for i in range(10)}  # j10..j19 are never copied
    assert _progress(ddb, "jobs") == {f"j{i}": (str(i) if i < 10 else None) for i in range(20)}


def test_a_cancelled_call_takes_back_its_puts_and_deletes(ddb: Any) -> None:
    before = _progress(ddb, "jobs")
    items: list[dict[str, Any]] = [
        {"Put": {"TableName": "jobs", "Item": {"id": {"S": "new"}, "status": {"S": "queued"}}}},
        {"Put": {"TableName": "jobs", "Item": {"id": {"S": "j3"}, "status": {"S": "queued"}}}},
        {"Delete": {"TableName": "jobs", "Key": {"id": {"S": "j4"}}}},
        _update("jobs", 5),
        _update("jobs", 9, status="succeeded"),  # its condition fails
    ]
    with pytest.raises(ClientError) as err:
        ddb.transact_write_items(TransactItems=items)
    assert err.value.response["Error"]["Code"] == "TransactionCanceledException"
    assert _progress(ddb, "jobs") == before
    status = {it["id"]["S"]: it["status"]["S"] for it in ddb.scan(TableName="jobs")["Items"]}
    assert "new" not in status and status["j3"] == "running" and status["j4"] == "running"
    # What other calls wrote before stays: the snapshot shares the items no call named.
    ddb.put_item(TableName="jobs", Item={"id": {"S": "later"}, "status": {"S": "queued"}})
    with pytest.raises(ClientError):
        ddb.transact_write_items(TransactItems=[_update("jobs", 9, status="succeeded")])
    assert ddb.get_item(TableName="jobs", Key={"id": {"S": "later"}}).get("Item")


def test_cancelled_transaction_rolls_back_every_table(ddb: Any) -> None:
    before = (_progress(ddb, "jobs"), _progress(ddb, "other"))
    items = [_update("jobs", i) for i in range(8)] + [_update("other", 0)]
    items.append(_update("jobs", 9, status="succeeded"))  # its condition fails
    with pytest.raises(ClientError) as err:
        ddb.transact_write_items(TransactItems=items)
    assert err.value.response["Error"]["Code"] == "TransactionCanceledException"
    reasons = [r["Code"] for r in err.value.response["CancellationReasons"]]
    assert reasons == ["None"] * 9 + ["ConditionalCheckFailed"]
    assert (_progress(ddb, "jobs"), _progress(ddb, "other")) == before
    # The next call works on the restored tables as usual.
    ddb.transact_write_items(TransactItems=[_update("jobs", 1)])
    assert _progress(ddb, "jobs")["j1"] == "1"


@pytest.fixture
def counted(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """One entry per count of a queue's visible messages (moto's walk over the whole queue)."""
    from moto.sqs.models import Queue

    calls: list[int] = []
    real = Queue.approximate_number_of_messages

    def counting(self: Any) -> int:
        calls.append(1)
        return int(real.fget(self))  # type: ignore[misc]

    monkeypatch.setattr(Queue, "approximate_number_of_messages", property(counting))
    return calls


def test_a_send_to_a_standard_queue_does_not_count_its_messages(counted: list[int]) -> None:
    from asyncinfer.local.emulator import patch_sqs_sends

    assert patch_sqs_sends()
    assert patch_sqs_sends()  # idempotent
    with mock_aws():
        sqs = boto3.client("sqs", region_name="us-east-1")
        url = sqs.create_queue(QueueName="q")["QueueUrl"]
        fifo = sqs.create_queue(
            QueueName="q.fifo",
            Attributes={"FifoQueue": "true", "ContentBasedDeduplication": "true"},
        )["QueueUrl"]
        entries = [{"Id": str(n), "MessageBody": f"m{n}", "MessageGroupId": "g"} for n in range(10)]
        sqs.send_message_batch(QueueUrl=url, Entries=entries)
        sqs.send_message(QueueUrl=url, MessageBody="one")
        assert counted == []  # no walk over the queue per message sent
        attrs = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
        assert attrs["ApproximateNumberOfMessages"] == "11" and counted
        # A FIFO queue still dedupes on content (its send reads the whole attributes).
        for _ in range(2):
            sqs.send_message(QueueUrl=fifo, MessageBody="same", MessageGroupId="g")
        got = sqs.receive_message(QueueUrl=fifo, MaxNumberOfMessages=10)["Messages"]
        assert [m["Body"] for m in got] == ["same"]


def test_receives_and_attribute_reads_walk_the_queue_once_at_most(
    counted: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A receive does not count the queue's messages for each message it hands out (moto's
    retention check computed every attribute: ~65% of the emulator's CPU with a 2,000-line
    batch queued), and one GetQueueAttributes call counts them once, not once per name."""
    from moto.sqs import models

    from asyncinfer.local.emulator import patch_sqs_reads

    assert patch_sqs_reads()
    assert patch_sqs_reads()  # idempotent
    with mock_aws():
        sqs = boto3.client("sqs", region_name="us-east-1")
        url = sqs.create_queue(QueueName="q", Attributes={"MessageRetentionPeriod": "60"})[
            "QueueUrl"
        ]
        sqs.send_message_batch(
            QueueUrl=url, Entries=[{"Id": str(n), "MessageBody": f"m{n}"} for n in range(10)]
        )
        got = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=5)["Messages"]
        assert len(got) == 5 and counted == []
        names = ["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"]
        attrs = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=names)["Attributes"]
        assert attrs == {
            "ApproximateNumberOfMessages": "5",
            "ApproximateNumberOfMessagesNotVisible": "5",
        }
        assert len(counted) == 1
        # The retention period still holds: past it, nothing is handed out.
        now = models.unix_time()
        monkeypatch.setattr(models, "unix_time", lambda *a: now + 61)
        assert not sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=5).get("Messages")
