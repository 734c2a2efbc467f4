"""The ``causal-lm`` kind on every architecture family the spec names (issue 13 item 3): tiny
random-initialised checkpoints (2 layers, hidden 32, the real SmolLM2 tokenizer and chat
template) saved into a folder, loaded through a catalogue as ``causal-lm`` entries, served by the
engine on the CPU in float32: greedy output batched (jobs of different prompt lengths joining a
running batch) equals each job's output alone; stop strings, ``max_new_tokens``, the chat
template and usage."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from asyncinfer.core.errors import ConfigError
from asyncinfer.models.base import Result, WorkItem
from asyncinfer.models.catalogue import Catalogue, load_catalogue
from asyncinfer.models.registry import spec_of
from asyncinfer.models.schemas import GenerationInput

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

COMMON: dict[str, Any] = {
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 1024,
    "tie_word_embeddings": True,
    "initializer_range": 0.2,  # decisive logits: greedy ties are unlikely
}
#: One config per family: (config class, extra fields). head_dim where the class defaults it.
ARCHS: dict[str, tuple[str, dict[str, Any]]] = {
    "llama": ("LlamaConfig", {"head_dim": 8}),
    "mistral": ("MistralConfig", {"head_dim": 8, "sliding_window": 4096}),
    "qwen2": ("Qwen2Config", {}),
    "qwen3": ("Qwen3Config", {"head_dim": 8}),
    "gemma": ("GemmaConfig", {"head_dim": 8}),
    "phi": ("PhiConfig", {}),
    "phi3": ("Phi3Config", {}),
}
PROMPTS = [
    "Hi",
    "The quick brown fox jumps over the lazy dog and then",
    "Once upon a time, in a land far away, there lived a",
    "List three colors:",
    "A long context. " * 20 + "Summarise it:",
]


def _tokenizer() -> Any:
    from asyncinfer.core.settings import Settings
    from asyncinfer.models.checkpoint import ensure_checkpoint, load_tokenizer

    return load_tokenizer(ensure_checkpoint(Settings().model_cache_dir))


@pytest.fixture(scope="session")
def catalogue(tmp_path_factory: pytest.TempPathFactory) -> Catalogue:
    """A catalogue with one ``causal-lm`` entry per architecture, each a checkpoint folder."""
    root = tmp_path_factory.mktemp("causal-lm")
    tokenizer = _tokenizer()
    lines = ["models:"]
    for n, (name, (cls_name, extra)) in enumerate(ARCHS.items()):
        config = getattr(transformers, cls_name)(
            vocab_size=len(tokenizer),
            bos_token_id=tokenizer.bos_token_id,
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
            **COMMON,
            **extra,
        )
        torch.manual_seed(n)
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        model.generation_config.eos_token_id = tokenizer.eos_token_id
        folder = root / name
        model.save_pretrained(str(folder))
        tokenizer.save_pretrained(str(folder))
        # Relative paths and file:/// URLs are both source forms of a folder.
        source = f"./{name}" if n % 2 else f"file://{folder}"
        lines += [
            f"  - id: tiny-{name}",
            "    kind: causal-lm",
            f"    source: {source}",
            "    device: cpu",
            "    dtype: float32",
            "    max_batch_size: 3",
            "    token_budget: 4096",
        ]
    path = root / "models.yaml"
    path.write_text("\n".join(lines) + "\n")
    return load_catalogue(path)


@pytest.fixture(scope="session")
def handlers(catalogue: Catalogue) -> dict[str, Any]:
    out = {}
    for entry in catalogue.models:
        spec = spec_of(entry, catalogue)
        assert spec.handler == "asyncinfer.models.kinds.causal_lm:CausalLMHandler"
        handler = spec.load_handler()
        handler.load()
        out[entry.id.removeprefix("tiny-")] = handler
    return out


class Trickle:
    """A WorkSource handing out one item per ``take``: jobs join a batch already decoding."""

    def __init__(self, items: list[WorkItem]) -> None:
        self.todo = list(items)
        self.results: dict[str, Result] = {}

    @property
    def stopping(self) -> bool:
        return not self.todo

    def take(self, max_items: int, timeout: float) -> list[WorkItem]:
        out, self.todo = self.todo[:1], self.todo[1:]
        return out

    def finish(self, item: WorkItem, result: Result) -> None:
        assert item.job_id not in self.results, "finished twice"
        self.results[item.job_id] = result


def job(job_id: str, **inp: Any) -> WorkItem:
    return WorkItem(job_id=job_id, input=GenerationInput.model_validate(inp))


def alone(handler: Any, it: WorkItem) -> Result:
    return handler.predict([WorkItem(job_id=it.job_id, input=it.input)])[0]


@pytest.mark.parametrize("arch", list(ARCHS))
def test_greedy_batched_equals_alone(handlers: dict[str, Any], arch: str) -> None:
    handler = handlers[arch]
    assert type(handler.model).__name__.lower().startswith(arch)
    items = [job(f"p{n}", prompt=p, max_new_tokens=5 + 3 * n) for n, p in enumerate(PROMPTS)]
    items.insert(2, job("chat", messages=[{"role": "user", "content": "Name a city."}]))
    items[-1].input.max_new_tokens = 9  # type: ignore[attr-defined]
    source = Trickle(items)
    handler.serve(source, 3)
    assert set(source.results) == {i.job_id for i in items}
    for it in items:
        got = source.results[it.job_id]
        assert isinstance(got, dict), got
        assert got == alone(handler, it), it.job_id
        usage, limit = got["usage"], it.input.max_new_tokens  # type: ignore[attr-defined]
        assert usage["prompt_tokens"] == handler.encode(it.input).shape[1]
        assert 1 <= usage["completion_tokens"] <= limit
        if got["finish_reason"] == "length":
            assert usage["completion_tokens"] == limit


@pytest.mark.parametrize("arch", list(ARCHS))
def test_chat_template_stop_strings_and_max_new_tokens(handlers: dict[str, Any], arch: str) -> None:
    handler = handlers[arch]
    messages = [{"role": "user", "content": "Say something."}]
    ids = handler.encode(GenerationInput.model_validate({"messages": messages}))[0].tolist()
    want = handler.tokenizer.apply_chat_template(messages, add_generation_prompt=True)
    if not isinstance(want, list):  # a BatchEncoding
        want = want["input_ids"]
    assert ids == list(want)
    assert "<|im_start|>user" in handler.tokenizer.decode(ids)
    long = alone(handler, job("a", messages=messages, max_new_tokens=24))
    assert isinstance(long, dict)
    assert long["usage"]["completion_tokens"] <= 24
    short = alone(handler, job("b", messages=messages, max_new_tokens=3))
    assert isinstance(short, dict)
    assert short["usage"]["completion_tokens"] <= 3
    if long["usage"]["completion_tokens"] >= 3:
        assert long["text"].startswith(short["text"])
    text = long["text"]
    if len(text.strip()) < 6:
        pytest.skip(f"{arch}: the random model wrote too little text for a stop string")
    stop = text.strip()[3:6]
    cut = alone(handler, job("c", messages=messages, max_new_tokens=24, stop=[stop]))
    assert isinstance(cut, dict)
    assert cut["text"] == text[: text.find(stop)]
    assert cut["finish_reason"] == "stop"
    assert cut["usage"]["completion_tokens"] <= long["usage"]["completion_tokens"]


def test_a_source_without_a_checkpoint_is_refused(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    (tmp_path / "models.yaml").write_text(
        "models:\n  - {id: broken, kind: causal-lm, source: ./empty, device: cpu}\n"
    )
    cat = load_catalogue(tmp_path / "models.yaml")
    handler = spec_of(cat.models[0], cat).load_handler()
    with pytest.raises(ConfigError, match=r"no config\.json"):
        handler.load()
    assert handler.model is None


def test_the_engine_notes_each_jobs_first_token(handlers: dict[str, Any]) -> None:
    """:attr:`WorkItem.first_token_at` (the worker's ``first_token_seconds``): set once, when
    the job's first token came, before its result."""
    import time

    items = [job(f"f{n}", prompt=p, max_new_tokens=4) for n, p in enumerate(PROMPTS[:3])]
    finished_at: dict[str, float] = {}

    class Timed(Trickle):
        def finish(self, item: WorkItem, result: Result) -> None:
            finished_at[item.job_id] = time.monotonic()
            super().finish(item, result)

    t0 = time.monotonic()
    handlers["llama"].serve(Timed(items), 3)
    for it in items:
        assert it.first_token_at is not None
        assert t0 < it.first_token_at <= finished_at[it.job_id]
