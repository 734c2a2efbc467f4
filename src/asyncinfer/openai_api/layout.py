"""Output and error file lines of a batch, as OpenAI lays them out (its Batch API guide, "Batch
output"; spec openai.md): one JSON object per line,

* output: ``{"id": "batch_req_...", "custom_id", "response": {"status_code": 200,
  "request_id", "body": <object>}, "error": null}`` where ``body`` is a ``chat.completion``
  (``choices``, ``usage`` with ``total_tokens``), a ``list`` of ``embedding`` objects, or a
  ``text_completion``;
* error: ``{"id", "custom_id", "response": null, "error": {"code", "message"}}``.

The job's output (api.md, "Models") is mapped here; an ``echo`` model's output (its input) is the
message content / completion text as JSON, and an empty embeddings list.
"""

from __future__ import annotations

import json
from typing import Any

from asyncinfer.openai_api.validation import CHAT, EMBEDDINGS

#: The job's ``finish_reason`` as OpenAI names it (``cancelled`` has no OpenAI name).
_FINISH = {"stop": "stop", "length": "length"}


def _suffix(job_id: str) -> str:
    return job_id.removeprefix("job_")


def _usage(output: dict[str, Any]) -> dict[str, int]:
    raw = output.get("usage")
    usage: dict[str, Any] = raw if isinstance(raw, dict) else {}
    prompt = int(usage.get("prompt_tokens") or 0)
    completion = int(usage.get("completion_tokens") or 0)
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }


def _text(output: Any) -> str:
    if isinstance(output, dict) and isinstance(output.get("text"), str):
        return output["text"]
    return json.dumps(output, separators=(",", ":"), ensure_ascii=False)


def response_body(
    endpoint: str, job_id: str, model: str, created: int, output: Any
) -> dict[str, Any]:
    """The OpenAI response object of a succeeded line's job ``output`` (``created``: epoch s)."""
    out = output if isinstance(output, dict) else {}
    finish = _FINISH.get(str(out.get("finish_reason")), "stop")
    if endpoint == CHAT:
        return {
            "id": f"chatcmpl-{_suffix(job_id)}",
            "object": "chat.completion",
            "created": created,
            "model": model,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": _text(output), "refusal": None},
                    "logprobs": None,
                    "finish_reason": finish,
                }
            ],
            "usage": _usage(out),
            "system_fingerprint": None,
        }
    if endpoint == EMBEDDINGS:
        found = out.get("embeddings")
        vectors: list[Any] = found if isinstance(found, list) else []
        usage = _usage(out)
        return {
            "object": "list",
            "data": [
                {"object": "embedding", "index": i, "embedding": v} for i, v in enumerate(vectors)
            ],
            "model": model,
            "usage": {
                "prompt_tokens": usage["prompt_tokens"],
                "total_tokens": usage["prompt_tokens"],
            },
        }
    return {
        "id": f"cmpl-{_suffix(job_id)}",
        "object": "text_completion",
        "created": created,
        "model": model,
        "choices": [{"text": _text(output), "index": 0, "logprobs": None, "finish_reason": finish}],
        "usage": _usage(out),
        "system_fingerprint": None,
    }


def output_line(
    endpoint: str, custom_id: str, job_id: str, model: str, created: int, output: Any
) -> dict[str, Any]:
    """One line of the output file."""
    return {
        "id": f"batch_req_{_suffix(job_id)}",
        "custom_id": custom_id,
        "response": {
            "status_code": 200,
            "request_id": job_id,
            "body": response_body(endpoint, job_id, model, created, output),
        },
        "error": None,
    }


def error_line(custom_id: str, job_id: str | None, code: str, message: str) -> dict[str, Any]:
    """One line of the error file (``job_id`` None: the line never ran)."""
    rid = f"batch_req_{_suffix(job_id)}" if job_id else f"batch_req_{custom_id}"
    return {
        "id": rid,
        "custom_id": custom_id,
        "response": None,
        "error": {"code": code, "message": message},
    }


def jsonl(lines: list[dict[str, Any]]) -> bytes:
    """The lines as JSONL bytes (UTF-8, one object a line, a final newline)."""
    return b"".join(
        json.dumps(x, separators=(",", ":"), ensure_ascii=False).encode() + b"\n" for x in lines
    )
