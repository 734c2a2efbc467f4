"""A batched decoding engine for causal language models: continuous batching over a left-padded
KV cache whose rows are added and removed between decoding steps.

Why not transformers' own continuous batching (``generate_batch`` / ``init_continuous_batching``,
transformers 5.x)? It fits part of the need (a paged KV cache, requests added while others decode,
``cancel_request``) but not the rest:

* sampling is batch-wide: ``do_sample`` and the random generator belong to the manager, so a batch
  cannot mix greedy and sampled jobs, and a job's ``seed`` cannot make *its* output repeatable
  whatever else shares the batch (we need a ``torch.Generator`` per row);
* it runs its own background thread and result queue, while the worker needs the decoding loop in
  its own thread to check each job for cancel, timeout and shutdown at every step, report
  progress and hand each result to ``WorkSource.finish`` the moment it is done;
* its paged-attention kernels are built for accelerators; on CPU they are slower than plain SDPA
  over a dense cache, and a greedy job's tokens are no longer those of ``generate`` alone;
* no stop strings, no token budget across the batch.

So this module schedules by itself, with the model's ordinary forward pass:

* **Prefill alone.** A new sequence's prompt runs through the model on its own (batch 1, no
  padding), exactly as ``generate`` would run it, and its first token is sampled from that.
* **Insert.** Its KV entries join the batch cache as a new row, left-padded (zeros, masked out)
  to the batch's width; when the new row is longer, the other rows get the padding instead.
* **Decode.** One forward pass per step for every active row: the last token of each row, its own
  position id (its count of real tokens), and the 2-D attention mask that hides the padding.
* **Remove.** A finished, cancelled or timed-out row is dropped between steps; columns that are
  padding in every remaining row are cut from the left.

Sampling is per row: temperature 0 takes the argmax; otherwise logits / temperature, nucleus
(``top_p``) filtering as transformers' ``TopPLogitsWarper`` does it, and a draw from the row's own
``torch.Generator`` seeded from the job's ``seed``.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

import torch


@dataclass(eq=False)
class Sequence:
    """One generation request inside the engine.

    Attributes:
        prompt_ids: the prompt's token ids.
        max_new_tokens: most tokens to generate (the end-of-sequence token counts).
        temperature: 0 for greedy decoding.
        top_p: nucleus sampling mass, (0, 1].
        seed: seeds this row's generator (random when ``None``).
        tag: anything the caller wants back (the work item).
        generated: the tokens generated so far.
        finished: why it ended (``"eos"`` or ``"length"``), ``None`` while it runs.
    """

    prompt_ids: list[int]
    max_new_tokens: int
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None
    tag: Any = None
    generated: list[int] = field(default_factory=list)
    finished: str | None = None
    generator: torch.Generator | None = None

    @property
    def reserved_tokens(self) -> int:
        """Tokens this sequence may hold in the cache: prompt plus ``max_new_tokens``."""
        return len(self.prompt_ids) + self.max_new_tokens


def sample(logits: torch.Tensor, seq: Sequence) -> int:
    """The next token of ``seq`` from its last-position ``logits`` (a 1-D float tensor)."""
    if seq.temperature <= 0:
        return int(torch.argmax(logits).item())
    scores = logits.float() / seq.temperature
    if seq.top_p < 1.0:
        # As TopPLogitsWarper: drop the tokens whose cumulative probability, sorted ascending,
        # is at most 1 - top_p (the most likely token always stays).
        sorted_logits, sorted_idx = torch.sort(scores, descending=False)
        cum = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
        remove = cum <= (1 - seq.top_p)
        remove[-1] = False
        scores = scores.scatter(0, sorted_idx, sorted_logits.masked_fill(remove, -float("inf")))
    probs = torch.softmax(scores, dim=-1)
    if seq.generator is None:
        seq.generator = torch.Generator().manual_seed(
            seq.seed if seq.seed is not None else random.getrandbits(63)
        )
    return int(torch.multinomial(probs, 1, generator=seq.generator).item())


class BatchedDecoder:
    """The active rows and their KV cache. Not thread-safe: one decoding loop owns it.

    Args:
        model: a transformers causal LM (``LlamaForCausalLM`` and the like) in eval mode.
        eos_ids: end-of-sequence token ids.
    """

    def __init__(self, model: Any, eos_ids: set[int]) -> None:
        self.model = model
        self.eos_ids = eos_ids
        self.rows: list[Sequence] = []
        self._kv: list[tuple[torch.Tensor, torch.Tensor]] = []  # per layer: [B, H, T, D] each
        self._mask = torch.zeros(0, 0, dtype=torch.long)  # [B, T]: 1 for real tokens
        self._cache: Any = None

    def __len__(self) -> int:
        return len(self.rows)

    @property
    def width(self) -> int:
        """Columns of the cache (the longest row, padding included)."""
        return int(self._mask.shape[1])

    @property
    def reserved_tokens(self) -> int:
        """Prompt plus ``max_new_tokens`` summed over the active rows."""
        return sum(s.reserved_tokens for s in self.rows)

    def reset(self) -> None:
        """Drop every row and the cache (after an out-of-memory error)."""
        self.rows = []
        self._kv = []
        self._mask = torch.zeros(0, 0, dtype=torch.long)
        self._cache = None

    # ------------------------------------------------------------------ rows
    def add(self, seq: Sequence) -> None:
        """Prefill ``seq`` alone, sample its first token, and add it as a row (unless that first
        token already finished it; then it is not added and ``seq.finished`` is set)."""
        from transformers import DynamicCache

        ids = torch.tensor([seq.prompt_ids], dtype=torch.long)
        cache = DynamicCache(config=self.model.config)
        with torch.inference_mode():
            out = self.model(input_ids=ids, cache=cache, use_cache=True, logits_to_keep=1)
        token = sample(out.logits[0, -1], seq)
        self._append(seq, token)
        if seq.finished:
            return
        kv = _layers_kv(cache)
        n = ids.shape[1]
        self._sync_from_cache()  # a step moved the batch's entries into the live cache
        row_mask = torch.ones(1, n, dtype=torch.long)
        if not self.rows:
            self._kv, self._mask = kv, row_mask
        else:
            width = self.width
            if n > width:
                self._kv = [(_pad_left(k, n - width), _pad_left(v, n - width)) for k, v in self._kv]
                self._mask = _pad_left_2d(self._mask, n - width)
            elif n < width:
                kv = [(_pad_left(k, width - n), _pad_left(v, width - n)) for k, v in kv]
                row_mask = _pad_left_2d(row_mask, width - n)
            self._kv = [
                (torch.cat([k0, k1]), torch.cat([v0, v1]))
                for (k0, v0), (k1, v1) in zip(self._kv, kv, strict=True)
            ]
            self._mask = torch.cat([self._mask, row_mask])
        self.rows.append(seq)
        self._cache = None

    def remove(self, seqs: list[Sequence]) -> None:
        """Drop ``seqs`` from the batch; cut columns that are padding in every remaining row."""
        gone = {id(s) for s in seqs}
        keep = [i for i, s in enumerate(self.rows) if id(s) not in gone]
        if len(keep) == len(self.rows):
            return
        if not keep:
            self.reset()
            return
        self._sync_from_cache()
        index = torch.tensor(keep, dtype=torch.long)
        mask = self._mask.index_select(0, index)
        lead = int((mask.cumsum(1) == 0).sum(1).min().item())  # all-padding columns on the left
        self._mask = mask[:, lead:]
        self._kv = [
            (k.index_select(0, index)[:, :, lead:], v.index_select(0, index)[:, :, lead:])
            for k, v in self._kv
        ]
        self.rows = [self.rows[i] for i in keep]
        self._cache = None

    # ------------------------------------------------------------------ decoding
    def step(self) -> list[Sequence]:
        """One decoding step for every row. Returns the rows that finished in it (still in the
        batch: the caller removes them, with any others it drops)."""
        if not self.rows:
            return []
        if self._cache is None:
            from transformers import DynamicCache

            self._cache = DynamicCache(ddp_cache_data=self._kv)
            self._kv = []
        last = torch.tensor([[s.generated[-1]] for s in self.rows], dtype=torch.long)
        positions = torch.tensor(
            [[len(s.prompt_ids) + len(s.generated) - 1] for s in self.rows], dtype=torch.long
        )
        self._mask = torch.cat([self._mask, torch.ones(len(self.rows), 1, dtype=torch.long)], 1)
        with torch.inference_mode():
            out = self.model(
                input_ids=last,
                attention_mask=self._mask,
                position_ids=positions,
                cache=self._cache,
                use_cache=True,
                logits_to_keep=1,
            )
        logits = out.logits[:, -1]
        done = []
        for i, seq in enumerate(self.rows):
            self._append(seq, sample(logits[i], seq))
            if seq.finished:
                done.append(seq)
        return done

    def _append(self, seq: Sequence, token: int) -> None:
        seq.generated.append(token)
        if token in self.eos_ids:
            seq.finished = "eos"
        elif len(seq.generated) >= seq.max_new_tokens:
            seq.finished = "length"

    def _sync_from_cache(self) -> None:
        if self._cache is not None:
            self._kv = _layers_kv(self._cache)
            self._cache = None


def _layers_kv(cache: Any) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The ``(keys, values)`` tensors of every layer of a ``DynamicCache``."""
    return [(layer.keys, layer.values) for layer in cache.layers]


def _pad_left(t: torch.Tensor, n: int) -> torch.Tensor:
    """``t`` ([B, H, T, D]) with ``n`` zero columns before T."""
    return torch.nn.functional.pad(t, (0, 0, n, 0))


def _pad_left_2d(t: torch.Tensor, n: int) -> torch.Tensor:
    return torch.nn.functional.pad(t, (n, 0))
