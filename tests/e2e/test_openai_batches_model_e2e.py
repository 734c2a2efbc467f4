"""End to end (issue 15, item 7) with a real model: ``asyncinfer local --models
smollm2-135m-instruct`` (the model of the README's first command) and the unchanged ``openai``
SDK. A chat batch answers "What is the capital of France?" with Paris (greedy), parsed by the
SDK's ``ChatCompletion`` with its token usage; a completions batch gives a ``text_completion``
the SDK's ``Completion`` parses. One stack for the module (loading the model costs most of it).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from openai.types import Completion
from openai.types.chat import ChatCompletion

from tests.e2e.conftest import LocalStackProcess, local_stack
from tests.e2e.test_openai_batches_e2e import content_lines, sdk, upload, wait

pytestmark = pytest.mark.e2e

MODEL = "smollm2-135m-instruct"
TERMINAL = {"completed", "failed", "expired", "cancelled"}


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalStackProcess]:
    with local_stack(tmp_path_factory.mktemp("state"), "--models", MODEL) as s:
        yield s


def chat(cid: str, question: str) -> dict[str, Any]:
    return {
        "custom_id": cid,
        "method": "POST",
        "url": "/v1/chat/completions",
        "body": {
            "model": MODEL,
            "messages": [{"role": "user", "content": question}],
            "max_tokens": 16,
            "temperature": 0,
        },
    }


def test_a_chat_batch_on_smollm2_answers_paris(stack: LocalStackProcess) -> None:
    fid = upload(
        stack,
        [chat("france", "What is the capital of France?"), chat("colour", "Name one colour.")],
    )
    client = sdk(stack)
    batch = client.batches.create(
        input_file_id=fid, endpoint="/v1/chat/completions", completion_window="24h"
    )
    done = wait(client, batch.id, TERMINAL, timeout=300)
    assert done.status == "completed", done
    assert done.request_counts is not None
    assert (done.request_counts.total, done.request_counts.completed) == (2, 2)
    assert done.output_file_id and not done.error_file_id
    answers = {
        o["custom_id"]: ChatCompletion.model_validate(o["response"]["body"])
        for o in content_lines(client, done.output_file_id)
    }
    assert sorted(answers) == ["colour", "france"]
    for answer in answers.values():
        assert answer.object == "chat.completion" and answer.model == MODEL
        assert answer.choices[0].message.role == "assistant"
        assert answer.choices[0].message.content
        assert answer.choices[0].finish_reason in ("stop", "length")
        assert answer.usage is not None and answer.usage.total_tokens > 0
        assert answer.usage.prompt_tokens > 0 and answer.usage.completion_tokens > 0
        assert answer.usage.completion_tokens <= 16
        assert (
            answer.usage.total_tokens == answer.usage.prompt_tokens + answer.usage.completion_tokens
        )
    assert "Paris" in (answers["france"].choices[0].message.content or "")


def test_a_completions_batch_on_smollm2_is_a_text_completion(stack: LocalStackProcess) -> None:
    fid = upload(
        stack,
        [
            {
                "custom_id": "prompt",
                "method": "POST",
                "url": "/v1/completions",
                "body": {"model": MODEL, "prompt": "Once upon a time", "max_tokens": 8},
            }
        ],
    )
    client = sdk(stack)
    batch = client.batches.create(
        input_file_id=fid, endpoint="/v1/completions", completion_window="24h"
    )
    done = wait(client, batch.id, TERMINAL, timeout=300)
    assert done.status == "completed", done
    assert done.output_file_id
    [out] = content_lines(client, done.output_file_id)
    assert out["custom_id"] == "prompt"
    completion = Completion.model_validate(out["response"]["body"])
    assert completion.object == "text_completion" and completion.model == MODEL
    assert completion.choices[0].text
    assert completion.usage is not None
    assert 0 < completion.usage.completion_tokens <= 8
