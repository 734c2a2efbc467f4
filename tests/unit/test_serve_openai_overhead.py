"""What ``asyncinfer serve-openai`` costs beside its engine (issue 16 item 5, the bridge's
overhead): request threads that sleep until their job reports (no polling), and the decoding
counts on ``/metrics`` that ``bench/engine_bridge.py`` compares with the in-process engine."""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from asyncinfer.models.base import ModelHandler, WorkItem, WorkSource
from asyncinfer.models.openai_server.serve import EngineServer


class HoldHandler(ModelHandler):
    """Holds every job it takes, silent (no progress), until ``release`` is set; then answers
    ``held`` for each."""

    def __init__(self) -> None:
        self.spec = None  # type: ignore[assignment]
        self.release = threading.Event()

    def load(self) -> None:
        pass

    def serve(self, source: WorkSource, max_batch_size: int) -> None:
        running: list[WorkItem] = []
        while True:
            if not source.stopping and len(running) < max_batch_size:
                running += source.take(max_batch_size - len(running), timeout=0.02)
            else:
                time.sleep(0.02)
            if self.release.is_set():
                usage = {"prompt_tokens": 1, "completion_tokens": 1}
                for it in running:
                    source.finish(it, {"text": "held", "finish_reason": "stop", "usage": usage})
                running = []
            if source.stopping and not running:
                return


@pytest.fixture
def held() -> Iterator[tuple[EngineServer, HoldHandler, str]]:
    h = HoldHandler()
    server = EngineServer(("127.0.0.1", 0), h, "held", max_batch_size=4)
    server.start_engine()
    t = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    t.start()
    host, port = server.server_address[:2]
    server.ready.wait(5)
    try:
        yield server, h, f"http://{host}:{port}"
    finally:
        h.release.set()
        server.stop()
        t.join(5)
        server.server_close()


def _wakeups(native_id: int) -> int:
    """Times thread ``native_id`` of this process went to sleep and woke (Linux)."""
    status = Path(f"/proc/self/task/{native_id}/status").read_text()
    (line,) = [ln for ln in status.splitlines() if ln.startswith("voluntary_ctxt_switches")]
    return int(line.split()[1])


def _request_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if "process_request_thread" in t.name]


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="needs Linux /proc")
def test_a_request_thread_sleeps_until_its_job_reports(held: Any) -> None:
    server, h, _ = held
    host, port = server.server_address[:2]
    s = socket.create_connection((host, port))
    body = json.dumps(
        {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 5, "stream": True}
    ).encode()
    head = f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n\r\n"
    s.sendall(head.encode() + body)
    deadline = time.monotonic() + 5
    while server.source.running != 1:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    (thread,) = _request_threads()
    assert thread.native_id is not None
    before = _wakeups(thread.native_id)
    time.sleep(1.0)  # the job runs, silent
    woke = _wakeups(thread.native_id) - before
    # Polling every 50 ms wakes it about 20 times in this second; sleeping until something
    # happens, at most a safety wake or two.
    assert woke <= 5, woke
    # The result still wakes it at once, and the stream ends with the text.
    t0 = time.monotonic()
    h.release.set()
    s.settimeout(5)
    got = b""
    while b"data: [DONE]" not in got:
        part = s.recv(65536)
        assert part, got
        got += part
    assert time.monotonic() - t0 < 0.5
    assert b'"content": "held"' in got
    s.close()


def test_a_closed_connection_still_cancels_a_silent_job_at_once(held: Any) -> None:
    server, _, _ = held
    host, port = server.server_address[:2]
    s = socket.create_connection((host, port))
    body = json.dumps({"prompt": "hi", "max_tokens": 5, "stream": True}).encode()
    head = f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n\r\n"
    s.sendall(head.encode() + body)
    deadline = time.monotonic() + 5
    while server.source.running != 1:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    t0 = time.monotonic()
    s.close()
    while server.source.closed != 1:
        assert time.monotonic() - t0 < 0.5, "the close was not noticed at once"
        time.sleep(0.01)


@pytest.fixture
def high_fds() -> Iterator[None]:
    """At least 1,100 descriptors open, so that new sockets get numbers past FD_SETSIZE (a
    serve-openai with a few hundred connections: three descriptors each)."""
    resource = pytest.importorskip("resource")
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 1_300:
        pytest.skip(f"the descriptor limit is {hard}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 1_300), hard))
    held = [open(os.devnull, "rb") for _ in range(1_100)]  # noqa: SIM115
    try:
        yield
    finally:
        for f in held:
            f.close()
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_a_request_past_fd_setsize_waits_and_notices_its_close(high_fds: None) -> None:
    from asyncinfer.models.openai_server.requests import Request
    from asyncinfer.models.openai_server.streaming import client_gone
    from asyncinfer.models.schemas import GenerationInput

    req = Request(item=WorkItem(job_id="r", input=GenerationInput(prompt="hi", max_new_tokens=2)))
    ours, client = socket.socketpair()
    try:
        assert ours.fileno() >= 1_024
        # Nothing happens: it sleeps the whole timeout and reports no close.
        t0 = time.monotonic()
        assert req.wait_for(ours, 0.2) is False
        assert time.monotonic() - t0 >= 0.15
        assert client_gone(ours) is False
        # Progress wakes it at once; the client closing is noticed.
        req.progress(1, {"text": "a"})
        assert req.wait_for(ours, 5) is False
        client.close()
        assert req.wait_for(ours, 5) is True
        assert client_gone(ours) is True
    finally:
        ours.close()
        client.close()
        req.close()


def test_metrics_carry_the_engines_decoding_counts(held: Any) -> None:
    from asyncinfer.models.engine import runner

    _, _, url = held
    runner.COUNTS.steps += 3
    runner.COUNTS.rows += 7
    page = httpx.get(url + "/metrics", timeout=10).text
    values = {
        line.split("{")[0]: float(line.split()[-1])
        for line in page.splitlines()
        if line.startswith("asyncinfer_engine_")
    }
    assert values["asyncinfer_engine_decode_steps_total"] == runner.COUNTS.steps
    assert values["asyncinfer_engine_decode_rows_total"] == runner.COUNTS.rows
    assert values["asyncinfer_engine_prefills_total"] == runner.COUNTS.prefills


def _generation(n: int) -> WorkItem:
    from asyncinfer.models.schemas import GenerationInput

    return WorkItem(job_id=f"r{n}", input=GenerationInput(prompt="hi", max_new_tokens=2))


def test_an_idle_engine_takes_a_burst_of_requests_in_one_batch() -> None:
    from asyncinfer.models.openai_server.requests import RequestSource

    source = RequestSource()

    def burst() -> None:  # four concurrent requests, as HTTP delivers them: one by one
        for n in range(4):
            source.submit(_generation(n))
            time.sleep(0.002)

    t = threading.Thread(target=burst)
    t.start()
    got = source.take(8, timeout=2.0)  # idle: waits for the first, then gathers the burst
    t.join()
    assert [i.job_id for i in got] == ["r0", "r1", "r2", "r3"]


def test_a_lone_request_is_not_held_and_a_busy_take_does_not_wait() -> None:
    from asyncinfer.models.openai_server import requests as mod

    source = mod.RequestSource()
    source.submit(_generation(0))
    t0 = time.monotonic()
    assert [i.job_id for i in source.take(8, timeout=2.0)] == ["r0"]
    assert time.monotonic() - t0 < mod.GATHER_SECONDS + 0.5
    source.submit(_generation(1))
    t0 = time.monotonic()
    assert [i.job_id for i in source.take(8, timeout=0)] == ["r1"]
    assert time.monotonic() - t0 < 0.005 + 0.5  # no gathering
    assert source.take(8, timeout=0) == []


def test_the_bridge_reuses_its_connection_from_job_to_job() -> None:
    from asyncinfer.models.catalogue import parse_catalogue
    from asyncinfer.models.registry import spec_of
    from asyncinfer.models.schemas import GenerationInput

    class Counting(EngineServer):
        accepted = 0

        def get_request(self) -> Any:
            self.accepted += 1
            return super().get_request()

    h = HoldHandler()
    h.release.set()  # every job answers at once
    server = Counting(("127.0.0.1", 0), h, "held", max_batch_size=4)
    server.start_engine()
    t = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    t.start()
    host, port = server.server_address[:2]
    engine = {"url": f"http://{host}:{port}", "model": "held"}
    entry = {"id": "b", "kind": "openai-server", "engine": engine}
    cat = parse_catalogue({"models": [entry]})
    bridge = spec_of(cat.models[0], cat).load_handler()
    try:
        for n in range(3):
            inp = GenerationInput(prompt="hi", max_new_tokens=2)
            (out,) = bridge.predict([WorkItem(job_id=f"j{n}", input=inp)])
            assert isinstance(out, dict) and out["text"] == "held", out
        # The readiness poller's connection and the jobs' one (the stream read to its end after
        # data: [DONE] goes back to the pool): not a new connection, and thread, per job.
        assert server.accepted <= 2, server.accepted
    finally:
        server.stop()
        t.join(5)
        server.server_close()
