"""The model runner of the generation engine: a left-padded KV cache whose rows are added and
removed between decoding steps, and one forward pass per step for every row.

* **Prefill alone.** A new request's tokens run through the model on their own (batch 1, no
  padding), exactly as ``generate`` would run them, and its first token is sampled from that.
* **Insert.** Its KV entries join the batch cache as a new row, left-padded (zeros, masked out)
  to the batch's width; when the new row is longer, the other rows get the padding instead.
* **Decode.** One forward pass per step for every row: the last token of each row, its own
  position id (its count of cached tokens), and the 2-D attention mask that hides the padding.
  The step's keys and values are written in place into preallocated buffers: nothing of the
  cache is copied per step. Last tokens and position ids stay on the device; the sampled token
  ids are the one thing read back to the host per step.
* **Remove.** A finished, aborted or preempted row is dropped between steps (the last row moves
  into its place); columns that are padding in every remaining row leave the window (found from
  the rows' lengths, kept on the host).

Compute time (``Request.compute_seconds``, seconds of wall time on :data:`clock`): a prefill is
its own request's; a decoding step's time is split equally across the rows in it; the
compaction after a removal goes to the rows that stay.

The runner decides nothing: which requests to prefill, decode and drop is the
:class:`~asyncinfer.models.engine.scheduler.Scheduler`'s output, and the tokens it samples go back
to the scheduler (:class:`RunnerOutput`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from transformers.cache_utils import DynamicLayer

from asyncinfer.models.engine.request import Request
from asyncinfer.models.engine.sampling import sample_batch, sample_token

#: The clock of compute attribution, seconds (tests replace it).
clock: Callable[[], float] = time.perf_counter


@dataclass
class DecodeCounts:
    """Process-wide counts of the runners' work (``/metrics`` of ``serve-openai``, benchmarks):
    a count never changes what the runner does.

    Attributes:
        steps: decoding steps run (one forward pass each, every row of the batch in it).
        rows: rows decoded, summed over the steps (``rows / steps``: the mean batch size).
        prefills: prefills run (one request each).
    """

    steps: int = 0
    rows: int = 0
    prefills: int = 0


#: The counts of every :class:`BatchedDecoder` of this process.
COUNTS = DecodeCounts()


def _share(rows: list[Request], seconds: float) -> None:
    """Split ``seconds`` equally across ``rows``."""
    if rows:
        each = seconds / len(rows)
        for req in rows:
            req.compute_seconds += each


@dataclass
class RunnerOutput:
    """What one :meth:`BatchedDecoder.execute` did.

    Attributes:
        sampled: ``(request, token id)`` of every row decoded and every request prefilled.
        error: the exception that stopped the execution, if any.
        failed: the request whose prefill raised ``error`` (``None``: the decoding step did).
        not_run: admitted requests whose prefill was not tried because of ``error``.
    """

    sampled: list[tuple[Request, int]] = field(default_factory=list)
    error: BaseException | None = None
    failed: Request | None = None
    not_run: list[Request] = field(default_factory=list)


class BatchedDecoder:
    """The active rows and their KV cache. Not thread-safe: one decoding loop owns it.

    The cache lives in preallocated buffers, one key and one value tensor per layer of shape
    ``[row capacity, kv heads, column capacity, head dim]``, plus a ``[row capacity, column
    capacity]`` attention mask. The active rows are ``0 .. len(self) - 1`` and the active columns
    the window ``[start, end)``: row ``i``'s cached tokens are its last ``lens[i]`` columns. The
    buffers are reallocated only when rows or columns run out (each buffer assigned only once
    all of them are allocated, so an out-of-memory error leaves the cache as it was).

    Args:
        model: a transformers causal LM (``LlamaForCausalLM`` and the like) in eval mode.
    """

    def __init__(self, model: Any) -> None:
        self.model = model
        #: Where the cache, masks, position ids and sampling live: the model's device.
        self.device = getattr(model, "device", torch.device("cpu"))
        self.rows: list[Request] = []
        self._lens: list[int] = []  # cached tokens per row (host)
        self._k: list[torch.Tensor] = []  # per layer: [rows cap, H, cols cap, D]
        self._v: list[torch.Tensor] = []
        self._mask = torch.zeros(0, 0, dtype=torch.long, device=self.device)  # 1 = real token
        self._last = torch.zeros(0, dtype=torch.long, device=self.device)  # last token per row
        self._pos = torch.zeros(0, dtype=torch.long, device=self.device)  # its position id
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
        """Prompt plus ``max_new_tokens`` summed over the rows, tokens."""
        return sum(r.reserved_tokens for r in self.rows)

    def padded_tokens(self, extra: Request | None = None) -> int:
        """The most cache entries the rows (and ``extra``) can come to hold, padding included:
        rows x the largest ``reserved_tokens``, tokens."""
        rows = [*self.rows, *([extra] if extra is not None else [])]
        return len(rows) * max((r.reserved_tokens for r in rows), default=0)

    def reset(self) -> None:
        """Drop every row and the cache."""
        self.__init__(self.model)  # type: ignore[misc]

    # ------------------------------------------------------------------ one engine step
    def execute(
        self, *, removed: list[Request], decode: list[Request], prefill: list[Request]
    ) -> RunnerOutput:
        """Drop ``removed``, run one decoding step for ``decode`` (the rows then held), then
        prefill ``prefill`` in order (they decode from the next step on). Errors do not
        propagate: they are in the output, and an error stops the rest of the execution."""
        self.remove(removed)
        out = RunnerOutput()
        if decode:
            if {id(r) for r in decode} != {id(r) for r in self.rows}:
                raise RuntimeError("the scheduler's running requests are not the runner's rows")
            rows = list(self.rows)
            try:
                tokens = self.step()
            except Exception as err:
                out.error, out.not_run = err, list(prefill)
                return out
            out.sampled.extend(zip(rows, tokens, strict=True))
        for n, req in enumerate(prefill):
            try:
                out.sampled.append((req, self.add(req)))
            except Exception as err:
                out.error, out.failed, out.not_run = err, req, list(prefill[n + 1 :])
                break
        return out

    # ------------------------------------------------------------------ rows
    def add(self, req: Request) -> int:
        """Prefill ``req`` alone (its prompt and any tokens generated before a preemption),
        sample its next token and add it as a row; returns that token. The time it takes is
        ``req``'s compute time, even when it raises (then no row is added)."""
        t0 = clock()
        COUNTS.prefills += 1
        try:
            return self._add(req)
        finally:
            req.compute_seconds += clock() - t0

    def _add(self, req: Request) -> int:
        from transformers import DynamicCache

        tokens = req.all_token_ids
        ids = torch.tensor([tokens], dtype=torch.long, device=self.device)
        # Full (not sliding-window) layers: the row needs every key; the model's own mask
        # function applies any sliding window.
        cache = DynamicCache()
        with torch.inference_mode():
            out = self.model(input_ids=ids, cache=cache, use_cache=True, logits_to_keep=1)
            token = sample_token(out.logits[0, -1], req)
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
            self._last[b : b + 1] = token
            self._pos[b] = n
            first = int(token.item())
        self.rows.append(req)
        self._lens.append(n)
        return first

    def remove(self, reqs: list[Request]) -> None:
        """Drop ``reqs`` from the batch (the last row takes each one's place; requests that are
        not rows are ignored); leading columns that are padding in every remaining row leave
        the window."""
        gone = {id(r) for r in reqs}
        if not any(id(r) in gone for r in self.rows):
            return
        t0 = clock()
        try:
            self._remove(gone)
        finally:
            _share(self.rows or reqs, clock() - t0)

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
                    self._last[i] = self._last[last]
                    self._pos[i] = self._pos[last]
                    self.rows[i] = self.rows[last]
                    self._lens[i] = self._lens[last]
                self.rows.pop()
                self._lens.pop()
            if not self.rows:
                self._start = self._end = 0
                return
            self._start += min(self.width - n for n in self._lens)

    # ------------------------------------------------------------------ decoding
    def step(self) -> list[int]:
        """One decoding step for every row; returns each row's new token, in row order. Its
        time is split equally across the rows, even when it raises (then nothing changed but
        scratch columns past the window)."""
        if not self.rows:
            return []
        rows = list(self.rows)
        COUNTS.steps += 1
        COUNTS.rows += len(rows)
        t0 = clock()
        try:
            return self._step()
        finally:
            _share(rows, clock() - t0)

    def _step(self) -> list[int]:
        b = len(self.rows)
        with torch.inference_mode():
            self._reserve(rows=b, left=0, right=1)
            self._mask[:b, self._end] = 1
            out = self.model(
                input_ids=self._last[:b, None],
                attention_mask=self._mask[:b, self._start : self._end + 1],
                position_ids=self._pos[:b, None],
                cache=self._window_cache(),
                use_cache=True,
                logits_to_keep=1,
            )
            tokens = sample_batch(out.logits[:, -1], self.rows)
            ids: list[int] = tokens.tolist()  # the one device -> host transfer of the step
            self._end += 1
            self._last[:b] = tokens
            self._pos[:b] += 1
        self._lens = [n + 1 for n in self._lens]
        return ids

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
        after it, reallocating and copying the window only when needed. The first allocation
        takes its dtype, heads and head dim from ``like`` (a layer's prefill keys,
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
        if self._k:
            like, layers = self._k[0], len(self._k)
        assert like is not None, "the first allocation needs a layer's keys"
        _, heads, _, dim = like.shape
        shape = (new_rows, heads, new_cols, dim)
        with torch.inference_mode():
            new_k = [like.new_zeros(shape) for _ in range(layers)]
            new_v = [like.new_zeros(shape) for _ in range(layers)]
            mask = torch.zeros(new_rows, new_cols, dtype=torch.long, device=self.device)
            last = torch.zeros(new_rows, dtype=torch.long, device=self.device)
            pos = torch.zeros(new_rows, dtype=torch.long, device=self.device)
            end = new_start + width
            for new, old in zip((*new_k, *new_v), (*self._k, *self._v), strict=False):
                new[:b, :, new_start:end] = old[:b, :, s:e]
            if b:
                mask[:b, new_start:end] = self._mask[:b, s:e]
                last[:b] = self._last[:b]
                pos[:b] = self._pos[:b]
        # Everything is allocated: from here on nothing can run out of memory.
        self._k, self._v, self._mask, self._last, self._pos = new_k, new_v, mask, last, pos
        self._start, self._end = new_start, end
        self._cache = None

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
