"""A Lambda SQS event source mapping for the local stack and tests: receive a batch from a queue,
hand it to a handler as an SQS event, delete the records the handler did not report failed
(``batchItemFailures``). The DLQ handler and the webhook dispatcher are fed this way locally,
as their event source mappings feed them in AWS, with the batch sizes of the topology
(:mod:`asyncinfer.core.topology`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def sqs_event_record(m: dict[str, Any], queue_url: str) -> dict[str, Any]:
    """An SQS Lambda event record for a received message (system and message attributes too)."""
    parts = queue_url.rstrip("/").split("/")
    attrs = {
        k: {
            "stringValue": v.get("StringValue"),
            "binaryValue": v.get("BinaryValue"),
            "stringListValues": [],
            "binaryListValues": [],
            "dataType": v.get("DataType", "String"),
        }
        for k, v in (m.get("MessageAttributes") or {}).items()
    }
    return {
        "messageId": m["MessageId"],
        "receiptHandle": m["ReceiptHandle"],
        "body": m["Body"],
        "attributes": m.get("Attributes", {}),
        "messageAttributes": attrs,
        "md5OfBody": m.get("MD5OfBody", ""),
        "eventSource": "aws:sqs",
        "eventSourceARN": f"arn:aws:sqs:us-east-1:{parts[-2]}:{parts[-1]}",
        "awsRegion": "us-east-1",
    }


def pump_once(
    sqs: Any,
    queue_url: str,
    invoke: Callable[[dict[str, Any]], dict[str, Any]],
    wait: int = 1,
    batch_size: int = 10,
) -> int:
    """Receive up to ``batch_size`` messages (1..10: one ReceiveMessage; the function's
    ``SqsTrigger.batch_size``), invoke the handler with them, delete the ones it did not report
    failed (those come back when their visibility timeout, set by the handler, ends). Returns
    how many were received."""
    resp = sqs.receive_message(
        QueueUrl=queue_url,
        MaxNumberOfMessages=batch_size,
        WaitTimeSeconds=wait,
        MessageSystemAttributeNames=["All"],
        MessageAttributeNames=["All"],
    )
    msgs = resp.get("Messages", [])
    if not msgs:
        return 0
    result = invoke({"Records": [sqs_event_record(m, queue_url) for m in msgs]}) or {}
    failed = {f["itemIdentifier"] for f in result.get("batchItemFailures", [])}
    done = [m for m in msgs if m["MessageId"] not in failed]
    if done:
        sqs.delete_message_batch(
            QueueUrl=queue_url,
            Entries=[
                {"Id": str(n), "ReceiptHandle": m["ReceiptHandle"]} for n, m in enumerate(done)
            ],
        )
    return len(msgs)
