"""The OpenAI HTTP API as both sides of the ``openai-server`` kind speak it: a job's
:class:`~asyncinfer.models.schemas.GenerationInput` as a ``/v1/chat/completions`` (``messages``) or
``/v1/completions`` (``prompt``) request and back, and the gauges of a Prometheus ``/metrics`` page.

Field names follow OpenAI's API reference ("Create chat completion", "Create completion"): our
``max_new_tokens`` is OpenAI's ``max_tokens`` (``max_completion_tokens`` is read too), ``stop`` a
string or a list, streaming with ``stream: true`` and ``stream_options: {include_usage: true}``
(the last chunk before ``data: [DONE]`` carries ``usage``, as vLLM, SGLang and TGI send it).
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

from pydantic import ValidationError

from asyncinfer.core.errors import InvalidInput, JobError, TransientError
from asyncinfer.models.schemas import EmbeddingInput, GenerationInput

#: HTTP statuses that mean "try again later" rather than "this request is wrong".
RETRYABLE_4XX = (408, 429)

CHAT_PATH = "/v1/chat/completions"
COMPLETIONS_PATH = "/v1/completions"

#: The finish reasons of the job output (api.md) an engine's reason maps to; anything else
#: (``abort``, ``tool_calls``, ...) is ``stop``.
_FINISH = {
    "stop": "stop",
    "eos": "stop",
    "eos_token": "stop",
    "stop_sequence": "stop",
    "length": "length",
    "max_tokens": "length",
}


def finish_reason(reason: Any) -> str:
    """The job output's ``finish_reason`` (``stop`` | ``length``) of an engine's reason."""
    return _FINISH.get(str(reason), "stop")


def request_of(
    inp: GenerationInput, model: str, *, stream: bool = True
) -> tuple[str, dict[str, Any]]:
    """``(path, JSON body)`` of the engine request for one job: chat completions for ``messages``,
    completions for ``prompt``; ``model`` is the name the engine serves (``engine.model``)."""
    body: dict[str, Any] = {
        "model": model,
        "max_tokens": inp.max_new_tokens,
        "temperature": inp.temperature,
        "top_p": inp.top_p,
        "stream": stream,
    }
    if stream:
        body["stream_options"] = {"include_usage": True}
    if inp.seed is not None:
        body["seed"] = inp.seed
    if inp.stop:
        body["stop"] = list(inp.stop)
    if inp.messages is not None:
        body["messages"] = [m.model_dump() for m in inp.messages]
        return CHAT_PATH, body
    body["prompt"] = inp.prompt
    return COMPLETIONS_PATH, body


class BadRequest(ValueError):
    """A request the server refuses with 400; ``param`` names the field."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param


def input_of(body: Any, *, chat: bool) -> GenerationInput:
    """The :class:`GenerationInput` of an OpenAI request body (server side).

    Raises:
        BadRequest: a field is missing or out of range (``param`` names it), or ``n`` is not 1.
    """
    if not isinstance(body, dict):
        raise BadRequest("the body must be a JSON object")
    n = body.get("n")
    if n is not None and (isinstance(n, bool) or n != 1):  # null is OpenAI's default, 1
        raise BadRequest("only n=1 is supported", "n")
    data: dict[str, Any] = {}
    key = "messages" if chat else "prompt"
    if key not in body:
        raise BadRequest(f"'{key}' is required", key)
    value = body[key]
    if not chat and isinstance(value, list) and len(value) == 1 and isinstance(value[0], str):
        value = value[0]  # a one-prompt batch
    data[key] = value
    # Either spelling; a null one is absent (it must not hide the other).
    tokens = body.get("max_completion_tokens")
    if tokens is None:
        tokens = body.get("max_tokens")
    if tokens is not None:
        data["max_new_tokens"] = tokens
    for ours, theirs in (("temperature", "temperature"), ("top_p", "top_p"), ("seed", "seed")):
        if body.get(theirs) is not None:
            v = body[theirs]
            data[ours] = float(v) if ours != "seed" and isinstance(v, int) else v
    stop = body.get("stop")
    if stop is not None:
        data["stop"] = [stop] if isinstance(stop, str) else stop
    try:
        return GenerationInput.model_validate(data)
    except ValidationError as exc:
        err = exc.errors(include_url=False)[0]
        loc = [str(p) for p in err["loc"]]
        names = {"max_new_tokens": "max_tokens"}
        param = ".".join([names.get(loc[0], loc[0]), *loc[1:]]) if loc else None
        raise BadRequest(f"{param or 'body'}: {err['msg']}", param) from None


_SAMPLE = re.compile(r"^([A-Za-z_:][A-Za-z0-9_:]*)(\{[^}]*\})?\s+(\S+)")


def gauge(text: str, name: str) -> float | None:
    """The sum of the samples of metric ``name`` (every label set) on a Prometheus text page,
    or ``None`` when the page has none (an engine that does not export it)."""
    total, seen = 0.0, False
    for line in text.splitlines():
        m = _SAMPLE.match(line)
        if m and m.group(1) == name:
            try:
                v = float(m.group(3))
            except ValueError:
                continue
            if not math.isnan(v):
                total, seen = total + v, True
    return total if seen else None


# ---------------------------------------------------------------------------- whole answers
EMBEDDINGS_PATH = "/v1/embeddings"


class EngineAnswerError(ValueError):
    """An engine's answer that is not of the shape its API documents (a broken engine)."""


def embeddings_request_of(inp: EmbeddingInput, model: str) -> tuple[str, dict[str, Any]]:
    """``(path, JSON body)`` of the ``/v1/embeddings`` request for one job's ``texts`` (OpenAI's
    "Create embeddings": ``input`` a list of strings, ``encoding_format: float``)."""
    return EMBEDDINGS_PATH, {"model": model, "input": list(inp.texts), "encoding_format": "float"}


def embeddings_output_of(body: Any, count: int | None = None) -> dict[str, Any]:
    """The job output ``{"embeddings": [[float, ...], ...], "dim": int}`` (the ``embeddings``
    kind's, api.md) of an engine's answer for ``count`` texts: OpenAI's ``{"data": [{"index",
    "embedding"}, ...]}`` (in ``index`` order), or a bare list of vectors (what TEI and LMI
    answer on SageMaker's ``/invocations``; one vector for one text). ``count`` ``None``: any
    number of vectors.

    Raises:
        EngineAnswerError: not ``count`` vectors of one length of numbers.
    """
    if isinstance(body, dict) and isinstance(body.get("data"), list):
        rows = sorted(body["data"], key=lambda d: d.get("index", 0) if isinstance(d, dict) else 0)
        vectors: list[Any] = [r.get("embedding") if isinstance(r, dict) else None for r in rows]
    elif isinstance(body, list) and body and all(_number(x) for x in body) and count in (1, None):
        vectors = [body]
    elif isinstance(body, list):
        vectors = body
    else:
        raise EngineAnswerError("the engine's embeddings answer has no 'data' list")
    if count is not None and len(vectors) != count:
        raise EngineAnswerError(f"the engine gave {len(vectors)} vectors for {count} texts")
    lists: list[list[Any]] = [v for v in vectors if isinstance(v, list)]
    dims = {len(v) for v in lists}
    if len(lists) != len(vectors) or len(dims) != 1 or min(dims) < 1:
        raise EngineAnswerError("the engine's vectors are not lists of numbers of one length")
    if not all(_number(x) for v in lists for x in v):
        raise EngineAnswerError("the engine's vectors are not lists of numbers of one length")
    return {"embeddings": [[float(x) for x in v] for v in lists], "dim": dims.pop()}


def _number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def generation_output_of(body: Any) -> dict[str, Any]:
    """The job output ``{"text", "finish_reason", "usage": {"prompt_tokens",
    "completion_tokens"}}`` (api.md) of a whole (not streamed) answer: OpenAI's chat completion
    (``choices[0].message.content``) or completion (``choices[0].text``), or the TGI / LMI
    standard schema ``{"generated_text", "details": {"finish_reason", "generated_tokens"}}``
    (a list of one from TGI), as their containers answer on SageMaker's ``/invocations``.

    Raises:
        EngineAnswerError: none of these shapes.
    """
    if isinstance(body, list) and len(body) == 1:
        body = body[0]
    if not isinstance(body, dict):
        raise EngineAnswerError("the engine's answer is not a JSON object")
    usage: dict[str, Any] = body["usage"] if isinstance(body.get("usage"), dict) else {}
    choices = body.get("choices")
    if isinstance(choices, list) and choices and isinstance(choices[0], dict):
        choice = choices[0]
        message: dict[str, Any] = (
            choice["message"] if isinstance(choice.get("message"), dict) else {}
        )
        text = message.get("content") if "message" in choice else choice.get("text")
        reason = choice.get("finish_reason")
    elif "generated_text" in body:
        details: dict[str, Any] = body["details"] if isinstance(body.get("details"), dict) else {}
        text, reason = body["generated_text"], details.get("finish_reason")
        usage = {
            "prompt_tokens": len(details.get("prefill") or []),
            "completion_tokens": details.get("generated_tokens", 0),
        }
    else:
        raise EngineAnswerError("the engine's answer has neither 'choices' nor 'generated_text'")
    return {
        "text": str(text or ""),
        "finish_reason": finish_reason(reason),
        "usage": {
            "prompt_tokens": int(usage.get("prompt_tokens") or 0),
            "completion_tokens": int(usage.get("completion_tokens") or 0),
        },
    }


def embeddings_input_of(body: Any) -> EmbeddingInput:
    """The :class:`EmbeddingInput` of a ``/v1/embeddings`` request body (server side): ``input``
    a string or a list of strings; ``encoding_format`` ``float`` (the default) only.

    Raises:
        BadRequest: ``input`` missing or not strings, too many or too long texts, or another
            ``encoding_format`` (``param`` names the field).
    """
    if not isinstance(body, dict):
        raise BadRequest("the body must be a JSON object")
    if "input" not in body:
        raise BadRequest("'input' is required", "input")
    if body.get("encoding_format", "float") != "float":
        raise BadRequest("only encoding_format 'float' is supported", "encoding_format")
    value = body["input"]
    texts = [value] if isinstance(value, str) else value
    if not isinstance(texts, list) or not all(isinstance(t, str) for t in texts):
        raise BadRequest("input must be a string or a list of strings", "input")
    try:
        return EmbeddingInput.model_validate({"texts": texts})
    except ValidationError as exc:
        err = exc.errors(include_url=False)[0]
        loc = ".".join(["input", *[str(p) for p in err["loc"][1:]]])
        raise BadRequest(f"{loc}: {err['msg']}", loc) from None


def error_of(status: int, body: bytes) -> JobError:
    """The job error of an engine's HTTP error ``status``: 5xx, 408 and 429 retryable, other
    4xx :class:`InvalidInput` with the engine's message (OpenAI's ``error.message``)."""
    message = body.decode("utf-8", "replace")[:500]
    try:
        parsed = json.loads(body)
        err = parsed.get("error", parsed) if isinstance(parsed, dict) else parsed
        if isinstance(err, dict) and err.get("message"):
            message = str(err["message"])[:500]
        elif isinstance(err, str):
            message = err[:500]
    except ValueError:
        pass
    if status >= 500 or status in RETRYABLE_4XX:
        return TransientError(f"engine answered {status}: {message}")
    return InvalidInput(f"engine refused the request ({status}): {message}")
