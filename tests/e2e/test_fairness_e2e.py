"""Fairness on the local stack (issue 14, behaviour 7): the local stack enforces the same bound
on a tenant's concurrent ``?wait=`` long polls as the API in AWS (429 ``rate_limited``)."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from unittest import mock

import pytest

from tests.e2e.conftest import LocalStackProcess, local_stack

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalStackProcess]:
    with (
        mock.patch.dict(os.environ, {"ASYNCINFER_MAX_WAITS_PER_TENANT": "2"}),
        local_stack(tmp_path_factory.mktemp("state"), "--models", "echo") as s,
    ):
        yield s


def test_waits_past_the_tenants_bound_get_429(stack: LocalStackProcess) -> None:
    with stack.client() as c:
        r = c.post("/v1/jobs", json={"model": "echo", "input": {"sleep_seconds": 30}})
        assert r.status_code == 202, r.text
        job = r.json()["id"]
    answers: list[tuple[int, dict, str | None]] = []

    def poll() -> None:
        with stack.client() as c:
            resp = c.get(f"/v1/jobs/{job}", params={"wait": 6}, timeout=60)
            answers.append((resp.status_code, resp.json(), resp.headers.get("retry-after")))

    threads = [threading.Thread(target=poll) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(90)
    assert sorted(a[0] for a in answers) == [200, 200, 429], answers
    refused = next(a for a in answers if a[0] == 429)
    assert refused[1]["error"]["code"] == "rate_limited"
    assert refused[2] is not None and int(refused[2]) >= 1
    # The slots were given back: the next wait runs.
    with stack.client() as c:
        assert c.get(f"/v1/jobs/{job}", params={"wait": 0.5}).status_code == 200
