"""Where a model runs: the catalogue entry's ``device`` and ``dtype`` resolved on this host
(shared/spec/models.md; issue 13 item 1).

``device: auto`` is CUDA where the host has a GPU, else the CPU. ``dtype: auto`` is bfloat16 on
a CUDA device that supports it, float16 on one that does not, and float32 on the CPU. An entry
that says ``device: cuda`` on a host without CUDA is refused (:class:`ConfigError`) rather than
run on the CPU.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from asyncinfer.core.errors import ConfigError

#: dtype names of the catalogue -> torch attribute names.
DTYPES = ("float32", "bfloat16", "float16")


@dataclass(frozen=True)
class Placement:
    """A resolved device and dtype.

    Attributes:
        device: a ``torch.device`` (``cpu`` or ``cuda``).
        dtype: a ``torch.dtype`` (``float32``, ``bfloat16`` or ``float16``).
        name: the device's name for the logs (``cpu`` or the GPU's name).
    """

    device: Any
    dtype: Any
    name: str


def resolve(device: str = "auto", dtype: str = "auto", *, cuda: bool | None = None) -> Placement:
    """Resolve ``device`` (``auto``, ``cuda``, ``cpu``) and ``dtype`` (``auto`` or one of
    :data:`DTYPES`) on this host; ``cuda`` overrides ``torch.cuda.is_available()`` (tests).

    Raises:
        ConfigError: ``device: cuda`` where CUDA is not available, or an unknown name.
    """
    import torch

    has_cuda = torch.cuda.is_available() if cuda is None else cuda
    if device not in ("auto", "cuda", "cpu"):
        raise ConfigError(f"device {device!r}: must be auto, cuda or cpu")
    if device == "cuda" and not has_cuda:
        raise ConfigError(
            "the catalogue entry says device: cuda but this host has no CUDA device "
            "(torch.cuda.is_available() is false: no GPU, no driver, or a CPU build of torch); "
            "refusing to run on the CPU. Use device: auto or cpu, or run on a GPU host."
        )
    on_cuda = device == "cuda" or (device == "auto" and has_cuda)
    if dtype == "auto":
        if on_cuda:
            dtype = "bfloat16" if torch.cuda.is_bf16_supported() else "float16"
        else:
            dtype = "float32"
    if dtype not in DTYPES:
        raise ConfigError(f"dtype {dtype!r}: must be auto or one of {', '.join(DTYPES)}")
    if on_cuda:
        return Placement(torch.device("cuda"), getattr(torch, dtype), torch.cuda.get_device_name())
    return Placement(torch.device("cpu"), getattr(torch, dtype), "cpu")


def for_spec(spec: Any) -> Placement:
    """:func:`resolve` for a :class:`~asyncinfer.models.registry.ModelSpec` (its entry's
    ``device`` and ``dtype``; ``auto`` for a spec without an entry)."""
    entry = getattr(spec, "entry", None)
    if entry is None:
        return resolve()
    return resolve(entry.device, entry.dtype)


#: Share of the free accelerator memory (after the weights) that ``token_budget: auto`` gives
#: the KV cache; the rest is headroom for activations, logits and the allocator's fragmentation.
KV_MEMORY_SHARE = 0.7


def free_bytes(dev: Any) -> int | None:
    """Free memory of a CUDA ``dev`` now, bytes (``torch.cuda.mem_get_info``); ``None`` on the
    CPU."""
    import torch

    if getattr(dev, "type", "cpu") != "cuda":
        return None
    free, _total = torch.cuda.mem_get_info(dev)
    return int(free)


def kv_entry_bytes(config: Any, dtype_bytes: int) -> int:
    """Bytes of one token's KV cache entries: ``2 (keys, values) x layers x kv heads x head dim
    x dtype bytes``, from a transformers config."""
    layers = int(config.num_hidden_layers)
    heads = int(getattr(config, "num_key_value_heads", None) or config.num_attention_heads)
    dim = int(getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads)
    return 2 * layers * heads * dim * dtype_bytes


def kv_budget(model: Any) -> int | None:
    """``token_budget: auto`` on CUDA, tokens: ``KV_MEMORY_SHARE x free memory after the
    weights / kv_entry_bytes`` (the engine's buffers double when they grow, so the share keeps
    room for one reallocation's copy of a smaller cache); ``None`` on the CPU (the handler's
    default budget applies)."""
    free = free_bytes(model.device)
    if free is None:
        return None
    per = kv_entry_bytes(model.config, next(model.parameters()).element_size())
    return max(1, int(KV_MEMORY_SHARE * free / per))
