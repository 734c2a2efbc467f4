"""Device and dtype resolution of catalogue entries (issue 13 item 1), on this CPU-only host."""

from __future__ import annotations

import pytest
import torch

from asyncinfer.core.errors import ConfigError
from asyncinfer.models.device import for_spec, resolve
from asyncinfer.models.registry import MODELS


def test_auto_resolves_to_cpu_float32_without_cuda() -> None:
    p = resolve("auto", "auto", cuda=False)
    assert p.device == torch.device("cpu") and p.dtype == torch.float32 and p.name == "cpu"


def test_device_cuda_without_cuda_refuses_clearly() -> None:
    with pytest.raises(ConfigError, match="device: cuda but this host has no CUDA"):
        resolve("cuda", "auto", cuda=False)


def test_an_explicit_dtype_is_kept_and_a_bad_one_refused() -> None:
    assert resolve("cpu", "bfloat16", cuda=False).dtype == torch.bfloat16
    with pytest.raises(ConfigError, match="dtype"):
        resolve("cpu", "int8", cuda=False)


@pytest.mark.skipif(torch.cuda.is_available(), reason="this host has CUDA")
def test_the_default_catalogue_runs_on_cpu_float32_here() -> None:
    for model in ("smollm2-135m-instruct", "all-minilm-l6-v2"):
        p = for_spec(MODELS[model])
        assert (p.device.type, p.dtype) == ("cpu", torch.float32)


def test_kv_entry_bytes_of_smollm2_shape() -> None:
    from types import SimpleNamespace

    from asyncinfer.models.device import kv_budget, kv_entry_bytes

    cfg = SimpleNamespace(
        num_hidden_layers=30, num_key_value_heads=3, num_attention_heads=9, hidden_size=576
    )
    # 2 x 30 layers x 3 heads x 64 dims x 4 bytes: 32768 entries are 1.5 GB in fp32.
    assert kv_entry_bytes(cfg, 4) == 46080
    model = SimpleNamespace(device=torch.device("cpu"))
    assert kv_budget(model) is None  # on the CPU the handler's budget stays


def test_a_cuda_entry_refuses_to_load_on_this_host() -> None:
    """``device: cuda`` without CUDA: the handler refuses before loading any weights."""
    from dataclasses import replace

    from asyncinfer.models.minilm import MiniLMHandler
    from asyncinfer.models.smollm2 import SmolLM2Handler

    if torch.cuda.is_available():
        pytest.skip("this host has CUDA")
    for model, cls in (
        ("smollm2-135m-instruct", SmolLM2Handler),
        ("all-minilm-l6-v2", MiniLMHandler),
    ):
        spec = MODELS[model]
        assert spec.entry is not None
        cuda = replace(spec, entry=spec.entry.model_copy(update={"device": "cuda"}))
        handler = cls(spec=cuda)
        with pytest.raises(ConfigError, match="device: cuda"):
            handler.load()
        assert handler.model is None
