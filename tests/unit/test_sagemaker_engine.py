"""compute=sagemaker for ``openai-server`` entries whose endpoint runs the engine image (issue 16),
against moto in-process: the bridge writes the engine's ``/invocations`` body (the chat request of
the ECS path, the TGI/LMI schema for a prompt, ``{"inputs": texts}`` for embeddings) and invokes
with it; the completion maps the engine's answer to the job output of api.md, a 4xx to
``invalid_input``, and a 5xx to another attempt (its lease ended, taken back by the sweeper)."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from moto import mock_aws

import asyncinfer.functions.sweeper as sweeper
from asyncinfer.aws import clients
from asyncinfer.aws.payloads import PayloadStore
from asyncinfer.core.settings import Settings
from asyncinfer.functions.api.schemas import JobRequest
from asyncinfer.functions.sagemaker_bridge import Bridge
from asyncinfer.functions.sagemaker_completion import Completion
from asyncinfer.jobs.service import JobService
from asyncinfer.jobs.store import JobStore
from asyncinfer.local.resources import Resources, create_resources
from asyncinfer.models.openai_server.invocations import failure_of, invocation_of, output_of
from asyncinfer.models.openai_server.protocol import EngineAnswerError
from asyncinfer.models.registry import MODELS
from asyncinfer.models.schemas import EmbeddingInput, GenerationInput
from tests.conftest import apply_env
from tests.unit.test_sagemaker_paths import RuntimeCalls, events, note, queue_async_results

TENANT = "t1"
CATALOGUE = """\
models:
  - {id: echo, kind: echo}
  - id: llm
    kind: openai-server
    source: s3://acme-weights/llama-3.1-8b-instruct/
    engine: {image: "aws:djl-lmi", version: "0.31.0", model: llama-3.1-8b}
    limits: {max_new_tokens: 512}
    compute: {backend: sagemaker, instance_type: g6e.xlarge}
  - id: emb
    kind: openai-server
    engine: {image: "aws:huggingface-tei", version: "1.4.0", model: bge, api: embeddings}
    compute: {backend: sagemaker, instance_type: g6.xlarge}
"""
ENDPOINTS = {"llm": "ep-llm", "emb": "ep-emb"}
CHAT_ANSWER = {
    "id": "chatcmpl-0",
    "object": "chat.completion",
    "choices": [
        {
            "index": 0,
            "message": {"role": "assistant", "content": "Paris."},
            "finish_reason": "eos_token",
        }
    ],
    "usage": {"prompt_tokens": 12, "completion_tokens": 3, "total_tokens": 15},
}
PARIS = {"messages": [{"role": "user", "content": "Capital of France?"}], "max_new_tokens": 16}


@pytest.fixture
def resources(clean_env: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Resources]:
    path = tmp_path / "models.yaml"
    path.write_text(CATALOGUE)
    MODELS.use(path)
    try:
        with mock_aws():
            res = create_resources(Settings(visibility_timeout_seconds=30), list(MODELS))
            env = {**res.env(), "ASYNCINFER_LOCAL": "0", "ASYNCINFER_MODELS_FILE": str(path)}
            env["ASYNCINFER_SAGEMAKER_ENGINES"] = json.dumps({"llm": "chat", "emb": "embeddings"})
            apply_env(clean_env, env)
            yield res
    finally:
        MODELS.use(None)


@pytest.fixture
def settings(resources: Resources) -> Settings:
    return Settings.from_env()


def submit(settings: Settings, model: str, inp: dict[str, Any]) -> str:
    job, created = JobService(settings).submit(TENANT, JobRequest(model=model, input=inp))
    assert created
    return str(job["id"])


def invoke(settings: Settings, model: str, inp: dict[str, Any], result: dict[str, Any]) -> Any:
    """Submit a job and let the bridge hand it to moto's async endpoint, which writes
    ``result``; returns ``(job_id, InvokeEndpointAsync params, moto's answer)``."""
    queue_async_results(result)
    job_id = submit(settings, model, inp)
    url = settings.queue_url(model, "normal")
    (m,) = clients.client("sqs", settings).receive_message(QueueUrl=url)["Messages"]
    calls = RuntimeCalls(settings)
    out = Bridge(settings=settings, endpoints=ENDPOINTS).handle_sqs_event(
        {"Records": [{"messageId": m["MessageId"], "body": m["Body"]}]}
    )
    assert out == {"batchItemFailures": []}
    return job_id, (calls.calls[0] if calls.calls else None), (calls.responses or [None])[-1]


# ---------------------------------------------------------------------------- the bodies


def test_a_chat_job_becomes_the_engines_chat_request_on_invocations() -> None:
    inp = GenerationInput.model_validate({**PARIS, "temperature": 0.5, "stop": ["\n"]})
    assert invocation_of("chat", inp, "llama-3.1-8b") == {
        "model": "llama-3.1-8b",
        "messages": [{"role": "user", "content": "Capital of France?"}],
        "max_tokens": 16,
        "temperature": 0.5,
        "top_p": 1.0,
        "stream": False,
        "stop": ["\n"],
    }


def test_a_prompt_job_uses_the_tgi_lmi_schema_and_embeddings_their_inputs() -> None:
    inp = GenerationInput.model_validate({"prompt": "Once", "max_new_tokens": 8, "seed": 3})
    assert invocation_of("chat", inp, "m") == {
        "inputs": "Once",
        "parameters": {
            "max_new_tokens": 8,
            "do_sample": False,
            "details": True,
            "return_full_text": False,
            "seed": 3,
        },
    }
    emb = EmbeddingInput.model_validate({"texts": ["a", "b"]})
    assert invocation_of("embeddings", emb, "bge") == {"inputs": ["a", "b"]}


def test_answers_map_to_the_job_output_of_api_md() -> None:
    assert output_of("chat", CHAT_ANSWER) == {
        "text": "Paris.",
        "finish_reason": "stop",
        "usage": {"prompt_tokens": 12, "completion_tokens": 3},
    }
    tgi = [
        {"generated_text": " upon", "details": {"finish_reason": "length", "generated_tokens": 8}}
    ]
    assert output_of("chat", tgi) == {
        "text": " upon",
        "finish_reason": "length",
        "usage": {"prompt_tokens": 0, "completion_tokens": 8},
    }
    assert output_of("embeddings", [[0.5, 1], [0, -1.5]]) == {
        "embeddings": [[0.5, 1.0], [0.0, -1.5]],
        "dim": 2,
    }
    openai = {"data": [{"index": 1, "embedding": [2.0]}, {"index": 0, "embedding": [1.0]}]}
    assert output_of("embeddings", openai) == {"embeddings": [[1.0], [2.0]], "dim": 1}
    for bad in ({"nothing": 1}, "text"):
        with pytest.raises(EngineAnswerError):
            output_of("chat", bad)
    with pytest.raises(EngineAnswerError):
        output_of("embeddings", [[1.0], [1.0, 2.0]])


def test_failures_with_an_http_status_map_as_on_ecs() -> None:
    bad = failure_of(
        "ClientError: Received client error (400) from primary with message ...",
        {"code": 400, "type": "BadRequest", "message": "max_tokens is too large"},
    )
    assert bad is not None and bad.code == "invalid_input" and not bad.retryable
    assert "max_tokens is too large" in bad.message
    busy = failure_of("ModelError: Received server error (503) from primary", None)
    assert busy is not None and busy.retryable
    assert failure_of("Inference request timed out", None) is None


# ---------------------------------------------------------------------------- bridge + completion


def test_the_bridge_invokes_with_the_engine_request_and_keeps_the_input_ref(
    settings: Settings, resources: Resources
) -> None:
    job_id, call, answer = invoke(settings, "llm", PARIS, {"data": json.dumps(CHAT_ANSWER)})
    assert call["EndpointName"] == "ep-llm"
    assert call["InputLocation"] == f"s3://{resources.bucket}/inputs/t1/{job_id}.engine.json"
    body = PayloadStore(settings).read_json(call["InputLocation"])
    assert body["messages"] == PARIS["messages"] and body["max_tokens"] == 16
    assert body["model"] == "llama-3.1-8b" and body["stream"] is False
    record = JobStore(settings).get(job_id)
    assert record is not None and record["status"] == "running"
    # The job's own input stays its input_ref (a retry builds the engine request again).
    assert PayloadStore(settings).read_json(record["input_ref"]) == PARIS

    c = Completion(settings=settings)
    loc = answer["OutputLocation"]
    assert c.handle_sns_event(
        note(f"{job_id}.a1", True, responseParameters={"outputLocation": loc})
    )
    record = JobStore(settings).get(job_id)
    assert record is not None and record["status"] == "succeeded"
    assert json.loads(record["output"]) == {
        "text": "Paris.",
        "finish_reason": "stop",
        "usage": {"prompt_tokens": 12, "completion_tokens": 3},
    }


def test_embeddings_through_an_engine_endpoint(settings: Settings, resources: Resources) -> None:
    vectors = [[0.25, 0.5, 0.75], [1.0, 0.0, 0.0]]
    job_id, call, answer = invoke(
        settings, "emb", {"texts": ["a", "b"]}, {"data": json.dumps(vectors)}
    )
    assert PayloadStore(settings).read_json(call["InputLocation"]) == {"inputs": ["a", "b"]}
    loc = answer["OutputLocation"]
    Completion(settings=settings).handle_sns_event(
        note(f"{job_id}.a1", True, responseParameters={"outputLocation": loc})
    )
    record = JobStore(settings).get(job_id)
    assert record is not None and record["status"] == "succeeded"
    assert json.loads(record["output"]) == {"embeddings": vectors, "dim": 3}


def test_an_answer_of_no_known_shape_fails_the_job(
    settings: Settings, resources: Resources
) -> None:
    job_id, _, answer = invoke(settings, "llm", PARIS, {"data": json.dumps({"what": 1})})
    loc = answer["OutputLocation"]
    Completion(settings=settings).handle_sns_event(
        note(f"{job_id}.a1", True, responseParameters={"outputLocation": loc})
    )
    record = JobStore(settings).get(job_id)
    assert record is not None and record["status"] == "failed"
    assert (
        record["error"]["code"] == "model_error" and "engine's answer" in record["error"]["message"]
    )


def test_the_engines_4xx_is_invalid_input(settings: Settings, resources: Resources) -> None:
    err = {"error": {"message": "max_tokens is too large", "type": "BadRequestError", "code": 400}}
    job_id, _, answer = invoke(
        settings, "llm", PARIS, {"is_failure": True, "data": json.dumps(err)}
    )
    reason = 'ClientError: Received client error (400) from primary with message "..."'
    n = note(f"{job_id}.a1", False, failureReason=reason, failureLocation=answer["FailureLocation"])
    assert Completion(settings=settings).handle_sns_event(n) == {"jobs": {job_id: "failed"}}
    record = JobStore(settings).get(job_id)
    assert record is not None
    assert record["error"]["code"] == "invalid_input"
    assert "max_tokens is too large" in record["error"]["message"]


def test_the_engines_5xx_is_another_attempt(settings: Settings, resources: Resources) -> None:
    job_id, _, answer = invoke(
        settings, "llm", PARIS, {"is_failure": True, "data": json.dumps({"error": "overloaded"})}
    )
    events(resources)
    reason = 'ModelError: Received server error (500) from primary with message "overloaded"'
    n = note(f"{job_id}.a1", False, failureReason=reason, failureLocation=answer["FailureLocation"])
    assert Completion(settings=settings).handle_sns_event(n) == {"jobs": {job_id: "retrying"}}
    record = JobStore(settings).get(job_id)
    assert record is not None and record["status"] == "running"  # until the sweeper's round
    taken = sweeper.take_back_lapsed(settings)
    assert [(r["job_id"], r["status"]) for r in taken] == [(job_id, "queued")]
    # Its message is sent again, and the next attempt invokes the endpoint again.
    url = settings.queue_url("llm", "normal")
    (m,) = clients.client("sqs", settings).receive_message(QueueUrl=url)["Messages"]
    assert json.loads(m["Body"])["job_id"] == job_id
    calls = RuntimeCalls(settings)
    Bridge(settings=settings, endpoints=ENDPOINTS).handle_sqs_event(
        {"Records": [{"messageId": m["MessageId"], "body": m["Body"]}]}
    )
    assert calls.calls[0]["InferenceId"] == f"{job_id}.a2"
    record = JobStore(settings).get(job_id)
    assert record is not None and record["attempts"] == 2


def test_the_engines_5xx_on_the_last_attempt_fails_the_job_with_it(
    settings: Settings, resources: Resources
) -> None:
    last = Settings.from_env({**os.environ, "ASYNCINFER_MAX_RECEIVE_COUNT": "1"})
    job_id, _, answer = invoke(
        settings, "llm", PARIS, {"is_failure": True, "data": json.dumps({"error": "overloaded"})}
    )
    reason = 'ModelError: Received server error (500) from primary with message "overloaded"'
    n = note(f"{job_id}.a1", False, failureReason=reason, failureLocation=answer["FailureLocation"])
    assert Completion(settings=last).handle_sns_event(n) == {"jobs": {job_id: "failed"}}
    record = JobStore(settings).get(job_id)
    assert record is not None and record["error"]["code"] == "model_error"
    assert "engine answered 500: overloaded" in record["error"]["message"]
