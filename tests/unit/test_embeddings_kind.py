"""The ``embeddings`` kind (issue 13 item 3): any transformers encoder folder with ``pooling:
mean|cls`` and ``normalize``, checked on tiny random BERT and RoBERTa checkpoints against a hand
computation; batched texts equal each text alone; all-MiniLM-L6-v2 gives the vectors of the
handler it replaced."""

from __future__ import annotations

import math
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from asyncinfer.models.base import WorkItem, run_batch
from asyncinfer.models.kinds.embeddings import EmbeddingsHandler, text_token_limit
from asyncinfer.models.registry import MODELS
from asyncinfer.models.schemas import EmbeddingInput
from tests.unit.encoders import MAX_POSITIONS, minilm_folder, save_tiny_encoder, spec

TEXTS = [
    "a cat sat on the mat",
    "hello",
    "the stock market fell sharply on tuesday after the announcement",
    "it rained all day",
]


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("encoders")
    return {arch: save_tiny_encoder(root / arch, arch) for arch in ("bert", "roberta")}


def handler(folder: Path, **entry: Any) -> EmbeddingsHandler:
    h = spec({"id": "enc", "source": f"file://{folder}", **entry}, folder.parent).load_handler()
    assert isinstance(h, EmbeddingsHandler)
    h.load()
    return h


def hand(folder: Path, text: str) -> tuple[list[float], list[float]]:
    """(mean, cls) of one text, computed by hand from the model's last hidden states."""
    from transformers import AutoModel, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(folder))
    model = AutoModel.from_pretrained(str(folder), dtype=torch.float32).eval()
    enc = tok([text], return_tensors="pt")
    with torch.no_grad():
        hidden = model(**enc).last_hidden_state[0].tolist()  # [tokens][dim], no padding
    dim = len(hidden[0])
    mean = [sum(row[d] for row in hidden) / len(hidden) for d in range(dim)]
    return mean, hidden[0]


def unit(v: list[float]) -> list[float]:
    n = math.sqrt(sum(x * x for x in v))
    return [x / n for x in v]


def close(a: list[float], b: list[float], tol: float = 1e-5) -> bool:
    return len(a) == len(b) and max(abs(x - y) for x, y in zip(a, b, strict=True)) < tol


@pytest.mark.parametrize("arch", ["bert", "roberta"])
def test_mean_and_cls_pooling_match_a_hand_computation(folders: dict[str, Path], arch: str) -> None:
    folder = folders[arch]
    mean_h = handler(folder, pooling="mean", normalize=False)
    cls_h = handler(folder, pooling="cls", normalize=False)
    text = TEXTS[0]
    want_mean, want_cls = hand(folder, text)
    got_mean, got_cls = mean_h.embed([text])[0], cls_h.embed([text])[0]
    assert close(got_mean, want_mean) and close(got_cls, want_cls)
    assert not close(got_mean, got_cls, tol=1e-3)  # the two poolings differ
    assert mean_h.dim == cls_h.dim == 32


@pytest.mark.parametrize("arch", ["bert", "roberta"])
def test_normalize_gives_unit_vectors_in_the_same_direction(
    folders: dict[str, Path], arch: str
) -> None:
    raw = handler(folders[arch], normalize=False).embed(TEXTS)
    normed = handler(folders[arch], normalize=True).embed(TEXTS)
    for r, n in zip(raw, normed, strict=True):
        assert math.isclose(math.sqrt(sum(x * x for x in n)), 1.0, rel_tol=1e-5)
        assert not math.isclose(math.sqrt(sum(x * x for x in r)), 1.0, rel_tol=1e-2)
        assert close(n, unit(r))


@pytest.mark.parametrize("arch", ["bert", "roberta"])
@pytest.mark.parametrize("pooling", ["mean", "cls"])
def test_batched_jobs_equal_each_text_alone(
    folders: dict[str, Path], arch: str, pooling: str
) -> None:
    h = handler(folders[arch], pooling=pooling)
    h.CHUNK = 3  # several passes, each with padding
    jobs = [TEXTS[:1], TEXTS[1:3], TEXTS[3:]]
    items = [WorkItem(job_id=f"j{n}", input=EmbeddingInput(texts=t)) for n, t in enumerate(jobs)]
    results = run_batch(h, items)
    for res, texts in zip(results, jobs, strict=True):
        assert isinstance(res, dict) and res["dim"] == 32
        assert len(res["embeddings"]) == len(texts)
        for vec, text in zip(res["embeddings"], texts, strict=True):
            assert close(vec, h.embed([text])[0])


@pytest.mark.parametrize("arch", ["bert", "roberta"])
def test_texts_longer_than_the_positions_are_truncated(folders: dict[str, Path], arch: str) -> None:
    h = handler(folders[arch])
    # BERT: every position; RoBERTa: positions start after the padding id (0 here), so one less.
    assert h.max_tokens == (MAX_POSITIONS if arch == "bert" else MAX_POSITIONS - 1)
    long = " ".join(["word"] * 500)
    head = " ".join(["word"] * (h.max_tokens - 2))  # [CLS] + words + [SEP]
    assert close(h.embed([long])[0], h.embed([head])[0])


def test_token_limit_rules(tmp_path: Path) -> None:
    tok = SimpleNamespace(model_max_length=512)
    bert = SimpleNamespace(max_position_embeddings=512, model_type="bert", pad_token_id=0)
    xlmr = SimpleNamespace(max_position_embeddings=514, model_type="xlm-roberta", pad_token_id=1)
    assert text_token_limit(tmp_path, tok, bert) == 512
    assert text_token_limit(tmp_path, SimpleNamespace(model_max_length=10**30), xlmr) == 512
    (tmp_path / "sentence_bert_config.json").write_text('{"max_seq_length": 256}')
    assert text_token_limit(tmp_path, tok, bert) == 256
    assert text_token_limit(minilm_folder(), tok, bert) == 256


def test_minilm_entry_gives_the_vectors_of_the_handler_it_replaced() -> None:
    """The previous MiniLM handler's computation, inline: fp32, max_length 256, mean pooling
    over the attention mask, L2 normalisation, one padded pass."""
    from transformers import AutoModel, AutoTokenizer

    folder = minilm_folder()
    tok = AutoTokenizer.from_pretrained(str(folder))
    model = AutoModel.from_pretrained(str(folder)).eval()
    texts = [*TEXTS, "x " * 400]
    enc = tok(texts, padding=True, truncation=True, max_length=256, return_tensors="pt")
    with torch.inference_mode():
        hidden = model(**enc).last_hidden_state.float()
    mask = enc["attention_mask"].unsqueeze(-1).to(hidden.dtype)
    pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
    want = torch.nn.functional.normalize(pooled, p=2, dim=1).tolist()

    h = MODELS["all-minilm-l6-v2"].load_handler()
    assert isinstance(h, EmbeddingsHandler)
    h.load()
    assert (h.max_tokens, h.dim, h.pooling, h.normalize) == (256, 384, "mean", True)
    got = h.embed(texts)
    assert all(close(g, w) for g, w in zip(got, want, strict=True))


def test_an_entry_without_a_source_is_refused_at_load(tmp_path: Path) -> None:
    from dataclasses import replace

    from asyncinfer.core.errors import ConfigError

    s = spec({"id": "enc", "source": "x"}, tmp_path)
    assert s.entry is not None
    s = replace(s, entry=s.entry.model_copy(update={"source": None}))
    with pytest.raises(ConfigError, match="needs a source"):
        EmbeddingsHandler(spec=s).load()
