"""Batch file validation and the request -> job input mapping (openai_api/validation.py), and
the completion window rule (openai_api/batches.py); pure, no AWS."""

from __future__ import annotations

import json
from typing import Any

import pytest

from asyncinfer.openai_api.batches import window_seconds
from asyncinfer.openai_api.validation import (
    CHAT,
    EMBEDDINGS,
    MAX_ERRORS_BYTES,
    MAX_LINES,
    LineError,
    job_input,
    validate_file,
)

DEPLOYED = ["smollm2-135m-instruct", "all-minilm-l6-v2", "echo"]


def jsonl(*lines: Any) -> bytes:
    return b"".join(json.dumps(x).encode() + b"\n" for x in lines)


def req(cid: str, url: str = CHAT, **body: Any) -> dict[str, Any]:
    return {"custom_id": cid, "method": "POST", "url": url, "body": body}


def test_chat_body_maps_to_the_generation_input() -> None:
    body = {
        "model": "smollm2-135m-instruct",
        "messages": [
            {"role": "developer", "content": "be brief"},
            {
                "role": "user",
                "content": [{"type": "text", "text": "hi "}, {"type": "text", "text": "there"}],
            },
        ],
        "max_completion_tokens": 12,
        "temperature": 0.5,
        "stop": "\n",
        "seed": 3,
    }
    assert job_input(CHAT, "causal-lm", body) == {
        "messages": [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": "hi there"},
        ],
        "max_new_tokens": 12,
        "temperature": 0.5,
        "seed": 3,
        "stop": ["\n"],
    }


def test_embeddings_input_string_or_list() -> None:
    assert job_input(EMBEDDINGS, "embeddings", {"model": "m", "input": "a"}) == {"texts": ["a"]}
    assert job_input(EMBEDDINGS, "embeddings", {"model": "m", "input": ["a", "b"]}) == {
        "texts": ["a", "b"]
    }


def test_a_valid_file_gives_every_line_in_order_and_skips_blank_lines() -> None:
    data = (
        jsonl(req("a", model="smollm2-135m-instruct", messages=[{"role": "user", "content": "x"}]))
        + b"\n"
        + jsonl(req("b", url=CHAT, model="echo", messages=[], anything=1))
    )
    lines, errors = validate_file(data, CHAT, DEPLOYED)
    assert errors == []
    assert [(ln.number, ln.custom_id) for ln in lines] == [(1, "a"), (3, "b")]
    assert lines[1].input == {"messages": [], "anything": 1}  # echo gets the body


@pytest.mark.parametrize(
    ("body", "param"),
    [
        (
            {
                "model": "smollm2-135m-instruct",
                "messages": [{"role": "user", "content": "x"}],
                "tools": [],
            },
            "body.tools",
        ),
        (
            {
                "model": "smollm2-135m-instruct",
                "messages": [{"role": "user", "content": [{"type": "image_url"}]}],
            },
            "body.messages.0.content",
        ),
        (
            {
                "model": "smollm2-135m-instruct",
                "messages": [{"role": "user", "content": "x"}],
                "temperature": 3,
            },
            "body.temperature",
        ),
        (
            {
                "model": "smollm2-135m-instruct",
                "messages": [{"role": "user", "content": "x"}],
                "stream": True,
            },
            "body.stream",
        ),
        ({"messages": []}, "body.model"),
    ],
)
def test_bad_bodies_name_the_body_field(body: dict[str, Any], param: str) -> None:
    _, errors = validate_file(
        jsonl({"custom_id": "a", "method": "POST", "url": CHAT, "body": body}), CHAT, DEPLOYED
    )
    assert [(e["line"], e["param"]) for e in errors] == [(1, param)]


def test_an_undeployed_model_is_refused() -> None:
    line = req("a", model="smollm2-135m-instruct", messages=[{"role": "user", "content": "x"}])
    _, errors = validate_file(jsonl(line), CHAT, ["echo"])
    assert errors[0]["param"] == "body.model" and errors[0]["code"] == "model_not_found"


def test_file_limits() -> None:
    assert validate_file(b"\n\n", CHAT, DEPLOYED)[1][0]["code"] == "empty_file"
    many = b"{}\n" * (MAX_LINES + 1)
    assert validate_file(many, CHAT, DEPLOYED)[1][0]["code"] == "too_many_requests"
    cid = "x" * 513
    _, errors = validate_file(jsonl(req(cid, model="echo")), CHAT, DEPLOYED)
    assert errors[0]["param"] == "custom_id"


@pytest.mark.parametrize(
    ("window", "seconds"), [("24h", 86400), ("1m", 60), ("72h", 259200), ("90m", 5400)]
)
def test_windows(window: str, seconds: int) -> None:
    assert window_seconds(window) == seconds


@pytest.mark.parametrize("window", ["0m", "73h", "4321m", "1d", "24", "h", "-1h", " 24h"])
def test_bad_windows(window: str) -> None:
    with pytest.raises(ValueError):
        window_seconds(window)


@pytest.mark.parametrize(
    "raw",
    [
        # nested deeper than the JSON decoder's recursion limit: RecursionError, not ValueError
        b'{"custom_id": "a", "method": "POST", "url": "/v1/chat/completions", "body": '
        + b"[" * 100_000
        + b"]" * 100_000
        + b"}",
        # NaN / Infinity are Python's json extensions, not JSON (RFC 8259)
        b'{"custom_id": "a", "method": "POST", "url": "/v1/chat/completions", '
        b'"body": {"model": "echo", "messages": [], "temperature": NaN}}',
        b'{"custom_id": "a", "method": "POST", "url": "/v1/chat/completions", '
        b'"body": {"model": "echo", "messages": [], "temperature": -Infinity}}',
    ],
    ids=["deeply-nested", "nan", "infinity"],
)
def test_a_line_that_is_not_json_is_a_line_error_never_an_exception(raw: bytes) -> None:
    lines, errors = validate_file(raw + b"\n", CHAT, DEPLOYED)
    assert lines == []
    assert [(e["line"], e["code"]) for e in errors] == [(1, "invalid_json")]


def test_errors_are_bounded_in_bytes_and_count_the_rest() -> None:
    cid = "\u00e9" * 512  # quoted in each duplicate's message; 6 bytes a character as JSON
    _, errors = validate_file(jsonl(*[req(cid, model="echo")] * 1001), CHAT, DEPLOYED)
    listed, last = errors[:-1], errors[-1]
    assert all(e["code"] == "duplicate" for e in listed) and last["code"] == "too_many_errors"
    assert len(listed) + int(last["message"].split()[0]) == 1000  # every bad line accounted for
    assert len(json.dumps(errors)) <= MAX_ERRORS_BYTES + 200
    huge = {"custom_id": "a", "method": "POST", "url": CHAT, "body": {}, "f" * 100_000: 1}
    (err,) = validate_file(jsonl(huge), CHAT, DEPLOYED)[1]
    assert err["param"].startswith("fff") and len(err["param"]) <= 100
    assert len(err["message"]) <= 300


def test_a_null_field_is_as_if_absent_never_hiding_the_other_spelling() -> None:
    """``max_completion_tokens: null`` beside ``max_tokens`` must not drop ``max_tokens`` (it was
    silently ignored: the line ran with the model's default length); ``n: null`` is OpenAI's
    default (1), not a refusal."""
    msgs = [{"role": "user", "content": "x"}]
    both = {"model": "m", "messages": msgs, "max_completion_tokens": None, "max_tokens": 5}
    assert job_input(CHAT, "causal-lm", both)["max_new_tokens"] == 5
    other = {"model": "m", "messages": msgs, "max_tokens": None, "max_completion_tokens": 7}
    assert job_input(CHAT, "causal-lm", other)["max_new_tokens"] == 7
    assert job_input(CHAT, "causal-lm", {"model": "m", "messages": msgs, "n": None})
    for n in (2, True, "1"):
        with pytest.raises(LineError) as info:
            job_input(CHAT, "causal-lm", {"model": "m", "messages": msgs, "n": n})
        assert info.value.param == "body.n"


@pytest.mark.parametrize("part", [{"type": "text"}, {"type": "text", "text": 5}])
def test_a_text_part_without_a_string_text_is_refused(part: dict[str, Any]) -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": [part]}]}
    with pytest.raises(LineError) as info:
        job_input(CHAT, "causal-lm", body)
    assert info.value.param == "body.messages.0.content"
