"""Integration fixtures: a moto server on 127.0.0.1 (real HTTP, as the local stack uses), fresh
resources per test, and helpers to run real workers in threads or processes."""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from moto.server import ThreadedMotoServer

from asyncinfer.aws import clients
from asyncinfer.core.settings import Settings
from asyncinfer.functions.api.schemas import JobRequest
from asyncinfer.jobs.service import JobService
from asyncinfer.jobs.store import JobStore
from asyncinfer.local.resources import Resources, create_resources
from asyncinfer.local.stack import free_port
from asyncinfer.worker.runner import Worker
from tests.conftest import drain_events

_prefix = itertools.count()


@pytest.fixture(scope="session")
def moto_endpoint() -> Iterator[str]:
    """A moto server for the whole session: ``http://127.0.0.1:<port>``."""
    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    yield f"http://127.0.0.1:{port}"
    server.stop()


@dataclass
class Env:
    """One test's resources and settings on the moto server."""

    settings: Settings
    resources: Resources
    env: dict[str, str]

    @property
    def store(self) -> JobStore:
        return JobStore(self.settings)

    def submit(self, model: str, inp: dict[str, Any], **opts: Any) -> str:
        """Submit through the job service (the API's code path) as tenant ``t1``."""
        job, _ = JobService(self.settings.api).submit(
            "t1", JobRequest(model=model, input=inp, **opts)
        )
        return str(job["id"])

    def job(self, job_id: str) -> dict[str, Any]:
        rec = self.store.get(job_id)
        assert rec is not None
        return rec

    def wait_for(self, job_id: str, statuses: set[str], timeout: float = 30) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            rec = self.job(job_id)
            if rec["status"] in statuses:
                return rec
            if time.monotonic() > deadline:
                raise AssertionError(f"{job_id} still {rec['status']} after {timeout}s")
            time.sleep(0.1)

    def events(self) -> list[dict[str, Any]]:
        """Every event published so far (drained from the subscribed event-log queue)."""
        return drain_events(clients.client("sqs", self.settings), self.resources.event_log_queue)

    def queue_counts(self, url: str) -> tuple[int, int]:
        """(visible, in flight) messages of a queue."""
        a = clients.client("sqs", self.settings).get_queue_attributes(
            QueueUrl=url,
            AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"],
        )["Attributes"]
        return int(a["ApproximateNumberOfMessages"]), int(
            a["ApproximateNumberOfMessagesNotVisible"]
        )


@pytest.fixture
def make_env(moto_endpoint: str, clean_env: pytest.MonkeyPatch) -> Callable[..., Env]:
    """Build resources with a fresh name prefix and the given settings overrides."""

    def make(**overrides: Any) -> Env:
        values: dict[str, Any] = {
            "endpoint_url": moto_endpoint,
            "region": "us-east-1",
            "receive_wait_seconds": 1,
            "drain_seconds": 2,
            "retry_delay_seconds": 0.2,
            **overrides,
        }
        base = Settings(**values)
        res = create_resources(base, ["echo"], prefix=f"it{next(_prefix)}")
        settings = res.settings(base)
        env = {
            **res.env(),
            "AWS_ENDPOINT_URL": moto_endpoint,
            "ASYNCINFER_VISIBILITY_TIMEOUT": str(settings.visibility_timeout_seconds),
            "ASYNCINFER_MAX_RECEIVE_COUNT": str(settings.max_receive_count),
            "ASYNCINFER_RECEIVE_WAIT": "1",
            "ASYNCINFER_DRAIN_SECONDS": str(settings.drain_seconds),
            "ASYNCINFER_RETRY_DELAY": str(settings.retry_delay_seconds),
        }
        if overrides.get("heartbeat_seconds"):
            env["ASYNCINFER_HEARTBEAT_SECONDS"] = str(overrides["heartbeat_seconds"])
        return Env(settings=settings, resources=res, env=env)

    return make


class WorkerThread:
    """A real :class:`Worker` running in a thread (signals are the process tests' business),
    given the worker's part of ``settings`` as ``python -m asyncinfer.worker`` gives it."""

    def __init__(self, settings: Settings, model: str = "echo", **kwargs: Any) -> None:
        self.worker = Worker(settings.worker, model, **kwargs)
        self.thread = threading.Thread(target=self.worker.run, daemon=True)

    def __enter__(self) -> Worker:
        self.thread.start()
        return self.worker

    def __exit__(self, *exc: object) -> None:
        self.worker.request_stop()
        self.thread.join(timeout=30)
        assert not self.thread.is_alive(), "worker did not stop"
