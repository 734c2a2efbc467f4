"""A bound on each tenant's concurrent long polls (``?wait=``), shared through the job table
(issue 14, behaviour 7): one more is 429 ``rate_limited`` at once, other tenants and plain reads
are not limited, and a slot a dead Lambda never gave back ends with its lease."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from asyncinfer.core.settings import Settings
from asyncinfer.functions.api.app import service
from asyncinfer.jobs import waits
from asyncinfer.jobs.waits import WaitSlots
from asyncinfer.local.resources import Resources
from tests.conftest import ApiCaller, apply_env


@pytest.fixture
def bound2(resources: Resources, clean_env: pytest.MonkeyPatch) -> Resources:
    apply_env(clean_env, {"ASYNCINFER_MAX_WAITS_PER_TENANT": "2"})
    return resources


def queued_job(api: ApiCaller, key_id: str = "tenant-a") -> str:
    status, resp, _ = api("POST", "/v1/jobs", {"model": "echo", "input": {}}, key_id=key_id)
    assert status == 202, resp
    return str(resp["id"])


def test_a_wait_past_the_tenants_bound_is_429_at_once(api: ApiCaller, bound2: Resources) -> None:
    job = queued_job(api)
    slots = service().waits
    held = [slots.acquire("tenant-a", 20), slots.acquire("tenant-a", 20)]  # two Lambdas waiting
    t0 = time.monotonic()
    status, resp, headers = api("GET", f"/v1/jobs/{job}?wait=5")
    assert time.monotonic() - t0 < 3
    assert status == 429, resp
    assert resp["error"]["code"] == "rate_limited"
    assert resp["error"]["details"][0]["field"] == "wait"
    assert int(headers["retry-after"]) >= 1
    # A read without wait is not limited, nor is another tenant's wait.
    assert api("GET", f"/v1/jobs/{job}")[0] == 200
    other = queued_job(api, "tenant-b")
    assert api("GET", f"/v1/jobs/{other}?wait=0.2", key_id="tenant-b")[0] == 200
    # A slot given back is free again.
    slots.release("tenant-a", held[0])
    assert api("GET", f"/v1/jobs/{job}?wait=0.2")[0] == 200


def test_concurrent_waits_beyond_the_bound_are_refused(api: ApiCaller, bound2: Resources) -> None:
    job = queued_job(api)
    statuses: list[int] = []

    def poll() -> None:
        statuses.append(api("GET", f"/v1/jobs/{job}?wait=3")[0])

    threads = [threading.Thread(target=poll) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert sorted(statuses) == [200, 200, 429, 429]
    # Every slot was given back: the next waits run.
    assert [api("GET", f"/v1/jobs/{job}?wait=0.2")[0] for _ in range(3)] == [200] * 3


def test_a_slot_a_dead_lambda_kept_ends_with_its_lease(
    api: ApiCaller, bound2: Resources, monkeypatch: pytest.MonkeyPatch
) -> None:
    job = queued_job(api)
    slots = service().waits
    real = time.time
    monkeypatch.setattr(waits.time, "time", lambda: real() - 3600)  # taken an hour ago
    slots.acquire("tenant-a", 20)
    slots.acquire("tenant-a", 20)
    monkeypatch.setattr(waits.time, "time", real)
    assert api("GET", f"/v1/jobs/{job}?wait=0.2")[0] == 200
    live = slots.acquire("tenant-a", 20)  # the lapsed slots were dropped, this one is new
    assert api("GET", f"/v1/jobs/{job}?wait=0.2")[0] == 200
    slots.acquire("tenant-a", 20)
    assert api("GET", f"/v1/jobs/{job}?wait=0.2")[0] == 429
    slots.release("tenant-a", live)
    assert api("GET", f"/v1/jobs/{job}?wait=0.2")[0] == 200


def test_no_slot_for_an_unknown_or_finished_job(api: ApiCaller, bound2: Resources) -> None:
    job = queued_job(api)
    slots = service().waits
    slots.acquire("tenant-a", 20)
    slots.acquire("tenant-a", 20)
    assert api("GET", "/v1/jobs/job_01JABCDEFGHJKMNPQRSTVWXYZ0?wait=2")[0] == 404
    assert api("POST", f"/v1/jobs/{job}/cancel")[0] == 200
    status, resp, _ = api("GET", f"/v1/jobs/{job}?wait=2")
    assert status == 200 and resp["status"] == "cancelled"


def test_the_bound_is_a_setting_and_zero_means_none(settings: Settings) -> None:
    assert Settings().max_waits_per_tenant == 10
    env = {"ASYNCINFER_MAX_WAITS_PER_TENANT": "3"}
    assert Settings.from_env(env).max_waits_per_tenant == 3

    class NoTable:
        def __getattr__(self, name: str) -> Any:
            raise AssertionError(f"{name} called with no bound")

    with WaitSlots(NoTable(), "t", 0).held("tenant-a", 20):
        pass


def test_the_slot_item_stays_out_of_the_tenants_listing(api: ApiCaller, bound2: Resources) -> None:
    job = queued_job(api)
    service().waits.acquire("tenant-a", 20)
    status, resp, _ = api("GET", "/v1/jobs")
    assert status == 200 and [j["id"] for j in resp["jobs"]] == [job]
