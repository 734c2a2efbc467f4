"""The OpenAI HTTP API as both sides of the ``openai-server`` kind speak it: a job's
:class:`~asyncinfer.models.schemas.GenerationInput` as a ``/v1/chat/completions`` (``messages``) or
``/v1/completions`` (``prompt``) request and back, and the gauges of a Prometheus ``/metrics`` page.

Field names follow OpenAI's API reference ("Create chat completion", "Create completion"): our
``max_new_tokens`` is OpenAI's ``max_tokens`` (``max_completion_tokens`` is read too), ``stop`` a
string or a list, streaming with ``stream: true`` and ``stream_options: {include_usage: true}``
(the last chunk before ``data: [DONE]`` carries ``usage``, as vLLM, SGLang and TGI send it).
"""

from __future__ import annotations

import math
import re
from typing import Any

from pydantic import ValidationError

from asyncinfer.models.schemas import GenerationInput

CHAT_PATH = "/v1/chat/completions"
COMPLETIONS_PATH = "/v1/completions"

#: The finish reasons of the job output (api.md) an engine's reason maps to; anything else
#: (``abort``, ``tool_calls``, ...) is ``stop``.
_FINISH = {"stop": "stop", "eos": "stop", "length": "length", "max_tokens": "length"}


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
