"""Continuous batching of SmolLM2 (:mod:`asyncinfer.models.engine` and the handler's
``serve``), against an in-memory work source: greedy outputs equal those of a job run alone,
mixed sampling parameters, slots freed for waiting jobs, one job cancelled among others, the
token budget, out-of-memory errors."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from asyncinfer.core.errors import InvalidInput, JobCancelled, JobTimeout, OutOfMemory
from asyncinfer.models.base import Result, WorkItem
from asyncinfer.models.engine import BatchedDecoder
from asyncinfer.models.registry import MODELS
from asyncinfer.models.schemas import GenerationInput
from asyncinfer.models.smollm2 import SmolLM2Handler

PROMPTS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Explain photosynthesis to a child, with two examples and a one-line summary at the end.",
    "1+1=?",
    "List three colors.",
]


@pytest.fixture(scope="module")
def handler() -> SmolLM2Handler:
    h = SmolLM2Handler(spec=MODELS["smollm2-135m-instruct"])
    h.load()
    return h


class Source:
    """A WorkSource over a list; records the order in which items finish."""

    def __init__(self, items: list[WorkItem]) -> None:
        self.todo = list(items)
        self.results: dict[str, Result] = {}
        self.order: list[str] = []
        self.taken: list[str] = []

    @property
    def stopping(self) -> bool:
        return not self.todo

    def take(self, max_items: int, timeout: float) -> list[WorkItem]:
        out, self.todo = self.todo[:max_items], self.todo[max_items:]
        self.taken.extend(i.job_id for i in out)
        return out

    def finish(self, item: WorkItem, result: Result) -> None:
        assert item.job_id not in self.results, "finished twice"
        self.results[item.job_id] = result
        self.order.append(item.job_id)


class CancelAfter(threading.Event):
    """An event that reads as set from its ``n``-th check on (a cancel at a chosen step)."""

    def __init__(self, n: int) -> None:
        super().__init__()
        self.n = n

    def is_set(self) -> bool:
        self.n -= 1
        return self.n < 0


def item(job_id: str, **inp: Any) -> WorkItem:
    if "prompt" not in inp and "messages" not in inp:
        inp["messages"] = [{"role": "user", "content": PROMPTS[int(job_id[-1]) % len(PROMPTS)]}]
    return WorkItem(job_id=job_id, input=GenerationInput.model_validate(inp))


def alone(handler: SmolLM2Handler, it: WorkItem) -> Result:
    fresh = WorkItem(job_id=it.job_id, input=it.input)
    return handler.predict([fresh])[0]


def run(handler: SmolLM2Handler, items: list[WorkItem], batch: int) -> Source:
    source = Source(items)
    handler.serve(source, batch)
    assert set(source.results) == {i.job_id for i in items}
    return source


def test_greedy_batched_equals_alone_and_generate(handler: SmolLM2Handler) -> None:
    import torch

    items = [item(f"j{n}", max_new_tokens=12 + 5 * n) for n in range(len(PROMPTS))]
    items.append(item("j5", prompt="The three primary colors are", max_new_tokens=14))
    source = run(handler, items, batch=3)
    for it in items:
        got = source.results[it.job_id]
        assert isinstance(got, dict)
        assert got == alone(handler, it), it.job_id
        assert got["usage"]["completion_tokens"] <= it.input.max_new_tokens  # type: ignore[attr-defined]
    # Alone, the engine gives what transformers' generate gives.
    for it in items[:2]:
        ids = handler.encode(it.input)  # type: ignore[arg-type]
        with torch.inference_mode():
            out = handler.model.generate(
                input_ids=ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=it.input.max_new_tokens,  # type: ignore[attr-defined]
                do_sample=False,
                pad_token_id=handler.tokenizer.eos_token_id,
            )
        text = handler.tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=True)
        assert source.results[it.job_id]["text"] == text  # type: ignore[index]
    paris = source.results["j0"]
    assert isinstance(paris, dict) and "Paris" in paris["text"]
    assert paris["finish_reason"] == "stop"


def test_mixed_sampling_parameters_are_per_job(handler: SmolLM2Handler) -> None:
    items = [
        item("j0", max_new_tokens=10),
        item("j1", max_new_tokens=16, temperature=0.9, top_p=0.9, seed=7),
        item("j2", max_new_tokens=8, temperature=1.3, seed=11),
        item("j3", max_new_tokens=12, temperature=0.7, top_p=0.5, seed=3),
        item("j4", max_new_tokens=20, stop=[","]),
    ]
    source = run(handler, items, batch=5)
    for it in items:
        assert source.results[it.job_id] == alone(handler, it), it.job_id
    stopped = source.results["j4"]
    assert isinstance(stopped, dict) and "," not in stopped["text"]
    # Another seed gives (almost surely) another text.
    other = alone(handler, item("j1", max_new_tokens=16, temperature=0.9, top_p=0.9, seed=8))
    assert other != source.results["j1"]


def test_finished_sequence_frees_its_slot(handler: SmolLM2Handler) -> None:
    items = [
        item("j0", max_new_tokens=3),
        item("j1", max_new_tokens=30),
        item("j2", max_new_tokens=3),
    ]
    source = run(handler, items, batch=2)
    # j2 waited for a slot, took j0's, and ended while j1 still ran.
    assert source.order == ["j0", "j2", "j1"]


def test_cancelling_one_job_leaves_the_others_alone(handler: SmolLM2Handler) -> None:
    items = [item(f"j{n}", max_new_tokens=16) for n in range(3)]
    items[1].cancel_event = CancelAfter(6)
    source = run(handler, items, batch=3)
    cancelled = source.results["j1"]
    assert isinstance(cancelled, JobCancelled)
    assert cancelled.partial is not None
    assert cancelled.partial["finish_reason"] == "cancelled"
    assert 0 < cancelled.partial["usage"]["completion_tokens"] < 16
    for n in (0, 2):
        assert source.results[f"j{n}"] == alone(handler, items[n])


def test_timeout_fails_only_that_job(handler: SmolLM2Handler) -> None:
    items = [item("j0", max_new_tokens=6), item("j1", max_new_tokens=6)]
    items[1].deadline = 0.0
    source = run(handler, items, batch=2)
    assert isinstance(source.results["j1"], JobTimeout)
    assert isinstance(source.results["j0"], dict)


def test_token_budget(handler: SmolLM2Handler, monkeypatch: pytest.MonkeyPatch) -> None:
    small = SmolLM2Handler(spec=handler.spec, token_budget=80)
    small.model, small.tokenizer, small.eos_ids = handler.model, handler.tokenizer, handler.eos_ids
    seen: list[int] = []
    real_step = BatchedDecoder.step

    def step(self: BatchedDecoder) -> Any:
        seen.append(self.reserved_tokens)
        return real_step(self)

    monkeypatch.setattr(BatchedDecoder, "step", step)
    items = [
        item("j0", prompt="Hello there, how", max_new_tokens=40),
        item("j1", prompt="Once upon a time", max_new_tokens=40),
        item("j2", prompt="too long", max_new_tokens=200),
        item("j3", prompt="The sky is", max_new_tokens=8),
    ]
    source = run(small, items, batch=4)
    assert isinstance(source.results["j2"], InvalidInput)
    assert source.results["j2"].code == "invalid_input"
    for n in (0, 1, 3):
        assert isinstance(source.results[f"j{n}"], dict)
    assert seen and max(seen) <= 80


def test_out_of_memory_in_a_step_preempts_the_newest_row_and_goes_on(
    handler: SmolLM2Handler, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 13 item 1: an out-of-memory error in a decoding step of several rows evicts the
    newest row back to the waiting queue (vLLM's preemption); nothing fails that fits alone."""
    real_step = BatchedDecoder.step
    calls = [0]

    def step(self: BatchedDecoder) -> Any:
        calls[0] += 1
        if calls[0] == 2:
            raise MemoryError("simulated")
        return real_step(self)

    monkeypatch.setattr(BatchedDecoder, "step", step)
    items = [
        item("j0", max_new_tokens=8),
        item("j1", max_new_tokens=8),
        item("j2", max_new_tokens=4),
    ]
    source = run(handler, items, batch=2)
    for n in range(3):
        got = source.results[f"j{n}"]
        assert isinstance(got, dict), got
        assert 0 < got["usage"]["completion_tokens"] <= items[n].input.max_new_tokens  # type: ignore[attr-defined]
    assert source.results["j0"] == alone(handler, items[0])
    assert source.results["j2"] == alone(handler, items[2])
    assert source.order.index("j0") < source.order.index("j1")


def test_out_of_memory_of_a_row_alone_fails_only_that_row(
    handler: SmolLM2Handler, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A row that runs out of memory even alone fails with ``out_of_memory`` (after the newer
    row was preempted for it); the accelerator cache is emptied; the other jobs go on."""
    import torch

    real_step = BatchedDecoder.step
    emptied = [0]
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: emptied.__setitem__(0, emptied[0] + 1))

    def step(self: BatchedDecoder) -> Any:
        if any(r.request_id == "j0" for r in self.rows):
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return real_step(self)

    monkeypatch.setattr(BatchedDecoder, "step", step)
    items = [
        item("j0", max_new_tokens=8),
        item("j1", max_new_tokens=8),
        item("j2", max_new_tokens=4),
    ]
    source = run(handler, items, batch=2)
    assert isinstance(source.results["j0"], OutOfMemory)
    assert source.results["j0"].code == "out_of_memory"
    assert isinstance(source.results["j1"], dict)
    assert source.results["j2"] == alone(handler, items[2])
    assert emptied[0] >= 2  # after the preemption and after the failure


def test_progress_reports_partial_output(
    handler: SmolLM2Handler, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("asyncinfer.models.engine.serving.PROGRESS_INTERVAL", 0.0)
    reports: list[tuple[int, dict[str, Any]]] = []
    it = item("j0", max_new_tokens=5)
    it.on_progress = lambda n, partial: reports.append((n, partial))
    source = run(handler, [it], batch=1)
    assert reports and reports[0][1]["finish_reason"] is None
    assert [n for n, _ in reports] == sorted(n for n, _ in reports)
    final = source.results["j0"]
    assert isinstance(final, dict) and final["text"].startswith(reports[-1][1]["text"])


class Trickle(Source):
    """Hands out one item per ``take``: jobs join a batch that is already decoding."""

    def take(self, max_items: int, timeout: float) -> list[WorkItem]:
        return super().take(1, timeout)


def test_jobs_join_a_running_batch(handler: SmolLM2Handler) -> None:
    items = [item(f"j{n}", max_new_tokens=6 + 2 * n) for n in range(4)]
    source = Trickle(items)
    handler.serve(source, 4)
    for it in items:
        assert source.results[it.job_id] == alone(handler, it), it.job_id


def test_rows_joining_and_leaving_keep_greedy_outputs(handler: SmolLM2Handler) -> None:
    """Short prompts first, then longer ones (the window grows on the left), more rows than the
    first allocation, rows leaving from the middle: every output equals the job's alone."""
    long_ctx = "Context: the museum opens at nine and closes at five, except on Mondays. " * 3
    items = []
    for n in range(10):
        content = PROMPTS[n % len(PROMPTS)]
        if n >= 4:
            content = long_ctx * (n - 3) + content
        items.append(
            WorkItem(
                job_id=f"j{n}",
                input=GenerationInput.model_validate(
                    {
                        "messages": [{"role": "user", "content": content}],
                        "max_new_tokens": 3 + (7 * n) % 11,
                    }
                ),
            )
        )
    source = Trickle(items)
    handler.serve(source, 7)
    for it in items:
        assert source.results[it.job_id] == alone(handler, it), it.job_id


def test_budget_counts_padding(handler: SmolLM2Handler, monkeypatch: pytest.MonkeyPatch) -> None:
    """A long prompt would pad every short row to its length: the budget counts rows x the
    longest, so the long job waits until the short ones are done."""
    small = SmolLM2Handler(spec=handler.spec, token_budget=400)
    small.model, small.tokenizer, small.eos_ids = handler.model, handler.tokenizer, handler.eos_ids
    seen: list[int] = []
    real_step = BatchedDecoder.step

    def step(self: BatchedDecoder) -> Any:
        seen.append(self.padded_tokens())
        return real_step(self)

    monkeypatch.setattr(BatchedDecoder, "step", step)
    items = [item(f"j{n}", prompt="The sky is", max_new_tokens=20) for n in range(3)]
    items.append(item("j3", prompt="word " * 250, max_new_tokens=20))
    source = run(small, items, batch=4)
    assert all(isinstance(source.results[f"j{n}"], dict) for n in range(4))
    assert seen and max(seen) <= 400
    assert source.order[-1] == "j3"


def test_nucleus_sampling_keeps_to_the_nucleus() -> None:
    import torch

    from asyncinfer.models.engine import NUCLEUS_CANDIDATES, sample
    from asyncinfer.models.engine import Request as Sequence

    # One dominant token: top_p 0.5 keeps it alone.
    peaked = torch.zeros(1000)
    peaked[123] = 20.0
    seq = Sequence(prompt_ids=[1], max_new_tokens=1, temperature=1.0, top_p=0.5, seed=1)
    assert {sample(peaked, seq) for _ in range(50)} == {123}
    # A nucleus wider than the top-k candidates: 400 equally likely tokens hold 0.99 of the
    # mass; draws fall among them only, and beyond the first NUCLEUS_CANDIDATES too.
    flat = torch.full((5000,), -30.0)
    flat[:400] = 0.0
    seq = Sequence(prompt_ids=[1], max_new_tokens=1, temperature=1.0, top_p=0.9, seed=2)
    draws = [sample(flat, seq) for _ in range(400)]
    assert max(draws) < 400
    assert any(d >= NUCLEUS_CANDIDATES for d in draws)
    # The same seed draws the same tokens.
    again = Sequence(prompt_ids=[1], max_new_tokens=1, temperature=1.0, top_p=0.9, seed=2)
    assert [sample(flat, again) for _ in range(400)] == draws


def test_compute_seconds_split_steps_across_rows_and_sum_to_the_busy_time(
    handler: SmolLM2Handler, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 13 item 6: each job's ``compute_seconds`` is its prefill (and tokenizing) plus its
    share of each decoding step it was in; they sum to the engine's busy time, most of the
    serve loop's wall time."""
    import time

    from asyncinfer.models.engine import runner as generation

    calls: list[float] = []

    def recording() -> float:
        calls.append(time.perf_counter())
        return calls[-1]

    monkeypatch.setattr(generation, "clock", recording)
    items = [item(f"j{n}", max_new_tokens=4 + 6 * n) for n in range(4)]
    t0 = time.perf_counter()
    source = run(handler, items, batch=4)
    wall = time.perf_counter() - t0
    assert all(isinstance(source.results[i.job_id], dict) for i in items)
    # The clock is read in pairs (start, end) around each prefill, step, removal and encode.
    busy = sum(calls[1::2]) - sum(calls[0::2])
    total = sum(i.compute_seconds for i in items)
    assert total == pytest.approx(busy, rel=0.02, abs=0.005)
    assert 0.6 * wall <= total <= wall
    # A job in more steps has more compute than one that left early.
    by_tokens = sorted(items, key=lambda i: i.input.max_new_tokens)  # type: ignore[attr-defined]
    assert by_tokens[-1].compute_seconds > by_tokens[0].compute_seconds > 0


def test_decode_counts_are_steps_and_rows_decoded(handler: SmolLM2Handler) -> None:
    from asyncinfer.models.engine.runner import COUNTS

    items = [item(f"j{n}", max_new_tokens=3 + n) for n in range(3)]
    steps, rows, prefills = COUNTS.steps, COUNTS.rows, COUNTS.prefills
    source = run(handler, items, batch=3)
    made = [r["usage"]["completion_tokens"] for r in source.results.values()]  # type: ignore[index]
    # A prefill samples a job's first token; each decoding step one more for every row in it.
    assert COUNTS.prefills - prefills == 3
    assert COUNTS.rows - rows == sum(n - 1 for n in made)
    assert COUNTS.steps - steps == max(made) - 1  # admitted together: one batch
