"""Job records: every status change is a conditional write on status and attempt."""

from __future__ import annotations

import pytest

from asyncinfer import lifecycle
from asyncinfer.errors import TransitionRefused
from asyncinfer.settings import Settings
from asyncinfer.store import JobStore


def new_job(store: JobStore, job_id: str = "job_01ARZ3NDEKTSV4RRFFQ69G5FAV") -> str:
    store.create(
        {
            "job_id": job_id,
            "tenant": "t",
            "model": "echo",
            "status": "queued",
            "attempts": 0,
            "created_at": "2026-11-30T00:00:00.000Z",
            "expires_at": "2026-12-01T00:00:00.000Z",
            "timeout_seconds": 900,
        }
    )
    return job_id


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
