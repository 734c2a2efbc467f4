"""The ``embeddings`` kind (shared/spec/models.md, "Kinds"): any transformers encoder checkpoint
folder (BERT, RoBERTa, XLM-R, MiniLM, MPNet, DistilBERT, ...) turned into one vector per text.

The entry's ``pooling`` is ``mean`` (the average of the last hidden states over the text's
tokens, padding left out: what sentence-transformers' mean pooling computes) or ``cls`` (the
first token's last hidden state); ``normalize: true`` scales each vector to unit L2 norm. The
model runs on the entry's ``device`` / ``dtype`` (:mod:`asyncinfer.models.device`); pooling and
normalising run in float32 whatever the dtype.

Texts longer than the model's limit are truncated to it (:func:`text_token_limit`): the
checkpoint's ``sentence_bert_config.json`` ``max_seq_length`` where it has one (256 for
all-MiniLM-L6-v2), else the smaller of the tokenizer's ``model_max_length`` and the position
embeddings' length (less RoBERTa's padding offset). The texts of every job of a batch run
together, :attr:`EmbeddingsHandler.CHUNK` per forward pass, ordered by length so that texts of
similar length share a pass (less padding); each vector is the same as the text's alone up to
float rounding. An out-of-memory error fails the call, and the worker's out-of-memory split
(:func:`asyncinfer.models.base.run_batch`) runs its jobs again one at a time.
"""

from __future__ import annotations

import inspect
import json
import logging
import time
from pathlib import Path
from typing import Any

from asyncinfer.core.errors import ConfigError, JobError, WorkerStopping
from asyncinfer.core.settings_parts import ModelSettings
from asyncinfer.models import device
from asyncinfer.models.base import ModelHandler, Result, WorkItem
from asyncinfer.models.schemas import EmbeddingInput

log = logging.getLogger("asyncinfer.models.embeddings")

#: Token limit when neither the checkpoint nor its tokenizer says one.
DEFAULT_TOKEN_LIMIT = 512
#: ``model_type`` values whose position ids start after the padding id (``padding_idx + 1``),
#: so ``max_position_embeddings - padding_idx - 1`` positions are usable (514 -> 512).
_OFFSET_POSITIONS = {"roberta", "xlm-roberta", "camembert", "longformer", "xlm-roberta-xl"}
#: A tokenizer's ``model_max_length`` at or above this means "not set" (transformers' 1e30).
_UNSET = 1_000_000


def text_token_limit(folder: Path, tokenizer: Any, config: Any) -> int:
    """Most tokens of one text the model reads (longer texts are truncated), tokens.

    Args:
        folder: the checkpoint folder (``sentence_bert_config.json`` is read from it).
        tokenizer: its tokenizer (``model_max_length``).
        config: its transformers config (``max_position_embeddings``, ``model_type``,
            ``pad_token_id``).
    """
    limits: list[int] = []
    st = folder / "sentence_bert_config.json"
    if st.exists():
        try:
            seq = json.loads(st.read_text()).get("max_seq_length")
        except (OSError, ValueError, AttributeError):
            seq = None
        if isinstance(seq, int) and seq > 0:
            limits.append(seq)
    mml = getattr(tokenizer, "model_max_length", None)
    if isinstance(mml, int) and 0 < mml < _UNSET:
        limits.append(mml)
    positions = getattr(config, "max_position_embeddings", None)
    if isinstance(positions, int) and positions > 0:
        offset = 0
        if getattr(config, "model_type", "") in _OFFSET_POSITIONS:
            pad = getattr(config, "pad_token_id", None)
            offset = (1 if pad is None else int(pad)) + 1
        limits.append(positions - offset)
    return min(limits) if limits else DEFAULT_TOKEN_LIMIT


def pool(hidden: Any, mask: Any, pooling: str, normalize: bool) -> Any:
    """One vector per row of ``hidden`` (``[texts, tokens, dim]``, any float dtype) with
    ``mask`` (``[texts, tokens]``, 1 for a text's tokens, 0 for padding): ``mean`` or ``cls``
    pooling, then unit L2 norm when ``normalize``. Returns a float32 ``[texts, dim]`` tensor."""
    import torch

    hidden = hidden.float()
    if pooling == "cls":
        pooled = hidden[:, 0]
    elif pooling == "mean":
        m = mask.unsqueeze(-1).to(hidden.dtype)
        pooled = (hidden * m).sum(1) / m.sum(1).clamp(min=1e-9)
    else:
        raise ConfigError(f"pooling {pooling!r}: must be mean or cls")
    if normalize:
        pooled = torch.nn.functional.normalize(pooled, p=2, dim=1)
    return pooled


class EmbeddingsHandler(ModelHandler):
    """Embeddings of an encoder checkpoint: the ``embeddings`` kind's handler.

    Input per job: ``{"texts": [1..256 strings]}`` (:class:`EmbeddingInput`). Output per job:
    ``{"embeddings": [[dim floats] per text], "dim": dim}``, ``dim`` being the checkpoint's
    ``hidden_size``.

    Attributes:
        model / tokenizer: the loaded encoder and its tokenizer (``None`` before :meth:`load`).
        max_tokens: the per-text token limit (:func:`text_token_limit`), once loaded.
        placement: the resolved device and dtype, once loaded.
    """

    #: Texts per forward pass.
    CHUNK = 64

    def __init__(
        self, *, spec: Any, cache_dir: Any = None, settings: ModelSettings | None = None
    ) -> None:
        super().__init__(spec=spec, cache_dir=cache_dir, settings=settings)
        self.model: Any = None
        self.tokenizer: Any = None
        self.max_tokens: int = DEFAULT_TOKEN_LIMIT
        self.placement: device.Placement | None = None
        self._dim: int | None = None
        self._inputs: frozenset[str] = frozenset()
        self._folder: Path | None = None

    @property
    def pooling(self) -> str:
        """The entry's ``pooling`` (``mean`` without an entry)."""
        entry = getattr(self.spec, "entry", None)
        return entry.pooling if entry is not None else "mean"

    @property
    def normalize(self) -> bool:
        """The entry's ``normalize`` (``True`` without an entry)."""
        entry = getattr(self.spec, "entry", None)
        return entry.normalize if entry is not None else True

    def folder(self) -> Path:
        """The checkpoint folder of the entry's ``source`` (an ``s3://`` one is downloaded
        first, :mod:`asyncinfer.models.weights`).

        Raises:
            ConfigError: the entry has no source.
        """
        if self._folder is None:
            folder = self.spec.source_dir(self.settings)
            if folder is None:
                raise ConfigError(f"model {self.spec.id!r}: an embeddings entry needs a source")
            self._folder = Path(folder)
        return self._folder

    @property
    def dim(self) -> int:
        """Floats per vector: the checkpoint's ``hidden_size`` (read from ``config.json``
        without loading the model when it is not loaded)."""
        if self._dim is None:
            if self.model is not None:
                self._dim = int(self.model.config.hidden_size)
            else:
                config = json.loads((self.folder() / "config.json").read_text())
                self._dim = int(config.get("hidden_size") or config["dim"])
        return self._dim

    def load(self) -> None:
        """Load the tokenizer and encoder on the entry's device and dtype (once).

        Raises:
            ConfigError: ``device: cuda`` on a host without CUDA (before any weights are read),
                or an entry without a source.
        """
        if self.model is not None:
            return
        from transformers import AutoModel, AutoTokenizer

        place = device.for_spec(self.spec)  # ConfigError: device: cuda on a CPU host
        folder = self.folder()
        t0 = time.monotonic()
        tokenizer = AutoTokenizer.from_pretrained(str(folder))
        model = AutoModel.from_pretrained(str(folder), dtype=place.dtype)
        if place.device.type != "cpu":
            model = model.to(device=place.device)
        model.eval()
        self.tokenizer, self.placement = tokenizer, place
        self.max_tokens = text_token_limit(folder, tokenizer, model.config)
        self._inputs = frozenset(inspect.signature(model.forward).parameters)
        self._dim = int(model.config.hidden_size)
        self.model = model
        weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
        free = device.free_bytes(place.device)
        log.info(
            "model %s: %s on %s (%s), %s, %.1f MB of weights, free memory %s, dim %d, "
            "pooling %s, normalize %s, %d tokens per text; loaded in %.2fs",
            self.spec.id,
            type(model).__name__,
            place.device.type,
            place.name,
            str(place.dtype).removeprefix("torch."),
            weight_bytes / 1e6,
            "n/a" if free is None else f"{free / 1e9:.1f} GB",
            self._dim,
            self.pooling,
            self.normalize,
            self.max_tokens,
            time.monotonic() - t0,
        )

    def embed(self, texts: list[str]) -> list[list[float]]:
        """One vector of :attr:`dim` floats per text, in order (see the module docstring).

        Raises:
            torch.OutOfMemoryError / RuntimeError: a pass did not fit in memory.
        """
        import torch

        order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
        out: list[list[float] | None] = [None] * len(texts)
        for start in range(0, len(order), self.CHUNK):
            idx = order[start : start + self.CHUNK]
            enc = self.tokenizer(
                [texts[i] for i in idx],
                padding=True,
                truncation=True,
                max_length=self.max_tokens,
                return_tensors="pt",
            )
            feed = {k: v.to(self.model.device) for k, v in enc.items() if k in self._inputs}
            with torch.inference_mode():
                hidden = self.model(**feed).last_hidden_state
                vectors = pool(hidden, feed["attention_mask"], self.pooling, self.normalize)
            for i, vec in zip(idx, vectors.cpu().tolist(), strict=True):
                out[i] = vec
        return [v for v in out if v is not None]

    def predict(self, items: list[WorkItem]) -> list[Result]:
        """Embed the texts of every item in one call of :meth:`embed`; an interrupted item
        (cancel, timeout, stop) gets its interruption instead."""
        texts: list[str] = []
        spans: list[tuple[int, int]] = []
        results: list[Result | None] = [None] * len(items)
        for n, item in enumerate(items):
            exc = item.interruption()
            if exc is not None:
                results[n] = exc if isinstance(exc, (JobError, WorkerStopping)) else None
                continue
            inp = item.input
            assert isinstance(inp, EmbeddingInput)
            spans.append((n, len(texts)))
            texts.extend(inp.texts)
        vectors = self.embed(texts) if texts else []
        dim = self.dim if spans else 0
        for idx, (n, start) in enumerate(spans):
            end = spans[idx + 1][1] if idx + 1 < len(spans) else len(texts)
            results[n] = {"embeddings": vectors[start:end], "dim": dim}
        return [r for r in results if r is not None]
