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
  position id (its count of real tokens), and the 2-D attention mask that hides the padding. The
  step's keys and values are written in place into preallocated buffers (see
  :class:`BatchedDecoder`): nothing of the cache is copied per step.
* **Remove.** A finished, cancelled or timed-out row is dropped between steps (the last row moves
  into its place); columns that are padding in every remaining row leave the window.

Compute time (``Sequence.compute_seconds``, seconds of wall time on :data:`clock`): a prefill is
its own sequence's; a decoding step's time is split equally across the rows in it; the
compaction after a removal goes to the rows that stay.

Sampling is per row (:func:`sample`): temperature 0 takes the argmax (one ``argmax`` over the
batch's logits per step); otherwise logits / temperature, the nucleus (``top_p``) as
transformers' ``TopPLogitsWarper`` defines it, and a draw from the row's own ``torch.Generator``
seeded from the job's ``seed``.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from transformers.cache_utils import DynamicLayer


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
        compute_seconds: this sequence's share of the engine's time so far, seconds (its
            prefill, and its share of each decoding step it was in).
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
    compute_seconds: float = 0.0

    @property
    def reserved_tokens(self) -> int:
        """Tokens this sequence may hold in the cache: prompt plus ``max_new_tokens``."""
        return len(self.prompt_ids) + self.max_new_tokens


#: The clock of compute attribution, seconds (tests replace it).
clock: Callable[[], float] = time.perf_counter


def _share(rows: list[Sequence], seconds: float) -> None:
    """Split ``seconds`` equally across ``rows``."""
    if rows:
        each = seconds / len(rows)
        for seq in rows:
            seq.compute_seconds += each


#: Candidates looked at first for nucleus sampling; the full vocabulary is sorted only when their
#: probability mass falls short of ``top_p``.
NUCLEUS_CANDIDATES = 256


def sample(logits: torch.Tensor, seq: Sequence) -> int:
    """The next token of ``seq`` from its last-position ``logits`` (a 1-D float tensor).

    Temperature 0 takes the argmax. Otherwise the distribution is ``softmax(logits /
    temperature)``, cut to the nucleus when ``top_p < 1`` and drawn from with the row's own
    ``torch.Generator``. The nucleus is the rule of transformers' ``TopPLogitsWarper``: the most
    likely tokens, in order, while the mass of those before each is below ``top_p`` (the most
    likely token always stays). It is found among the :data:`NUCLEUS_CANDIDATES` most likely
    tokens (``topk``) whenever their mass reaches ``top_p``, which it nearly always does, instead
    of sorting all 49k logits per token.
    """
    if seq.temperature <= 0:
        return int(torch.argmax(logits).item())
    if seq.generator is None:
        seq.generator = torch.Generator(device=logits.device).manual_seed(
            seq.seed if seq.seed is not None else random.getrandbits(63)
        )
    probs = torch.softmax(logits.float() / seq.temperature, dim=-1)
    if seq.top_p >= 1.0:
        return int(torch.multinomial(probs, 1, generator=seq.generator).item())
    top, idx = torch.topk(probs, min(NUCLEUS_CANDIDATES, probs.shape[-1]))
    if float(top.sum()) < seq.top_p:
        top, idx = torch.sort(probs, descending=True)
    before = top.cumsum(dim=-1) - top  # mass of the more likely tokens
    keep = top.masked_fill(before >= seq.top_p, 0.0)
    keep[0] = top[0]
    return int(idx[torch.multinomial(keep, 1, generator=seq.generator)].item())


class BatchedDecoder:
    """The active rows and their KV cache. Not thread-safe: one decoding loop owns it.

    The cache lives in preallocated buffers, one key and one value tensor per layer of shape
    ``[row capacity, kv heads, column capacity, head dim]``, plus a ``[row capacity, column
    capacity]`` attention mask. The active rows are ``0 .. len(self) - 1`` and the active columns
    the window ``[start, end)``: a decoding step writes its keys and values into column ``end``
    in place (no copy of the cache per step, as ``DynamicCache``'s concatenation would make),
    a removed row is replaced by the last row (one row copied), and leading columns that became
    padding in every row leave the window by moving ``start`` (nothing copied). The buffers are
    reallocated, doubling, only when rows or columns run out.

    Args:
        model: a transformers causal LM (``LlamaForCausalLM`` and the like) in eval mode.
        eos_ids: end-of-sequence token ids.
    """

    def __init__(self, model: Any, eos_ids: set[int]) -> None:
        self.model = model
        self.eos_ids = eos_ids
        #: Where the cache, masks, position ids and sampling live: the model's device (only the
        #: sampled token ids cross to the host per step).
        self.device = getattr(model, "device", torch.device("cpu"))
        self.rows: list[Sequence] = []
        self._k: list[torch.Tensor] = []  # per layer: [rows cap, H, cols cap, D]
        self._v: list[torch.Tensor] = []
        self._mask = torch.zeros(0, 0, dtype=torch.long, device=self.device)  # 1 = real token
        self._start = 0
        self._end = 0
        self._cache: Any = None

    def __len__(self) -> int:
        return len(self.rows)

    @property
    def width(self) -> int:
        """Columns of the active window (the longest row, padding included)."""
        return self._end - self._start

    @property
    def reserved_tokens(self) -> int:
        """Prompt plus ``max_new_tokens`` summed over the active rows."""
        return sum(s.reserved_tokens for s in self.rows)

    def padded_tokens(self, extra: Sequence | None = None) -> int:
        """The most cache entries the rows (and ``extra``, if given) can come to hold, padding
        included: rows x the largest ``reserved_tokens``. Rows are right-aligned, so the window
        is as wide as the longest row; a budget on this figure bounds the cache's memory, where
        a sum of tokens would let one long prompt pad every short row to its length."""
        rows = [*self.rows, *([extra] if extra is not None else [])]
        return len(rows) * max((r.reserved_tokens for r in rows), default=0)

    def reset(self) -> None:
        """Drop every row and the cache (after an out-of-memory error)."""
        self.rows = []
        self._k, self._v = [], []
        self._mask = torch.zeros(0, 0, dtype=torch.long, device=self.device)
        self._start = self._end = 0
        self._cache = None

    # ------------------------------------------------------------------ rows
    def add(self, seq: Sequence) -> None:
        """Prefill ``seq`` alone, sample its first token, and add it as a row (unless that first
        token already finished it; then it is not added and ``seq.finished`` is set). The time
        it takes is ``seq``'s compute time, even when it raises."""
        t0 = clock()
        try:
            self._add(seq)
        finally:
            seq.compute_seconds += clock() - t0

    def _add(self, seq: Sequence) -> None:
        from transformers import DynamicCache

        ids = torch.tensor([seq.prompt_ids], dtype=torch.long, device=self.device)
        cache = DynamicCache(config=self.model.config)
        with torch.inference_mode():
            out = self.model(input_ids=ids, cache=cache, use_cache=True, logits_to_keep=1)
            token = sample(out.logits[0, -1], seq)
            self._append(seq, token)
            if seq.finished:
                return
            kv = _prefill_kv(cache)
            n = ids.shape[1]
            b = len(self.rows)
            left = max(0, n - self.width)  # columns the window must grow by on the left
            self._reserve(rows=b + 1, left=left, right=1, like=kv[0][0], layers=len(kv))
            if left:
                # The existing rows get padding: zero keys and values (finite, so that masked
                # positions add exactly 0 to attention) and a 0 mask.
                new_start = self._start - left
                for t in (*self._k, *self._v):
                    t[:b, :, new_start : self._start] = 0
                self._mask[:b, new_start : self._start] = 0
                self._start = new_start
            s, e = self._start, self._end
            for (k, v), kb, vb in zip(kv, self._k, self._v, strict=True):
                kb[b, :, s : e - n] = 0
                vb[b, :, s : e - n] = 0
                kb[b, :, e - n : e] = k[0]
                vb[b, :, e - n : e] = v[0]
            self._mask[b, s : e - n] = 0
            self._mask[b, e - n : e] = 1
        self.rows.append(seq)

    def remove(self, seqs: list[Sequence]) -> None:
        """Drop ``seqs`` from the batch (the last row takes each one's place); leading columns
        that are padding in every remaining row leave the window."""
        gone = {id(s) for s in seqs}
        if not any(id(s) in gone for s in self.rows):
            return
        t0 = clock()
        try:
            self._remove(gone)
        finally:
            _share(self.rows or seqs, clock() - t0)

    def _remove(self, gone: set[int]) -> None:
        i = 0
        with torch.inference_mode():
            while i < len(self.rows):
                if id(self.rows[i]) not in gone:
                    i += 1
                    continue
                last = len(self.rows) - 1
                if i != last:
                    s, e = self._start, self._end
                    for t in (*self._k, *self._v):
                        t[i, :, s:e] = t[last, :, s:e]
                    self._mask[i, s:e] = self._mask[last, s:e]
                    self.rows[i] = self.rows[last]
                self.rows.pop()
            if not self.rows:
                self._start = self._end = 0
                return
            window = self._mask[: len(self.rows), self._start : self._end]
            self._start += int((window.cumsum(1) == 0).sum(1).min().item())

    # ------------------------------------------------------------------ decoding
    def step(self) -> list[Sequence]:
        """One decoding step for every row. Returns the rows that finished in it (still in the
        batch: the caller removes them, with any others it drops). Its time is split equally
        across the rows, even when it raises."""
        if not self.rows:
            return []
        rows = list(self.rows)
        t0 = clock()
        try:
            return self._step()
        finally:
            _share(rows, clock() - t0)

    def _step(self) -> list[Sequence]:
        b = len(self.rows)
        last = torch.tensor(
            [[s.generated[-1]] for s in self.rows], dtype=torch.long, device=self.device
        )
        positions = torch.tensor(
            [[len(s.prompt_ids) + len(s.generated) - 1] for s in self.rows],
            dtype=torch.long,
            device=self.device,
        )
        with torch.inference_mode():
            self._reserve(rows=b, left=0, right=1)
            self._mask[:b, self._end] = 1
            out = self.model(
                input_ids=last,
                attention_mask=self._mask[:b, self._start : self._end + 1],
                position_ids=positions,
                cache=self._window_cache(),
                use_cache=True,
                logits_to_keep=1,
            )
            self._end += 1
            logits = out.logits[:, -1]
            greedy = logits.argmax(dim=-1).tolist()
            done = []
            for i, seq in enumerate(self.rows):
                token = greedy[i] if seq.temperature <= 0 else sample(logits[i], seq)
                self._append(seq, token)
                if seq.finished:
                    done.append(seq)
        return done

    def _append(self, seq: Sequence, token: int) -> None:
        seq.generated.append(token)
        if token in self.eos_ids:
            seq.finished = "eos"
        elif len(seq.generated) >= seq.max_new_tokens:
            seq.finished = "length"

    # ------------------------------------------------------------------ buffers
    def _reserve(
        self,
        *,
        rows: int,
        left: int,
        right: int,
        like: torch.Tensor | None = None,
        layers: int = 0,
    ) -> None:
        """Make room for ``rows`` rows, ``left`` more columns before the window and ``right``
        after it, reallocating (doubling) and copying the window only when needed. The first
        allocation takes its dtype, heads and head dim from ``like`` (a layer's prefill keys,
        ``[1, H, n, D]``) and the number of ``layers``."""
        cap_rows, cap_cols = self._mask.shape
        if rows <= cap_rows and self._start >= left and self._end + right <= cap_cols:
            return
        width = self.width
        new_rows = max(cap_rows, 1)
        while new_rows < rows:
            new_rows *= 2
        # Grow by half the window at least (a reallocation copies the window: amortised over
        # many steps), not by doubling the capacity (the cache is most of the memory).
        new_cols = max(cap_cols, width + left + right + max(64, width // 2))
        # Room on both sides: new rows' prompts may be longer than the window.
        new_start = left + (new_cols - width - left - right) // 4
        b, s, e = len(self.rows), self._start, self._end
        old_k, old_v, old_mask = self._k, self._v, self._mask
        if old_k:
            like, layers = old_k[0], len(old_k)
        assert like is not None, "the first allocation needs a layer's keys"
        _, heads, _, dim = like.shape
        shape = (new_rows, heads, new_cols, dim)
        with torch.inference_mode():
            self._k = [like.new_zeros(shape) for _ in range(layers)]
            self._v = [like.new_zeros(shape) for _ in range(layers)]
            self._mask = torch.zeros(new_rows, new_cols, dtype=torch.long, device=self.device)
            self._start, self._end = new_start, new_start + width
            for new, old in zip((*self._k, *self._v), (*old_k, *old_v), strict=False):
                new[:b, :, new_start : self._end] = old[:b, :, s:e]
            if b:
                self._mask[:b, new_start : self._end] = old_mask[:b, s:e]

    def _window_cache(self) -> Any:
        """A transformers ``Cache`` whose layers write the step's keys and values into column
        ``end`` of the buffers and return the window's views."""
        if self._cache is None:
            from transformers.cache_utils import Cache

            self._cache = Cache(layers=[_WindowLayer(self, i) for i in range(len(self._k))])
        return self._cache


def _prefill_kv(cache: Any) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The ``(keys, values)`` of every layer of a prefill's ``DynamicCache``, ``[1, H, n, D]``."""
    return [(layer.keys, layer.values) for layer in cache.layers]


class _WindowLayer(DynamicLayer):
    """One layer of :class:`BatchedDecoder`'s cache, as transformers' attention sees it: ``update``
    writes the step's keys and values (``[rows, H, 1, D]``) into column ``end`` of the engine's
    buffers and returns the window ``[start, end + 1)`` as views (no copy)."""

    def __init__(self, engine: BatchedDecoder, index: int) -> None:
        super().__init__()
        self.engine = engine
        self.index = index
        self.is_initialized = True

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        e = self.engine
        rows, n, col = key_states.shape[0], key_states.shape[2], e._end
        keys, values = e._k[self.index], e._v[self.index]
        keys[:rows, :, col : col + n] = key_states
        values[:rows, :, col : col + n] = value_states
        return keys[:rows, :, e._start : col + n], values[:rows, :, e._start : col + n]

    def get_seq_length(self) -> int:
        return self.engine.width

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.engine.width + query_length, 0
