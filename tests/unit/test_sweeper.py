"""The expiry sweeper: queued jobs past their TTL expire without a worker or a read."""

from __future__ import annotations

import time

import pytest

import asyncinfer.functions.sweeper as sweeper
from asyncinfer.core.settings import Settings
from asyncinfer.functions.api.schemas import JobRequest
from asyncinfer.jobs.service import JobService
from asyncinfer.jobs.store import JobStore


def submit(settings: Settings, ttl: int) -> str:
    job, _ = JobService(settings).submit("t", JobRequest(model="echo", input={}, ttl_seconds=ttl))
    return str(job["id"])


def later(monkeypatch: pytest.MonkeyPatch, seconds: float) -> None:
    real = time.time
    monkeypatch.setattr(sweeper.time, "time", lambda: real() + seconds)


def test_queued_job_past_ttl_expires(settings: Settings, monkeypatch: pytest.MonkeyPatch) -> None:
    due = submit(settings, ttl=10)
    not_due = submit(settings, ttl=3600)
    assert sweeper.expire_due(settings) == []
    later(monkeypatch, 11)
    assert sweeper.expire_due(settings) == [due]
    store = JobStore(settings)
    rec = store.get(due)
    assert rec is not None and rec["status"] == "expired"
    assert rec["error"]["code"] == "expired"
    assert "queued_mark" not in rec
    assert store.get(not_due)["status"] == "queued"  # type: ignore[index]
    assert sweeper.expire_due(settings) == []  # idempotent


def test_neither_a_running_job_nor_one_handed_back_after_it_started_expires(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Issue 14: ``expired`` is only for jobs that never started; a job handed back after its TTL
    # passed is retried (or failed) by the normal rules. (This test asserted the opposite for the
    # handed-back job before the issue.)
    store = JobStore(settings)
    job_id = submit(settings, ttl=10)
    store.transition(job_id, from_status="queued", to_status="running", increment_attempts=True)
    later(monkeypatch, 11)
    assert sweeper.expire_due(settings) == []
    store.transition(job_id, from_status="running", to_status="queued", attempts=1)
    assert sweeper.expire_due(settings) == []
    assert store.expire(job_id) is None
    rec = store.get(job_id)
    assert rec is not None and rec["status"] == "queued" and "queued_mark" not in rec
