"""Job records: every status change is a conditional write on status and attempt."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
from botocore.exceptions import ClientError

from asyncinfer.core import lifecycle
from asyncinfer.core.errors import TransitionRefused
from asyncinfer.core.settings import Settings
from asyncinfer.jobs import transact as transact_module
from asyncinfer.jobs import writer as store_module
from asyncinfer.jobs.store import JobStore, Transition
from tests.unit.helpers import count_calls, new_job


def start(store: JobStore, job_id: str) -> dict:
    return store.transition(
        job_id, from_status="queued", to_status="running", increment_attempts=True
    )


def test_lifecycle_table_matches_the_spec() -> None:
    for terminal in lifecycle.TERMINAL:
        assert lifecycle.ALLOWED[terminal] == frozenset()
    assert lifecycle.is_allowed("queued", "running")
    assert lifecycle.is_allowed("running", "queued")
    assert not lifecycle.is_allowed("queued", "succeeded")
    assert not lifecycle.is_allowed("succeeded", "running")


def test_start_increments_attempts(settings: Settings) -> None:
    store = JobStore(settings)
    jid = new_job(store)
    assert start(store, jid)["attempts"] == 1
    store.transition(jid, from_status="running", to_status="queued", attempts=1)
    assert start(store, jid)["attempts"] == 2


def test_late_running_update_after_succeeded_is_refused(settings: Settings) -> None:
    store = JobStore(settings)
    jid = new_job(store)
    start(store, jid)
    store.transition(
        jid, from_status="running", to_status="succeeded", attempts=1, set_fields={"output": "{}"}
    )
    with pytest.raises(TransitionRefused) as info:
        store.transition(jid, from_status="queued", to_status="running", increment_attempts=True)
    assert info.value.current is not None
    assert info.value.current["status"] == "succeeded"
    with pytest.raises(TransitionRefused):
        store.transition(jid, from_status="running", to_status="failed", attempts=1)
    assert store.get(jid)["status"] == "succeeded"  # type: ignore[index]


def test_write_from_an_earlier_attempt_is_refused(settings: Settings) -> None:
    store = JobStore(settings)
    jid = new_job(store)
    start(store, jid)  # attempt 1, then its worker is lost
    store.transition(jid, from_status="running", to_status="queued", attempts=1)
    start(store, jid)  # attempt 2
    with pytest.raises(TransitionRefused):
        store.transition(jid, from_status="running", to_status="succeeded", attempts=1)
    done = store.transition(jid, from_status="running", to_status="succeeded", attempts=2)
    assert done["status"] == "succeeded" and done["attempts"] == 2


def test_duplicate_terminal_update_is_refused(settings: Settings) -> None:
    store = JobStore(settings)
    jid = new_job(store)
    start(store, jid)
    store.transition(jid, from_status="running", to_status="failed", attempts=1)
    with pytest.raises(TransitionRefused):
        store.transition(jid, from_status="running", to_status="failed", attempts=1)


def test_missing_job_is_refused_with_no_current(settings: Settings) -> None:
    store = JobStore(settings)
    with pytest.raises(TransitionRefused) as info:
        start(store, "job_01ARZ3NDEKTSV4RRFFQ69G5FAV")
    assert info.value.current is None


def test_illegal_transition_is_a_programming_error(settings: Settings) -> None:
    store = JobStore(settings)
    jid = new_job(store)
    with pytest.raises(ValueError, match="lifecycle"):
        store.transition(jid, from_status="queued", to_status="succeeded")


def test_update_fields_only_while_in_status(settings: Settings) -> None:
    store = JobStore(settings)
    jid = new_job(store)
    assert not store.update_fields(jid, status="running", attempts=None, set_fields={"x": 1})
    start(store, jid)
    assert store.update_fields(jid, status="running", attempts=1, set_fields={"x": 1})
    assert not store.update_fields(jid, status="running", attempts=2, set_fields={"x": 2})
    assert store.get(jid)["x"] == 1  # type: ignore[index]


def test_progress_writes_in_one_transaction_report_refused_jobs(settings: Settings) -> None:
    store = JobStore(settings)
    ids = [new_job(store, f"job_01ARZ3NDEKTSV4RRFFQ69G5FA{c}") for c in "ABC"]
    for jid in ids:
        start(store, jid)
    store.update_fields(ids[1], status="running", attempts=1, set_fields={"cancel_requested": True})
    store.transition(ids[2], from_status="running", to_status="succeeded", attempts=1)
    refused = store.update_fields_many(
        [(jid, 1, {"progress_tokens": 7}) for jid in ids],
        status="running",
        unless="cancel_requested",
    )
    assert refused == {ids[1], ids[2]}
    assert store.get(ids[0])["progress_tokens"] == 7  # type: ignore[index]
    assert "progress_tokens" not in store.get(ids[1])  # type: ignore[operator]
    assert "progress_tokens" not in store.get(ids[2])  # type: ignore[operator]


# ---------------------------------------------------------------------- transitions in batches
def running(job_id: str, started_at: str = "2026-11-30T00:00:01.000Z") -> Transition:
    return Transition(
        job_id,
        from_status="queued",
        to_status="running",
        attempts=0,
        increment_attempts=True,
        set_fields={"started_at": started_at},
        remove_fields=("completed_at", "progress_tokens", "output"),
    )


def succeeded(job_id: str, attempts: int = 1, output: str = '{"ok":true}') -> Transition:
    return Transition(
        job_id,
        from_status="running",
        to_status="succeeded",
        attempts=attempts,
        set_fields={"completed_at": "2026-11-30T00:00:02.000Z", "output": output},
    )


IDS = [f"job_01ARZ3NDEKTSV4RRFFQ69G5F{c}{d}" for c in "ABCD" for d in "ABCDEFGHJKMNPQRS"]


def test_a_batch_is_marked_running_in_one_call(settings: Settings) -> None:
    store = JobStore(settings)
    ids = [new_job(store, j) for j in IDS[:5]]
    before = {j: store.get(j) for j in ids}
    calls = count_calls(store.ddb)
    outcomes = store.transition_many([running(j) for j in ids])
    assert outcomes == [None] * 5
    assert calls == Counter({"TransactWriteItems": 1})
    for j in ids:
        rec = store.get(j)
        assert rec is not None
        assert rec["status"] == "running" and rec["attempts"] == 1
        # What the caller knows of the record without reading it back is the record.
        assert running(j).applied_to(before[j]) == rec  # type: ignore[arg-type]


def test_terminal_records_of_a_batch_in_one_call_with_starts(settings: Settings) -> None:
    store = JobStore(settings)
    done = [new_job(store, j) for j in IDS[:3]]
    todo = [new_job(store, j) for j in IDS[3:6]]
    for j in done:
        start(store, j)
    calls = count_calls(store.ddb)
    outcomes = store.transition_many([succeeded(j) for j in done] + [running(j) for j in todo])
    assert outcomes == [None] * 6
    assert calls == Counter({"TransactWriteItems": 1})
    assert [store.get(j)["status"] for j in done] == ["succeeded"] * 3  # type: ignore[index]
    assert [store.get(j)["status"] for j in todo] == ["running"] * 3  # type: ignore[index]


def test_one_refused_item_is_reported_and_the_others_are_written(settings: Settings) -> None:
    """A transaction is all or nothing: DynamoDB cancels it for the one job that was cancelled
    while queued; that job is refused with its current record, the rest go in a second call."""
    store = JobStore(settings)
    ids = [new_job(store, j) for j in IDS[:4]]
    store.transition(ids[2], from_status="queued", to_status="cancelled")
    calls = count_calls(store.ddb)
    outcomes = store.transition_many([running(j) for j in ids])
    assert calls == Counter({"TransactWriteItems": 2})
    assert [o is None for o in outcomes] == [True, True, False, True]
    refused = outcomes[2]
    assert isinstance(refused, TransitionRefused)
    assert refused.current is not None and refused.current["status"] == "cancelled"
    assert store.get(ids[2])["status"] == "cancelled"  # type: ignore[index]
    assert [store.get(j)["attempts"] for j in ids] == [1, 1, 0, 1]  # type: ignore[index]


def test_a_late_write_is_still_refused_in_a_batch(settings: Settings) -> None:
    """Attempt 1's worker was lost and attempt 2 runs: attempt 1's terminal write, batched with
    another job's, is refused; the other job's is applied."""
    store = JobStore(settings)
    lost, other = new_job(store, IDS[0]), new_job(store, IDS[1])
    start(store, lost)
    store.transition(lost, from_status="running", to_status="queued", attempts=1)
    start(store, lost)  # attempt 2
    start(store, other)
    outcomes = store.transition_many([succeeded(lost, attempts=1), succeeded(other)])
    assert isinstance(outcomes[0], TransitionRefused)
    assert outcomes[1] is None
    rec = store.get(lost)
    assert rec is not None and rec["status"] == "running" and rec["attempts"] == 2
    # ...and a start that assumed the first attempt is refused too.
    taken, free = new_job(store, IDS[2]), new_job(store, IDS[3])
    start(store, taken)
    outcomes = store.transition_many([running(taken), running(free)])
    assert isinstance(outcomes[0], TransitionRefused) and outcomes[1] is None


def test_a_start_that_assumed_the_wrong_attempt_is_refused(settings: Settings) -> None:
    store = JobStore(settings)
    jid = new_job(store, IDS[0])
    start(store, jid)
    store.transition(jid, from_status="running", to_status="queued", attempts=1)
    other = new_job(store, IDS[1])
    outcomes = store.transition_many([running(jid), running(other)])
    assert isinstance(outcomes[0], TransitionRefused)
    assert outcomes[0].current is not None and outcomes[0].current["attempts"] == 1
    assert outcomes[1] is None


def test_transaction_limits_cut_calls(settings: Settings, monkeypatch: Any) -> None:
    """At most 100 items a call, and about TRANSACT_BUDGET_BYTES of items (DynamoDB allows
    4 MB)."""
    store = JobStore(settings)
    ids = [new_job(store, f"job_01ARZ3NDEKTSV4RRFFQ69G{n:04d}") for n in range(150)]
    calls = count_calls(store.ddb)
    assert store.transition_many([running(j) for j in ids]) == [None] * 150
    assert calls == Counter({"TransactWriteItems": 2})
    monkeypatch.setattr(
        transact_module, "TRANSACT_BUDGET_BYTES", 3 * (transact_module.ITEM_BASE_BYTES + 4000)
    )
    big = "x" * 3000
    calls.clear()
    outcomes = store.transition_many([succeeded(j, output=big) for j in ids[:9]])
    assert outcomes == [None] * 9
    assert calls == Counter({"TransactWriteItems": 3})


def test_one_item_is_written_alone(settings: Settings) -> None:
    store = JobStore(settings)
    jid = new_job(store, IDS[0])
    calls = count_calls(store.ddb)
    assert store.transition_many([running(jid)]) == [None]
    assert calls == Counter({"UpdateItem": 1})


def test_the_same_job_twice_or_an_illegal_transition_is_a_programming_error(
    settings: Settings,
) -> None:
    store = JobStore(settings)
    jid = new_job(store, IDS[0])
    with pytest.raises(ValueError, match="twice"):
        store.transition_many([running(jid), succeeded(jid)])
    with pytest.raises(ValueError, match="lifecycle"):
        store.transition_many(
            [Transition(jid, from_status="queued", to_status="succeeded"), running(IDS[1])]
        )


def test_conflicting_items_are_sent_again(settings: Settings, monkeypatch: Any) -> None:
    """DynamoDB cancels a transaction that meets another on an item (TransactionConflict):
    nothing was refused, so every item goes again in the next call."""
    store = JobStore(settings)
    ids = [new_job(store, j) for j in IDS[:2]]
    real = store.ddb.transact_write_items
    seen = []

    def flaky(**kwargs: Any) -> Any:
        seen.append(kwargs)
        if len(seen) == 1:
            raise ClientError(
                {
                    "Error": {"Code": "TransactionCanceledException", "Message": "conflict"},
                    "CancellationReasons": [{"Code": "TransactionConflict"}, {"Code": "None"}],
                },
                "TransactWriteItems",
            )
        return real(**kwargs)

    monkeypatch.setattr(store.ddb, "transact_write_items", flaky)
    assert store.transition_many([running(j) for j in ids]) == [None, None]
    assert len(seen) == 2
    assert [store.get(j)["status"] for j in ids] == ["running"] * 2  # type: ignore[index]


def test_a_failed_call_that_committed_is_not_a_refusal(
    settings: Settings, monkeypatch: Any
) -> None:
    """The transaction commits but its answer is lost (an AWS fault after botocore's retries):
    the store writes each item alone, and a refusal by a record that already shows the very
    write is reported as applied."""
    store = JobStore(settings)
    ids = [new_job(store, j) for j in IDS[:2]]
    real = store.ddb.transact_write_items

    def commits_then_fails(**kwargs: Any) -> Any:
        real(**kwargs)
        raise ClientError(
            {"Error": {"Code": "InternalServerError", "Message": "lost"}}, "TransactWriteItems"
        )

    monkeypatch.setattr(store.ddb, "transact_write_items", commits_then_fails)
    assert store.transition_many([running(j) for j in ids]) == [None, None]
    assert [store.get(j)["attempts"] for j in ids] == [1, 1]  # type: ignore[index]


def test_a_write_that_meets_a_transaction_is_sent_again(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cancel (plain UpdateItem) that meets the worker's TransactWriteItems on the same job
    gets TransactionConflictException from DynamoDB, which botocore does not retry: the store
    sends it again, and gives up (raises) only after CONFLICT_RETRIES more tries."""
    store = JobStore(settings)
    job_id = new_job(store)
    monkeypatch.setattr(store_module.time, "sleep", lambda s: None)
    real = store.ddb.update_item
    conflicts = [2]

    def update_item(**params: Any) -> Any:
        if conflicts[0]:
            conflicts[0] -= 1
            raise ClientError(
                {"Error": {"Code": "TransactionConflictException", "Message": "conflict"}},
                "UpdateItem",
            )
        return real(**params)

    monkeypatch.setattr(store.ddb, "update_item", update_item)
    done = store.transition(job_id, from_status=lifecycle.QUEUED, to_status=lifecycle.CANCELLED)
    assert done["status"] == lifecycle.CANCELLED and conflicts == [0]
    assert (
        store.update_fields(job_id, status=lifecycle.RUNNING, attempts=0, set_fields={"x": 1})
        is False
    )

    conflicts[0] = store_module.CONFLICT_RETRIES + 1
    other = new_job(store, "job_01ARZ3NDEKTSV4RRFFQ69G5FAW")
    with pytest.raises(ClientError):
        store.transition(other, from_status=lifecycle.QUEUED, to_status=lifecycle.CANCELLED)
    assert store.get(other)["status"] == lifecycle.QUEUED  # type: ignore[index]
