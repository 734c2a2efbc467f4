"""An ``openai-server`` entry's engine as the container of a SageMaker asynchronous endpoint
(issue 16): what the SageMaker bridge writes at ``InputLocation`` for a job, and the job output
(api.md) of what the engine wrote at ``OutputLocation``.

The body is the one AWS's LLM containers read on ``POST /invocations``, built from the same
mapping as the ECS path's requests (:mod:`.protocol`):

* a job with ``messages``: the OpenAI chat completions request (:func:`.protocol.request_of`, not
  streamed). LMI takes it as such when it has ``messages`` (djl-serving, "Chat Completions API
  Schema": "supported with the /invocations endpoint without additional configurations"); TGI
  with its Messages API (``MESSAGES_API_ENABLED=true``, which the CDK app sets); an engine of
  the entry's own image must take it too;
* a job with ``prompt``: the TGI / LMI standard schema ``{"inputs": prompt, "parameters":
  {"max_new_tokens", "do_sample", "temperature", "top_p", "seed", "stop", "details": true}}``
  (both containers' "generate" schema; OpenAI's ``/v1/completions`` body is not read on
  ``/invocations``);
* an ``engine.api: embeddings`` job: ``{"inputs": texts}`` (the TEI and LMI embedding schema).

The answer is mapped by :func:`.protocol.generation_output_of` (chat completion, or
``generated_text`` with ``details``) and :func:`.protocol.embeddings_output_of` (a list of vectors,
or OpenAI's ``data``). A failed invocation's HTTP status (SageMaker's ``failureReason``:
``Received client error (400) ...``) is mapped as the ECS path maps an engine's status
(:func:`.protocol.error_of`: 4xx ``invalid_input``, 5xx / 408 / 429 retryable).
"""

from __future__ import annotations

import json
import re
from typing import Any

from pydantic import BaseModel

from asyncinfer.core.errors import JobError
from asyncinfer.models.openai_server.protocol import (
    embeddings_output_of,
    error_of,
    generation_output_of,
    request_of,
)
from asyncinfer.models.schemas import EmbeddingInput, GenerationInput

CHAT, EMBEDDINGS = "chat", "embeddings"
#: The container's HTTP status in a SageMaker failure reason, e.g. ``ClientError: Received client
#: error (400) from primary with message ...`` or ``Received server error (500)``.
_STATUS = re.compile(r"\b(?:client|server) error \((\d{3})\)", re.IGNORECASE)


def invocation_of(api: str, inp: BaseModel, model: str) -> dict[str, Any]:
    """The ``/invocations`` JSON body of one job (see the module docstring).

    Args:
        api: ``chat`` or ``embeddings`` (the entry's ``engine.api``).
        inp: the job's validated input (:class:`GenerationInput` / :class:`EmbeddingInput`).
        model: the name the engine serves (``engine.model``).
    """
    if api == EMBEDDINGS:
        assert isinstance(inp, EmbeddingInput)
        return {"inputs": list(inp.texts)}
    assert isinstance(inp, GenerationInput)
    if inp.messages is not None:
        return request_of(inp, model, stream=False)[1]
    params: dict[str, Any] = {
        "max_new_tokens": inp.max_new_tokens,
        "do_sample": inp.temperature > 0,
        "details": True,
        "return_full_text": False,
    }
    if inp.temperature > 0:
        params["temperature"] = inp.temperature
    if inp.top_p < 1:
        params["top_p"] = inp.top_p
    if inp.seed is not None:
        params["seed"] = inp.seed
    if inp.stop:
        params["stop"] = list(inp.stop)
    return {"inputs": inp.prompt, "parameters": params}


def output_of(api: str, body: Any) -> dict[str, Any]:
    """The job output of the engine's answer ``body`` (parsed JSON).

    Raises:
        EngineAnswerError: an answer of none of the documented shapes.
    """
    if api == EMBEDDINGS:
        return embeddings_output_of(body)
    return generation_output_of(body)


def failure_of(reason: str, detail: Any) -> JobError | None:
    """The job error of a failed invocation whose ``reason`` names the container's HTTP status
    (``detail``: the failure body SageMaker kept, parsed, or ``None``), or ``None`` when it names
    none (a timeout, an instance failure: :func:`classify_failure` of the completion decides)."""
    m = _STATUS.search(reason)
    if m is None:
        return None
    body = json.dumps(detail).encode() if detail is not None else reason.encode()
    return error_of(int(m.group(1)), body)
