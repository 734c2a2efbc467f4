"""The fast load of SmolLM2's cached checkpoint (:func:`~asyncinfer.models.checkpoint.
load_checkpoint`) gives what transformers' Auto classes give: the same token ids, text and chat
template rendering as ``AutoTokenizer.from_pretrained``, the same weights, buffers and logits as
``AutoModelForCausalLM.from_pretrained(dtype=torch.float32)``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from asyncinfer.models.checkpoint import ensure_checkpoint, load_checkpoint
from asyncinfer.models.registry import MODELS

pytestmark = pytest.mark.model

TEXTS = [
    "What is the capital of France?",
    "  leading spaces,\ttabs and\nnew lines  ",
    "Ünïcödé: café, naïve, Straße, ĳ, ﬁ, Ωμέγα, привет, 日本語のテキスト, 한국어, עברית, العربية",
    "Emoji 👩‍👩‍👧‍👦 🇫🇷 ✨ and a zero\u200bwidth space, a non-breaking\u00a0space",
    "Special tokens in text: <|im_start|>user\nhi<|im_end|> <|endoftext|> <repo_name>",
    "def f(x):\n    return x ** 2  # code, 1234567890, 3.14159",
    "",
]

CONVERSATIONS = [
    [{"role": "user", "content": "Explain photosynthesis to a child."}],
    [
        {"role": "system", "content": "You answer in French."},
        {"role": "user", "content": "Où est la tour Eiffel ? 🗼"},
    ],
    [
        {"role": "user", "content": "1+1=?"},
        {"role": "assistant", "content": "2"},
        {"role": "user", "content": "Und 日本 \u00d7 2?"},
    ],
    [{"role": "user", "content": ""}],
]


@pytest.fixture(scope="module")
def folder() -> Path:
    return ensure_checkpoint(Path.home() / ".cache" / "asyncinfer", "smollm2-135m-instruct")


@pytest.fixture(scope="module")
def fast(folder: Path) -> tuple[Any, Any]:
    return load_checkpoint(folder)


@pytest.fixture(scope="module")
def reference(folder: Path) -> tuple[Any, Any]:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32)
    return tokenizer, model.eval()


def test_tokenizer_same_ids_and_text(fast: tuple[Any, Any], reference: tuple[Any, Any]) -> None:
    tok, ref = fast[0], reference[0]
    assert type(tok) is type(ref)
    assert tok.backend_tokenizer.to_str() == ref.backend_tokenizer.to_str()
    assert tok.special_tokens_map == ref.special_tokens_map
    assert tok.all_special_ids == ref.all_special_ids
    assert tok.added_tokens_decoder == ref.added_tokens_decoder
    assert tok.chat_template == ref.chat_template
    assert (tok.eos_token_id, tok.pad_token_id, tok.bos_token_id) == (
        ref.eos_token_id,
        ref.pad_token_id,
        ref.bos_token_id,
    )
    for text in TEXTS:
        ids = tok(text, return_tensors="pt")["input_ids"]
        assert ids.tolist() == ref(text, return_tensors="pt")["input_ids"].tolist(), text
        flat = ids[0].tolist()
        for skip in (True, False):
            assert tok.decode(flat, skip_special_tokens=skip) == ref.decode(
                flat, skip_special_tokens=skip
            )
        assert tok.decode(flat[-16:]) == ref.decode(flat[-16:])


def test_tokenizer_same_chat_template(fast: tuple[Any, Any], reference: tuple[Any, Any]) -> None:
    tok, ref = fast[0], reference[0]
    for messages in CONVERSATIONS:
        text = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        assert text == ref.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        assert text.endswith("<|im_start|>assistant\n")
        enc = tok.apply_chat_template(
            messages, add_generation_prompt=True, return_dict=True, return_tensors="pt"
        )
        want = ref.apply_chat_template(
            messages, add_generation_prompt=True, return_dict=True, return_tensors="pt"
        )
        assert enc["input_ids"].tolist() == want["input_ids"].tolist()


def test_model_same_weights_and_logits(fast: tuple[Any, Any], reference: tuple[Any, Any]) -> None:
    import torch

    model, ref = fast[1], reference[1]
    assert type(model) is type(ref)
    assert not model.training
    assert model.config.to_diff_dict() == ref.config.to_diff_dict()
    assert model.config._attn_implementation == ref.config._attn_implementation
    assert model.generation_config.to_dict() == ref.generation_config.to_dict()
    assert model.lm_head.weight is model.model.embed_tokens.weight  # tied, as in the reference
    state, want = model.state_dict(), ref.state_dict()
    assert state.keys() == want.keys()
    for name, tensor in state.items():
        assert tensor.dtype == torch.float32, name
        assert torch.equal(tensor, want[name]), name
    buffers = dict(model.named_buffers())
    for name, buffer in ref.named_buffers():  # non-persistent too (rotary inv_freq)
        assert buffers[name].dtype == buffer.dtype, name
        assert torch.equal(buffers[name], buffer), name

    ids = reference[0].apply_chat_template(
        CONVERSATIONS[1], add_generation_prompt=True, return_dict=True, return_tensors="pt"
    )["input_ids"]
    with torch.inference_mode():
        logits = model(input_ids=ids).logits
        want_logits = ref(input_ids=ids).logits
    assert torch.equal(logits, want_logits)
    with torch.inference_mode():
        out = model.generate(ids, max_new_tokens=8, do_sample=False)
        want_out = ref.generate(ids, max_new_tokens=8, do_sample=False)
    assert out.tolist() == want_out.tolist()


def test_handler_loads_through_the_fast_path() -> None:
    from asyncinfer.models.smollm2 import SmolLM2Handler

    handler = SmolLM2Handler(spec=MODELS["smollm2-135m-instruct"])
    handler.load()
    assert handler.eos_ids == {2}
    model = handler.model
    handler.load()  # once
    assert handler.model is model
