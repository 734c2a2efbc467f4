"""SQS fair queues (issue 14, behaviour 7): every job message carries its tenant as the
``MessageGroupId`` on the standard job queues.

moto (5.2.5) accepts and keeps a ``MessageGroupId`` on a standard queue and hands it back as a
message system attribute, but does not reorder deliveries by group as SQS does; these tests show
that the sends carry the group, not SQS's fair delivery itself."""

from __future__ import annotations

from typing import Any

from asyncinfer.aws import clients
from asyncinfer.core.settings import Settings
from asyncinfer.functions import sweeper
from asyncinfer.jobs.messages import JobMessage, message_group_id
from asyncinfer.local.resources import Resources
from tests.conftest import ApiCaller


def groups(res: Resources, model: str = "echo") -> list[tuple[str, str | None]]:
    """``(tenant in the body, MessageGroupId)`` of each message waiting in ``model``'s queue."""
    out = clients.client("sqs").receive_message(
        QueueUrl=res.queues[model],
        MaxNumberOfMessages=10,
        MessageSystemAttributeNames=["MessageGroupId"],
    )
    return [
        (
            JobMessage.model_validate_json(m["Body"]).tenant,
            m.get("Attributes", {}).get("MessageGroupId"),
        )
        for m in out.get("Messages", [])
    ]


def test_each_submitted_job_message_is_in_its_tenants_group(
    api: ApiCaller, resources: Resources
) -> None:
    for tenant in ("tenant-a", "tenant-b", "tenant-a"):
        status, resp, _ = api("POST", "/v1/jobs", {"model": "echo", "input": {}}, key_id=tenant)
        assert status == 202, resp
    got = groups(resources)
    assert sorted(got) == [("tenant-a", "tenant-a")] * 2 + [("tenant-b", "tenant-b")]


def test_the_job_queues_stay_standard(resources: Resources) -> None:
    sqs = clients.client("sqs")
    for url in resources.queues.values():
        attrs = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
        assert attrs.get("FifoQueue", "false") == "false"
        assert not url.endswith(".fifo")


def test_a_message_the_sweeper_sends_again_keeps_the_tenants_group(
    resources: Resources, settings: Settings, monkeypatch: Any
) -> None:
    sent: list[dict[str, Any]] = []
    sqs = clients.client("sqs")
    monkeypatch.setattr(sqs, "send_message", lambda **kw: sent.append(kw))
    record = {
        "job_id": "job_01JABCDEFGHJKMNPQRSTVWXYZ0",
        "tenant": "tenant-b",
        "model": "echo",
        "status": "running",
        "attempts": 1,
        "priority": "normal",
        "expires_at": "2030-01-01T00:00:00.000Z",
        "timeout_seconds": 60,
        "input_ref": "s3://b/k",
        "inference_id": "i-1",
        "lease_until": 1,
    }
    store = sweeper.JobStore(settings)
    monkeypatch.setattr(store, "get", lambda job_id: record)
    monkeypatch.setattr(sweeper.leases, "take_back", lambda *a, **k: record)
    sweeper._take_back_one(store, sqs, settings, record["job_id"], 10**10)
    assert [kw["MessageGroupId"] for kw in sent] == ["tenant-b"]


def test_a_tenant_sqs_would_refuse_as_a_group_id_is_hashed() -> None:
    assert message_group_id("AbC123xyz9") == "AbC123xyz9"
    assert message_group_id("a-b_c.d:e") == "a-b_c.d:e"
    for odd in ("x" * 129, "tenant with spaces", "tënant", ""):
        gid = message_group_id(odd)
        assert gid.startswith("t-") and len(gid) == 42
        assert gid == message_group_id(odd)
    assert message_group_id("a b") != message_group_id("a c")
