"""Batching in a real worker against a moto server: SmolLM2 jobs with continuous batching (one
cancelled while the others run on, each greedy output equal to the job run alone), and MiniLM
embedding jobs batched across jobs through the serve loop."""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from typing import Any

import pytest

from asyncinfer.core.settings import Settings
from asyncinfer.jobs.service import JobService
from asyncinfer.local.resources import create_resources
from asyncinfer.models.base import WorkItem
from asyncinfer.models.registry import MODELS
from tests.integration.conftest import Env, WorkerThread

GEN = "smollm2-135m-instruct"
EMB = "all-minilm-l6-v2"


@pytest.fixture
def model_env(moto_endpoint: str, clean_env: pytest.MonkeyPatch) -> Callable[[str], Env]:
    """Resources for one model on the moto server (conftest's ``make_env`` makes echo's)."""

    def make(model: str) -> Env:
        base = Settings(
            endpoint_url=moto_endpoint,
            region="us-east-1",
            receive_wait_seconds=1,
            drain_seconds=2,
        )
        res = create_resources(base, [model], prefix=f"batch{time.monotonic_ns()}")
        settings = res.settings(base)
        return Env(settings=settings, resources=res, env=res.env())

    return make


@pytest.fixture(scope="module")
def smollm2() -> Any:
    handler = MODELS[GEN].load_handler()
    handler.load()
    return handler


def alone(handler: Any, inp: dict[str, Any]) -> Any:
    spec = MODELS[GEN]
    return handler.predict([WorkItem(job_id="alone", input=spec.input_model.model_validate(inp))])[
        0
    ]


def test_continuous_batching_in_the_worker(model_env: Callable[[str], Env], smollm2: Any) -> None:
    env = model_env(GEN)
    prompts = ["What is the capital of France?", "List three colors.", "Write a haiku about rain."]
    inputs = [
        {"messages": [{"role": "user", "content": p}], "max_new_tokens": 10 + 6 * n}
        for n, p in enumerate(prompts)
    ]
    long_job = {"prompt": "Once upon a time, in a faraway land,", "max_new_tokens": 400}
    with WorkerThread(env.settings, GEN, handler=smollm2, max_batch_size=4) as worker:
        to_cancel = env.submit(GEN, long_job)
        ids = [env.submit(GEN, inp) for inp in inputs]
        env.wait_for(to_cancel, {"running"})
        time.sleep(1.0)
        assert JobService(env.settings).cancel("t1", to_cancel)["status"] == "running"
        cancelled = env.wait_for(to_cancel, {"cancelled", "succeeded"}, timeout=120)
        done = [env.wait_for(j, {"succeeded", "failed"}, timeout=120) for j in ids]
        assert worker.max_batch_size == 4
    assert cancelled["status"] == "cancelled"
    partial = json.loads(cancelled["output"])
    assert partial["finish_reason"] == "cancelled"
    assert 0 < partial["usage"]["completion_tokens"] < 400
    for rec, inp in zip(done, inputs, strict=True):
        assert rec["status"] == "succeeded"
        assert json.loads(rec["output"]) == alone(smollm2, inp)
    assert "Paris" in json.loads(done[0]["output"])["text"]


def test_embeddings_batched_across_jobs(model_env: Callable[[str], Env]) -> None:
    env = model_env(EMB)
    texts = [["a cat sat on the mat"], ["the stock market fell", "it rained all day"], ["hello"]]
    handler = MODELS[EMB].load_handler()
    handler.load()
    calls: list[int] = []
    real_embed = handler.embed

    def embed(batch: list[str]) -> list[list[float]]:
        calls.append(len(batch))
        return real_embed(batch)

    handler.embed = embed  # type: ignore[method-assign]
    ids = [env.submit(EMB, {"texts": t}) for t in texts]
    with WorkerThread(env.settings, EMB, handler=handler, max_batch_size=8):
        recs = [env.wait_for(j, {"succeeded", "failed"}, timeout=60) for j in ids]
    assert calls and max(calls) > 1, "jobs were not batched together"
    for rec, t in zip(recs, texts, strict=True):
        assert rec["status"] == "succeeded"
        out = json.loads(rec["output"])
        assert out["dim"] == 384 and len(out["embeddings"]) == len(t)
        for vec, text in zip(out["embeddings"], t, strict=True):
            assert len(vec) == 384
            assert math.isclose(math.sqrt(sum(x * x for x in vec)), 1.0, rel_tol=1e-4)
            single = real_embed([text])[0]
            assert max(abs(a - b) for a, b in zip(vec, single, strict=True)) < 1e-4
