"""``asyncinfer serve-openai``'s HTTP server over a stub handler (no model): the OpenAI shapes,
streaming, ``/metrics``, ``/health``, errors, and a closed client stream cancelling its job
(issue 16)."""

from __future__ import annotations

import json
import logging
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from asyncinfer.core.errors import InvalidInput, JobCancelled
from asyncinfer.models.base import ModelHandler, WorkItem, WorkSource
from asyncinfer.models.openai_server.serve import EngineServer
from asyncinfer.models.schemas import EmbeddingInput, GenerationInput


class WordsHandler(ModelHandler):
    """Generates ``word0 word1 ...`` one word per 20 ms, up to max_new_tokens, with progress;
    stops at cancel. A prompt of ``bad`` is refused as invalid input."""

    def __init__(self) -> None:
        self.spec = None  # type: ignore[assignment]
        self.loaded = threading.Event()
        self.cancelled: list[str] = []

    def load(self) -> None:
        self.loaded.wait(10)

    def serve(self, source: WorkSource, max_batch_size: int) -> None:
        running: list[tuple[WorkItem, list[str]]] = []
        while True:
            free = max_batch_size - len(running)
            if free and not source.stopping:
                running += [(i, []) for i in source.take(free, timeout=0 if running else 0.1)]
            if not running:
                if source.stopping:
                    return
                continue
            time.sleep(0.02)
            for it, words in list(running):
                inp = it.input
                assert isinstance(inp, GenerationInput)
                if inp.prompt == "bad":
                    running.remove((it, words))
                    source.finish(it, InvalidInput("the prompt is bad"))
                    continue
                if it.cancel_event.is_set():
                    running.remove((it, words))
                    self.cancelled.append(it.job_id)
                    source.finish(it, JobCancelled("cancelled"))
                    continue
                words.append(f"word{len(words)}")
                text = " ".join(words)
                usage = {"prompt_tokens": 3, "completion_tokens": len(words)}
                if len(words) >= inp.max_new_tokens:
                    running.remove((it, words))
                    source.finish(it, {"text": text, "finish_reason": "length", "usage": usage})
                elif it.on_progress is not None:
                    it.on_progress(len(words), {"text": text, "usage": usage})


@pytest.fixture
def served() -> Iterator[tuple[EngineServer, WordsHandler, str]]:
    h = WordsHandler()
    server = EngineServer(("127.0.0.1", 0), h, "words", max_batch_size=2)
    server.start_engine()
    t = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    t.start()
    host, port = server.server_address[:2]
    try:
        yield server, h, f"http://{host}:{port}"
    finally:
        h.loaded.set()
        server.stop()
        t.join(5)
        server.server_close()


CHAT = {"model": "words", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}


def test_health_is_503_until_loaded_then_chat_answers(served: Any) -> None:
    server, h, url = served
    with httpx.Client(base_url=url, timeout=10) as c:
        assert c.get("/health").status_code == 503
        r = c.post("/v1/chat/completions", json=CHAT)
        assert r.status_code == 503 and r.json()["error"]["type"] == "server_error"
        h.loaded.set()
        server.ready.wait(5)
        assert c.get("/health").status_code == 200
        assert c.get("/v1/models").json()["data"][0]["id"] == "words"
        body = c.post("/v1/chat/completions", json=CHAT).json()
        assert body["object"] == "chat.completion"
        assert body["choices"][0]["message"] == {
            "role": "assistant",
            "content": "word0 word1 word2",
        }
        assert body["choices"][0]["finish_reason"] == "length"
        assert body["usage"] == {"prompt_tokens": 3, "completion_tokens": 3, "total_tokens": 6}
        text = c.post("/v1/completions", json={"prompt": "x", "max_tokens": 2}).json()
        assert text["choices"][0]["text"] == "word0 word1"


def test_streaming_chunks_add_up_and_end_with_usage_and_done(served: Any) -> None:
    server, h, url = served
    h.loaded.set()
    server.ready.wait(5)
    body = {**CHAT, "max_tokens": 6, "stream": True, "stream_options": {"include_usage": True}}
    with (
        httpx.Client(base_url=url, timeout=10) as c,
        c.stream("POST", "/v1/chat/completions", json=body) as r,
    ):
        assert r.headers["content-type"] == "text/event-stream"
        data = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
    assert data[-1] == "[DONE]"
    chunks = [json.loads(d) for d in data[:-1]]
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    text = "".join(ch["choices"][0]["delta"].get("content", "") for ch in chunks if ch["choices"])
    assert text == "word0 word1 word2 word3 word4 word5"
    assert len([ch for ch in chunks if ch["choices"]]) > 2  # it came in pieces
    assert chunks[-2]["choices"][0]["finish_reason"] == "length"
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 6


def test_bad_requests_name_the_field(served: Any) -> None:
    server, h, url = served
    h.loaded.set()
    server.ready.wait(5)
    with httpx.Client(base_url=url, timeout=10) as c:
        r = c.post("/v1/chat/completions", json={**CHAT, "max_tokens": 0})
        assert r.status_code == 400 and r.json()["error"]["param"] == "max_tokens"
        r = c.post("/v1/chat/completions", json={**CHAT, "model": "other"})
        assert r.status_code == 404 and r.json()["error"]["param"] == "model"
        r = c.post("/v1/completions", json={"prompt": "bad"})
        assert r.status_code == 400 and "bad" in r.json()["error"]["message"]


def metric(url: str, name: str) -> float:
    text = httpx.get(url + "/metrics").text
    (line,) = [ln for ln in text.splitlines() if ln.startswith(name + "{")]
    return float(line.split()[-1])


def test_a_closed_stream_cancels_its_job_and_metrics_count_running_and_waiting(
    served: Any, caplog: pytest.LogCaptureFixture
) -> None:
    server, h, url = served
    h.loaded.set()
    server.ready.wait(5)
    caplog.set_level(logging.INFO, "asyncinfer.serve_openai")
    host, port = server.server_address[:2]
    socks = []
    for n in range(3):  # two run (max_batch_size 2), one waits
        s = socket.create_connection((host, port))
        body = json.dumps({**CHAT, "max_tokens": 1000, "stream": True}).encode()
        head = f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nX-Request-Id: job_{n}\r\n"
        s.sendall(head.encode() + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
        socks.append(s)
    deadline = time.monotonic() + 5
    while (
        metric(url, "vllm:num_requests_running") != 2
        or metric(url, "vllm:num_requests_waiting") != 1
    ):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    socks[0].close()  # a running one
    socks[2].close()  # the waiting one (or, by now, running)
    deadline = time.monotonic() + 5
    while (
        metric(url, "asyncinfer_engine_streams_closed_total") < 2
        or "chatcmpl-job_0" not in h.cancelled
    ):
        assert time.monotonic() < deadline, h.cancelled
        time.sleep(0.05)
    assert metric(url, "asyncinfer_engine_running_peak") == 2
    assert any(
        "stream closed" in r.getMessage() and "job_0" in r.getMessage() for r in caplog.records
    )
    socks[1].close()
    deadline = time.monotonic() + 5
    while metric(url, "vllm:num_requests_running") != 0:
        assert time.monotonic() < deadline
        time.sleep(0.05)


def test_serve_openai_refuses_unknown_and_non_causal_lm_entries(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from asyncinfer.models.openai_server.serve import serve_openai

    caplog.set_level(logging.ERROR, "asyncinfer.serve_openai")
    assert serve_openai("no-such-model", port=0) == 2
    assert serve_openai("echo", port=0) == 2
    assert "serve-openai serves causal-lm entries" in caplog.text


class LengthsHandler(ModelHandler):
    """An embeddings stand-in: each text's vector is ``[len(text), 1.0]``."""

    def __init__(self) -> None:
        self.spec = None  # type: ignore[assignment]

    def load(self) -> None:
        pass

    def predict(self, items: list[WorkItem]) -> list[Any]:
        out = []
        for it in items:
            assert isinstance(it.input, EmbeddingInput)
            out.append({"embeddings": [[float(len(t)), 1.0] for t in it.input.texts], "dim": 2})
        return out


def test_an_embeddings_entry_serves_v1_embeddings_only() -> None:
    server = EngineServer(("127.0.0.1", 0), LengthsHandler(), "minilm", 4, embeddings=True)
    server.start_engine()
    t = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    t.start()
    host, port = server.server_address[:2]
    try:
        server.ready.wait(5)
        with httpx.Client(base_url=f"http://{host}:{port}", timeout=10) as c:
            r = c.post("/v1/embeddings", json={"model": "minilm", "input": ["ab", "c"]})
            assert r.status_code == 200, r.text
            body = r.json()
            assert body["object"] == "list" and body["model"] == "minilm"
            assert [d["index"] for d in body["data"]] == [0, 1]
            assert [d["embedding"] for d in body["data"]] == [[2.0, 1.0], [1.0, 1.0]]
            one = c.post("/v1/embeddings", json={"input": "abc"}).json()
            assert one["data"][0]["embedding"] == [3.0, 1.0]
            bad = c.post("/v1/embeddings", json={"input": [1, 2]})
            assert bad.status_code == 400 and bad.json()["error"]["param"] == "input"
            fmt = c.post("/v1/embeddings", json={"input": "a", "encoding_format": "base64"})
            assert fmt.status_code == 400 and fmt.json()["error"]["param"] == "encoding_format"
            assert c.post("/v1/chat/completions", json=CHAT).status_code == 404
    finally:
        server.stop()
        t.join(5)
        server.server_close()
