"""The ``openai-server`` kind's handler against a stub engine (``httpx.MockTransport``): output
mapping, error mapping, readiness and the engine's queue, concurrency, cancel, compute time; and
the intake's readiness gate (issue 16)."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import pytest

from asyncinfer.core.errors import InvalidInput, JobCancelled, JobTimeout, TransientError
from asyncinfer.models.base import WorkItem
from asyncinfer.models.catalogue import parse_catalogue
from asyncinfer.models.openai_server import handler as mod
from asyncinfer.models.openai_server.handler import OpenAIServerHandler, error_of
from asyncinfer.models.openai_server.protocol import BadRequest, gauge, input_of, request_of
from asyncinfer.models.registry import spec_of
from asyncinfer.models.schemas import EmbeddingInput, GenerationInput
from asyncinfer.worker.held import HeldMessages
from asyncinfer.worker.intake import Intake
from tests.unit.test_worker_parts import StubQueue

URL = "http://127.0.0.1:47399"


def spec(max_batch_size: int = 4) -> Any:
    cat = parse_catalogue(
        {
            "models": [
                {
                    "id": "vllm-8b",
                    "kind": "openai-server",
                    "max_batch_size": max_batch_size,
                    "engine": {"url": URL, "model": "meta-llama/Llama-3.1-8B-Instruct"},
                }
            ]
        }
    )
    return spec_of(cat.models[0], cat)


def sse(*chunks: dict[str, Any]) -> bytes:
    return (
        b"".join(b"data: " + json.dumps(c).encode() + b"\n\n" for c in chunks) + b"data: [DONE]\n\n"
    )


def delta(text: str, finish: str | None = None) -> dict[str, Any]:
    return {"choices": [{"index": 0, "delta": {"content": text}, "finish_reason": finish}]}


class Engine:
    """A stub engine: /health, /metrics and a chat endpoint answered by ``chat``."""

    def __init__(self, chat: Callable[[dict[str, Any]], Any]) -> None:
        self.chat = chat
        self.healthy = True
        self.waiting = 0
        self.bodies: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []
        self.in_flight = 0
        self.peak = 0

    async def __call__(self, request: httpx.Request) -> httpx.Response:
        if request.url.path == "/health":
            return httpx.Response(200 if self.healthy else 503)
        if request.url.path == "/metrics":
            text = f'vllm:num_requests_waiting{{model_name="m"}} {self.waiting}.0\n'
            return httpx.Response(200, text=text)
        body = json.loads(request.content)
        self.bodies.append(body)
        self.headers.append(dict(request.headers))
        answer = self.chat(body)
        if isinstance(answer, httpx.Response):
            return answer
        return httpx.Response(200, content=self._counted(answer))

    async def _counted(self, chunks: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
        self.in_flight += 1
        self.peak = max(self.peak, self.in_flight)
        try:
            async for c in chunks:
                yield c
        finally:
            self.in_flight -= 1


def handler_for(engine: Engine, max_batch_size: int = 4) -> OpenAIServerHandler:
    h = OpenAIServerHandler(spec=spec(max_batch_size), transport=httpx.MockTransport(engine))
    h.load()
    return h


def wait_until(cond: Callable[[], bool], timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.02)


def item(n: int = 0, **inp: Any) -> WorkItem:
    data = {"messages": [{"role": "user", "content": f"q{n}"}], **inp}
    return WorkItem(job_id=f"job_{n}", input=GenerationInput.model_validate(data))


@pytest.fixture(autouse=True)
def fast_poll(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(mod, "POLL_SECONDS", 0.02)


async def stream_of(*parts: bytes, pause: float = 0.0) -> AsyncIterator[bytes]:
    for p in parts:
        if pause:
            await asyncio.sleep(pause)
        yield p


def test_request_and_output_mapping() -> None:
    usage = {"prompt_tokens": 12, "completion_tokens": 3, "total_tokens": 15}
    engine = Engine(
        lambda body: stream_of(
            sse(
                delta("The"),
                delta(" capital"),
                delta(" is Paris.", "stop"),
                {"choices": [], "usage": usage},
            )
        )
    )
    h = handler_for(engine)
    wait_until(h.ready)
    (out,) = h.predict([item(1, max_new_tokens=9, temperature=0.5, seed=7, stop=["\n"])])
    assert out == {
        "text": "The capital is Paris.",
        "finish_reason": "stop",
        "usage": {"prompt_tokens": 12, "completion_tokens": 3},
    }
    (body,) = engine.bodies
    assert body["model"] == "meta-llama/Llama-3.1-8B-Instruct" and body["stream"] is True
    assert body["max_tokens"] == 9 and body["temperature"] == 0.5 and body["seed"] == 7
    assert body["stop"] == ["\n"] and body["stream_options"] == {"include_usage": True}
    assert body["messages"] == [{"role": "user", "content": "q1"}]
    assert engine.headers[0]["x-request-id"] == "job_1"


def test_length_finish_and_prompt_goes_to_completions() -> None:
    path, body = request_of(GenerationInput(prompt="Once"), "m")
    assert path == "/v1/completions" and body["prompt"] == "Once" and "messages" not in body
    engine = Engine(lambda body: stream_of(sse(delta("a"), delta("b", "length"))))
    h = handler_for(engine)
    wait_until(h.ready)
    (out,) = h.predict([item(2)])
    # No usage chunk: completion tokens are the content chunks counted.
    assert out["finish_reason"] == "length" and out["usage"]["completion_tokens"] == 2


@pytest.mark.parametrize(
    ("status", "kind"),
    [
        (500, TransientError),
        (503, TransientError),
        (429, TransientError),
        (400, InvalidInput),
        (404, InvalidInput),
    ],
)
def test_http_errors_map_by_status(status: int, kind: type) -> None:
    body = json.dumps({"error": {"message": "max_tokens is too large", "type": "x"}}).encode()
    engine = Engine(lambda _: httpx.Response(status, content=body))
    h = handler_for(engine)
    wait_until(h.ready)
    (out,) = h.predict([item(3)])
    assert type(out) is kind
    assert "max_tokens is too large" in out.message
    assert type(error_of(status, b"not json")) is kind


def test_connection_error_is_retryable_and_makes_it_not_ready() -> None:
    def refuse(_: dict[str, Any]) -> Any:
        raise httpx.ConnectError("connection refused")

    engine = Engine(refuse)
    h = handler_for(engine)
    wait_until(h.ready)
    engine.healthy = False
    (out,) = h.predict([item(4)])
    assert isinstance(out, TransientError) and "ConnectError" in out.message
    assert not h.ready()


def test_a_stream_cut_before_its_finish_is_retryable() -> None:
    engine = Engine(lambda _: stream_of(b"data: " + json.dumps(delta("half")).encode() + b"\n\n"))
    h = handler_for(engine)
    wait_until(h.ready)
    (out,) = h.predict([item(5)])
    assert isinstance(out, TransientError)


def test_not_ready_until_health_and_while_the_engine_queues() -> None:
    engine = Engine(lambda _: stream_of(sse(delta("x", "stop"))))
    engine.healthy = False
    h = handler_for(engine)
    time.sleep(0.2)
    assert not h.ready()
    engine.healthy = True
    wait_until(h.ready)
    engine.waiting = 3
    wait_until(lambda: not h.ready())
    engine.waiting = 0
    wait_until(h.ready)
    assert gauge('a{x="1"} 2\na{x="2"} 3\nb 9\n', "a") == 5.0 and gauge("b 1", "a") is None


def test_cancel_closes_the_stream_at_once_with_the_partial_text() -> None:
    closed = threading.Event()

    async def endless() -> AsyncIterator[bytes]:
        try:
            yield b"data: " + json.dumps(delta("Once")).encode() + b"\n\n"
            while True:
                await asyncio.sleep(0.05)
        finally:
            closed.set()

    engine = Engine(lambda _: endless())
    h = handler_for(engine)
    wait_until(h.ready)
    it = item(6)
    out: list[Any] = []
    t = threading.Thread(target=lambda: out.extend(h.predict([it])))
    t.start()
    wait_until(lambda: engine.in_flight == 1)
    time.sleep(0.1)
    t0 = time.monotonic()
    it.cancel_event.set()
    t.join(5)
    assert time.monotonic() - t0 < 1.0
    (res,) = out
    assert isinstance(res, JobCancelled) and res.partial is not None
    assert res.partial["text"] == "Once" and res.partial["finish_reason"] == "cancelled"
    wait_until(closed.is_set, 5)  # the engine saw its stream closed


def test_a_cancel_after_done_keeps_the_whole_answer() -> None:
    """``data: [DONE]`` came, then the engine holds the response open: the bridge reads on for
    the connection's sake (``_drain``); a cancel then does not turn the finished job into a
    cancelled one."""
    done_sent = threading.Event()

    async def done_then_hold() -> AsyncIterator[bytes]:
        yield sse(delta("Paris", "stop"))
        done_sent.set()
        while True:
            await asyncio.sleep(0.05)

    engine = Engine(lambda _: done_then_hold())
    h = handler_for(engine)
    wait_until(h.ready)
    it = item(8)
    out: list[Any] = []
    t = threading.Thread(target=lambda: out.extend(h.predict([it])))
    t.start()
    wait_until(done_sent.is_set)
    time.sleep(0.1)  # inside the drain
    it.cancel_event.set()
    t.join(5)
    (res,) = out
    assert isinstance(res, dict), res
    assert res["text"] == "Paris" and res["finish_reason"] == "stop"


def test_a_deadline_closes_the_stream_as_a_timeout() -> None:
    async def endless() -> AsyncIterator[bytes]:
        while True:
            await asyncio.sleep(0.05)
            yield b": keepalive\n\n"

    engine = Engine(lambda _: endless())
    h = handler_for(engine)
    wait_until(h.ready)
    it = item(7)
    it.deadline = time.monotonic() + 0.3
    (res,) = h.predict([it])
    assert isinstance(res, JobTimeout)


class ListSource:
    """A WorkSource over a list; records when items finish."""

    def __init__(self, items: list[WorkItem]) -> None:
        self.todo = list(items)
        self.results: dict[str, Any] = {}
        self.lock = threading.Lock()

    @property
    def stopping(self) -> bool:
        return not self.todo

    def take(self, max_items: int, timeout: float) -> list[WorkItem]:
        with self.lock:
            out, self.todo = self.todo[:max_items], self.todo[max_items:]
        return out

    def finish(self, it: WorkItem, result: Any) -> None:
        self.results[it.job_id] = result


def test_serve_keeps_at_most_the_capacity_in_flight_and_charges_busy_time() -> None:
    engine = Engine(lambda _: stream_of(sse(delta("a"), delta("b", "stop")), pause=0.1))
    h = handler_for(engine, max_batch_size=3)
    wait_until(h.ready)
    peak = [0]
    account = h._account

    def counted() -> None:  # called as each request starts and ends
        peak[0] = max(peak[0], len(h._jobs))
        account()

    h._account = counted  # type: ignore[method-assign]
    items = [item(n) for n in range(10)]
    source = ListSource(items)
    t0 = time.perf_counter()
    h.serve(source, 3)
    wall = time.perf_counter() - t0
    assert len(source.results) == 10 and all(isinstance(r, dict) for r in source.results.values())
    assert peak[0] == 3
    total = sum(i.compute_seconds for i in items)
    # Each job's share of the busy time: together never more than the wall time, and each job
    # ran about 0.2 s alongside two others.
    assert 0 < total <= wall + 0.01
    assert all(0.02 < i.compute_seconds < 0.5 for i in items)


def test_serve_takes_nothing_while_not_ready() -> None:
    engine = Engine(lambda _: stream_of(sse(delta("a", "stop"))))
    engine.healthy = False
    h = handler_for(engine)
    source = ListSource([item(1)])
    t = threading.Thread(target=h.serve, args=(source, 4), daemon=True)
    t.start()
    time.sleep(0.4)
    assert len(source.todo) == 1 and not engine.bodies
    engine.healthy = True
    t.join(10)
    assert not t.is_alive() and isinstance(source.results["job_1"], dict)


def test_the_intake_receives_nothing_while_the_handler_is_not_ready() -> None:
    sqs, ready = StubQueue(5), [False]
    intake = Intake(
        HeldMessages(sqs),
        {"normal": "q"},
        capacity=2,
        running=lambda: 0,
        stop_event=threading.Event(),
        receive_max=2,
        receive_wait_seconds=0,
        max_wait_seconds=0.0,
        stop_release_delay=1.0,
        ready=lambda: ready[0],
    )
    intake.start()
    try:
        time.sleep(0.3)
        assert intake.room() == 0 and intake.backlog() == 0 and len(sqs.waiting) == 5
        ready[0] = True
        wait_until(lambda: intake.backlog() == 2)
        assert len(sqs.waiting) == 3
    finally:
        intake.stop_event.set()
        intake.join(5)


def test_server_side_request_mapping() -> None:
    inp = input_of(
        {
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 5,
            "stop": "x",
            "temperature": 1,
        },
        chat=True,
    )
    assert inp.max_new_tokens == 5 and inp.stop == ["x"] and inp.temperature == 1.0
    assert input_of({"prompt": ["a"]}, chat=False).prompt == "a"
    with pytest.raises(BadRequest) as bad:
        input_of({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 0}, chat=True)
    assert bad.value.param == "max_tokens"
    with pytest.raises(BadRequest) as bad:
        input_of({"prompt": "a", "n": 2}, chat=False)
    assert bad.value.param == "n"


def test_server_side_a_null_field_is_as_if_absent() -> None:
    """What OpenAI clients send for a field they leave unset: ``null``. ``max_completion_tokens:
    null`` must not hide ``max_tokens`` (the request ran to the default length), ``n: null`` is
    1."""
    msgs = [{"role": "user", "content": "hi"}]
    inp = input_of({"messages": msgs, "max_completion_tokens": None, "max_tokens": 5}, chat=True)
    assert inp.max_new_tokens == 5
    assert input_of({"prompt": "a", "n": None}, chat=False).prompt == "a"


def test_the_catalogue_checks_the_engine_block() -> None:
    from asyncinfer.core.errors import CatalogueError

    with pytest.raises(CatalogueError) as info:
        parse_catalogue(
            {
                "models": [
                    {
                        "id": "a",
                        "kind": "openai-server",
                        "engine": {"url": URL, "model": "m", "args": ["-x"]},
                    },
                    {
                        "id": "b",
                        "kind": "openai-server",
                        "engine": {"image": "vllm/vllm-openai", "model": "m", "tensor_parallel": 8},
                        "compute": {"gpus": 4, "instance_type": "g6e.12xlarge"},
                    },
                    {"id": "c", "kind": "openai-server", "engine": {"model": "m"}},
                ]
            }
        )
    text = str(info.value)
    assert "models[0].engine.args: only for an engine.image" in text
    assert "models[1].engine.tensor_parallel: 8 needs as many GPUs; compute.gpus is 4" in text
    assert "models[2].engine: exactly one of url or image is required" in text


# ---------------------------------------------------------------------------- embeddings


def embeddings_handler(engine: Engine) -> OpenAIServerHandler:
    cat = parse_catalogue(
        {
            "models": [
                {
                    "id": "bge",
                    "kind": "openai-server",
                    "engine": {"url": URL, "model": "BAAI/bge-small", "api": "embeddings"},
                }
            ]
        }
    )
    s = spec_of(cat.models[0], cat)
    assert s.task == "embeddings" and s.input_model is EmbeddingInput  # the embeddings kind's
    h = OpenAIServerHandler(spec=s, transport=httpx.MockTransport(engine))
    h.load()
    return h


def test_an_embeddings_entry_calls_v1_embeddings_and_gives_the_kinds_output() -> None:
    def answer(body: dict[str, Any]) -> httpx.Response:
        vectors = [[float(len(t)), 0.5] for t in body["input"]]
        data = [{"object": "embedding", "index": i, "embedding": v} for i, v in enumerate(vectors)]
        return httpx.Response(200, json={"object": "list", "data": data[::-1]})  # any order

    engine = Engine(answer)
    h = embeddings_handler(engine)
    wait_until(h.ready)
    inp = EmbeddingInput.model_validate({"texts": ["a", "bbb"]})
    (out,) = h.predict([WorkItem(job_id="job_e", input=inp)])
    assert out == {"embeddings": [[1.0, 0.5], [3.0, 0.5]], "dim": 2}
    assert engine.bodies[-1] == {
        "model": "BAAI/bge-small",
        "input": ["a", "bbb"],
        "encoding_format": "float",
    }
    assert engine.headers[-1]["x-request-id"] == "job_e"


@pytest.mark.parametrize(
    ("status", "error"), [(400, InvalidInput), (422, InvalidInput), (503, TransientError)]
)
def test_embeddings_errors_map_as_chat_errors(status: int, error: type) -> None:
    engine = Engine(lambda body: httpx.Response(status, json={"error": {"message": "no"}}))
    h = embeddings_handler(engine)
    wait_until(h.ready)
    (out,) = h.predict([WorkItem(job_id="j", input=EmbeddingInput(texts=["a"]))])
    assert isinstance(out, error) and "no" in out.message


def test_embeddings_of_the_wrong_count_are_retryable() -> None:
    engine = Engine(
        lambda body: httpx.Response(200, json={"data": [{"index": 0, "embedding": [1]}]})
    )
    h = embeddings_handler(engine)
    wait_until(h.ready)
    (out,) = h.predict([WorkItem(job_id="j", input=EmbeddingInput(texts=["a", "b"]))])
    assert isinstance(out, TransientError) and "1 vectors for 2 texts" in out.message
