"""Validation of a batch input file, whole, before any line runs (spec openai.md, "Batches").

Each line must be a JSON object ``{"custom_id", "method": "POST", "url": <endpoint>, "body"}``;
``custom_id`` a non-empty string, unique in the file; ``body.model`` a deployed model of the
catalogue whose kind serves the endpoint (:data:`ENDPOINT_KINDS`); the body, mapped to the
model's job input (:func:`job_input`), valid for that model with the catalogue's limits
(:func:`asyncinfer.models.registry.validate_input`). Every problem is reported with its 1-based
line number, as OpenAI's ``errors.data`` entries ``{"code", "message", "param", "line"}``.

Body fields this service does not honour are refused by name rather than silently ignored
(``n`` other than 1, ``stream``, ``tools``, ``logprobs``, ...): a batch whose answers would not be
what the caller asked for is worse than one that is refused at once.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from asyncinfer.core.errors import InvalidRequest
from asyncinfer.functions.api.body import is_text
from asyncinfer.functions.api.schemas import METADATA_MAX_BYTES
from asyncinfer.models.registry import MODELS, validate_input

CHAT, EMBEDDINGS, COMPLETIONS = "/v1/chat/completions", "/v1/embeddings", "/v1/completions"
ENDPOINTS = (CHAT, EMBEDDINGS, COMPLETIONS)

#: Catalogue kinds (models.md) whose models serve each endpoint. ``echo`` serves every one (tests
#: and overhead benchmarks); ``python`` models have their own input and serve none.
ENDPOINT_KINDS: dict[str, frozenset[str]] = {
    CHAT: frozenset({"causal-lm", "openai-server", "echo"}),
    COMPLETIONS: frozenset({"causal-lm", "openai-server", "echo"}),
    EMBEDDINGS: frozenset({"embeddings", "echo"}),
}

#: Most lines of one input file (OpenAI's limit).
MAX_LINES = 50_000
#: Most bytes of one input file (OpenAI's limit: 200 MB).
MAX_FILE_BYTES = 200 * 1024 * 1024
#: Longest ``custom_id``, characters (it is kept in the line job's metadata: api.md's 2 KB).
MAX_CUSTOM_ID = 512
#: Most UTF-8 bytes of a ``custom_id``: the line job's ``metadata`` (``batch_id``, a ``batch_`` +
#: 26-character ULID, and ``custom_id``, keys and values) must fit api.md's 2 KB, or every line's
#: job would be refused after the file passed (512 four-byte characters are 2,048 bytes).
MAX_CUSTOM_ID_BYTES = METADATA_MAX_BYTES - len("batch_id") - len("custom_id") - len("batch_") - 26
#: A JSON escape of a UTF-16 surrogate (``\ud800`` .. ``\udfff``): a pair of them is one
#: character; a lone one (RFC 8259 section 8.2: the grammar allows it) is no Unicode text and
#: cannot be encoded as UTF-8, which the chunks, the job records and the messages are (such a
#: line froze its batch: every expansion of it raised). A line with a NUL byte is UTF-16 or
#: UTF-32 (JSON in UTF-8 has none), where the escape is not searched for: always checked.
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")
#: The message of a line with an unpaired surrogate (as the API's body check words it:
#: :mod:`asyncinfer.functions.api.body`).
_UNPAIRED = "the line has an unpaired UTF-16 surrogate escape (\\uD800)"
#: Most errors listed in a failed batch's ``errors.data`` (the count of the rest is appended).
MAX_ERRORS = 1000
#: Most bytes of ``errors.data`` as JSON: it is kept in the batch's DynamoDB item (400 KB in all).
MAX_ERRORS_BYTES = 100_000
#: Longest ``message`` and ``param`` of one error, characters: they quote the line's own values
#: (a custom_id, a field name, a model id), which may be of any length.
MAX_MESSAGE_CHARS, MAX_PARAM_CHARS = 300, 100

_SAMPLING = ("temperature", "top_p", "seed")


@dataclass(frozen=True)
class Line:
    """One valid input line: its 1-based ``number``, ``custom_id``, ``model`` and the job
    ``input`` it becomes."""

    number: int
    custom_id: str
    model: str
    input: dict[str, Any]


class LineError(Exception):
    """A problem of one line: ``param`` names the field (dotted), ``code`` OpenAI-style."""

    def __init__(self, message: str, param: str | None = None, code: str = "invalid_request"):
        super().__init__(message)
        self.message, self.param, self.code = message, param, code


def _messages(value: Any) -> list[dict[str, Any]]:
    """OpenAI chat messages as the generation input's ``{role, content}`` strings: text parts
    of a list ``content`` are joined; ``developer`` is a ``system`` turn."""
    if not isinstance(value, list):
        raise LineError("messages must be a list", "body.messages")
    out = []
    for i, m in enumerate(value):
        if not isinstance(m, dict):
            raise LineError("each message must be an object", f"body.messages.{i}")
        content = m.get("content")
        if isinstance(content, list):
            parts = []
            for part in content:
                if not (isinstance(part, dict) and part.get("type") == "text"):
                    raise LineError(
                        "only text content parts are supported", f"body.messages.{i}.content"
                    )
                if not isinstance(part.get("text"), str):
                    raise LineError(
                        "a text content part needs a string text", f"body.messages.{i}.content"
                    )
                parts.append(part["text"])
            content = "".join(parts)
        role = "system" if m.get("role") == "developer" else m.get("role")
        extra = set(m) - {"role", "content", "name"}
        if extra:
            raise LineError(f"unsupported message fields {sorted(extra)}", f"body.messages.{i}")
        out.append({"role": role, "content": content})
    return out


def _generation(body: dict[str, Any], endpoint: str) -> dict[str, Any]:
    allowed = {"model", "max_tokens", "stop", "n", "user", "stream", *_SAMPLING}
    allowed |= {"messages", "max_completion_tokens"} if endpoint == CHAT else {"prompt"}
    _refuse_unknown(body, allowed)
    n = body.get("n")
    if n is not None and (isinstance(n, bool) or n != 1):  # null is OpenAI's default, 1
        raise LineError("only n = 1 is supported", "body.n")
    if body.get("stream"):
        raise LineError("stream is not supported in a batch", "body.stream")
    out: dict[str, Any] = {}
    if endpoint == CHAT:
        if "messages" not in body:
            raise LineError("messages is required", "body.messages")
        out["messages"] = _messages(body["messages"])
    else:
        if not isinstance(body.get("prompt"), str):
            raise LineError("prompt must be a string", "body.prompt")
        out["prompt"] = body["prompt"]
    # Either spelling; a null one is absent (it must not hide the other, which was then ignored).
    limit = body.get("max_completion_tokens")
    if limit is None:
        limit = body.get("max_tokens")
    if limit is not None:
        out["max_new_tokens"] = limit
    for k in _SAMPLING:
        if body.get(k) is not None:
            out[k] = body[k]
    stop = body.get("stop")
    if stop is not None:
        out["stop"] = [stop] if isinstance(stop, str) else stop
    return out


def _embeddings(body: dict[str, Any]) -> dict[str, Any]:
    _refuse_unknown(body, {"model", "input", "encoding_format", "user"})
    if body.get("encoding_format", "float") != "float":
        raise LineError("only encoding_format 'float' is supported", "body.encoding_format")
    value = body.get("input")
    texts = [value] if isinstance(value, str) else value
    if not isinstance(texts, list) or not all(isinstance(t, str) for t in texts):
        raise LineError("input must be a string or a list of strings", "body.input")
    return {"texts": texts}


def _refuse_unknown(body: dict[str, Any], allowed: set[str]) -> None:
    extra = sorted(set(body) - allowed)
    if extra:
        raise LineError(f"unsupported body field {extra[0]!r}", f"body.{extra[0]}")


def job_input(endpoint: str, kind: str, body: dict[str, Any]) -> dict[str, Any]:
    """The job ``input`` (api.md, "Models") of a request ``body`` to ``endpoint`` for a model of
    catalogue ``kind``. An ``echo`` model gets the body less ``model`` (it returns it).

    Raises:
        LineError: a field the endpoint or this service does not take, or of the wrong type.
    """
    if kind == "echo":
        return {k: v for k, v in body.items() if k != "model"}
    if endpoint == EMBEDDINGS:
        return _embeddings(body)
    return _generation(body, endpoint)


def check_line(raw: bytes, number: int, endpoint: str, deployed: list[str], seen: set[str]) -> Line:
    """Parse and check one line (``number`` is 1-based); adds its ``custom_id`` to ``seen``.

    Raises:
        LineError: what is wrong, naming the field.
    """
    try:
        obj = json.loads(raw, parse_constant=_refuse_constant)
    except (ValueError, RecursionError):
        # RecursionError: nesting deeper than the decoder's stack (it is not a ValueError, and
        # escaping here would leave the batch in `validating`); UnicodeDecodeError is a ValueError
        raise LineError("the line is not valid JSON", None, "invalid_json") from None
    if not isinstance(obj, dict):
        raise LineError("the line must be a JSON object", None, "invalid_json")
    extra = sorted(set(obj) - {"custom_id", "method", "url", "body"})
    if extra:
        raise LineError(f"unknown field {extra[0]!r}", extra[0])
    cid = obj.get("custom_id")
    if not isinstance(cid, str) or not cid or len(cid) > MAX_CUSTOM_ID:
        raise LineError(f"custom_id must be a string of 1..{MAX_CUSTOM_ID} characters", "custom_id")
    # The exact check only where a lone surrogate may be (it costs a dump of the line).
    lone = b"\x00" in raw or _SURROGATE_ESCAPE.search(raw) is not None
    if lone and not is_text(cid):
        raise LineError(_UNPAIRED, "custom_id", "invalid_json")
    if len(cid.encode()) > MAX_CUSTOM_ID_BYTES:
        raise LineError(
            f"custom_id must be at most {MAX_CUSTOM_ID_BYTES} bytes of UTF-8", "custom_id"
        )
    if cid in seen:
        raise LineError(f"custom_id {cid!r} is not unique in the file", "custom_id", "duplicate")
    seen.add(cid)
    if obj.get("method") != "POST":
        raise LineError("method must be POST", "method")
    if obj.get("url") != endpoint:
        raise LineError(f"url must be the batch's endpoint {endpoint}", "url", "mismatched_url")
    body = obj.get("body")
    if not isinstance(body, dict):
        raise LineError("body must be a JSON object", "body")
    if lone and not is_text(body):
        raise LineError(_UNPAIRED, "body", "invalid_json")
    model = body.get("model")
    if not isinstance(model, str) or model not in MODELS or model not in deployed:
        raise LineError(
            f"model {model!r} is not deployed here (deployed: {deployed})",
            "body.model",
            "model_not_found",
        )
    spec = MODELS[model]
    # An openai-server entry with engine.api: embeddings serves what the embeddings kind does.
    kind = "embeddings" if spec.kind == "openai-server" and spec.task == "embeddings" else spec.kind
    if kind not in ENDPOINT_KINDS[endpoint]:
        raise LineError(f"model {model!r} ({kind}) does not serve {endpoint}", "body.model")
    data = job_input(endpoint, kind, body)
    try:
        validate_input(MODELS[model], data)
    except InvalidRequest as exc:
        first = exc.details[0] if exc.details else {}
        field = str(first.get("field", "input"))
        raise LineError(
            f"{first.get('message', exc.message)} ({field})", _body_param(endpoint, field)
        ) from None
    return Line(number=number, custom_id=cid, model=model, input=data)


def _refuse_constant(name: str) -> Any:
    """``NaN``, ``Infinity`` and ``-Infinity`` are Python's extensions, not JSON (RFC 8259)."""
    raise ValueError(f"{name} is not JSON")


def _body_param(endpoint: str, field: str) -> str:
    """The body field of a job input field (``input.max_new_tokens`` -> ``body.max_tokens``)."""
    name = field.removeprefix("input.").removeprefix("input")
    renames = {"max_new_tokens": "max_tokens", "texts": "input"}
    head, _, rest = name.partition(".")
    head = renames.get(head, head)
    return "body" + (f".{head}" if head else "") + (f".{rest}" if rest else "")


def split_lines(data: bytes) -> list[tuple[int, bytes]]:
    """``(1-based line number, bytes)`` of each non-blank line of a JSONL file."""
    return [(n, ln) for n, ln in enumerate(data.splitlines(), start=1) if ln.strip()]


def validate_file(
    data: bytes, endpoint: str, deployed: list[str]
) -> tuple[list[Line], list[dict[str, Any]]]:
    """Check every line of the input file ``data``. Returns ``(lines, errors)``: the parsed
    lines, and OpenAI ``errors.data`` entries ``{"code", "message", "param", "line"}`` (empty
    when the file may run; at most :data:`MAX_ERRORS` of them, then one counting the rest)."""
    if len(data) > MAX_FILE_BYTES:
        return [], [_err("too_large", f"the file is larger than {MAX_FILE_BYTES} bytes")]
    raw = split_lines(data)
    if not raw:
        return [], [_err("empty_file", "the file has no lines")]
    if len(raw) > MAX_LINES:
        return [], [_err("too_many_requests", f"the file has more than {MAX_LINES} lines")]
    lines: list[Line] = []
    errors: list[dict[str, Any]] = []
    seen: set[str] = set()
    size, rest = 0, 0
    for number, text in raw:
        try:
            lines.append(check_line(text, number, endpoint, deployed, seen))
        except LineError as exc:
            entry = _err(exc.code, exc.message, exc.param, number)
            size += len(json.dumps(entry)) + 2
            if len(errors) < MAX_ERRORS and size <= MAX_ERRORS_BYTES:
                errors.append(entry)
            else:
                rest += 1
    if rest:
        errors.append(_err("too_many_errors", f"{rest} more lines are invalid"))
    return lines, errors


def _err(
    code: str, message: str, param: str | None = None, line: int | None = None
) -> dict[str, Any]:
    return {
        "code": code,
        "message": _clip(message, MAX_MESSAGE_CHARS),
        "param": None if param is None else _clip(param, MAX_PARAM_CHARS),
        "line": line,
    }


def _clip(text: str, most: int) -> str:
    """``text`` cut to ``most`` characters, ``...`` marking the cut."""
    return text if len(text) <= most else text[: most - 3] + "..."
