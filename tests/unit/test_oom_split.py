"""Behaviour 4's out-of-memory split (issue 14): a batch that runs out of memory is retried item by
item before any job fails with ``out_of_memory``, so innocent co-batched jobs survive."""

from __future__ import annotations

from typing import Any

from asyncinfer.core.errors import OutOfMemory, TransientError
from asyncinfer.models.base import ModelHandler, Result, WorkItem, is_out_of_memory, run_batch
from asyncinfer.models.minilm import MiniLMHandler
from asyncinfer.models.registry import MODELS
from asyncinfer.models.schemas import EchoInput, EmbeddingInput


class OutOfMemoryError(RuntimeError):
    """Named as torch's ``torch.OutOfMemoryError`` (CUDA), which the worker detects by name."""


class Budgeted(ModelHandler):
    """A stub handler with a memory budget: a call whose items' ``size`` add up to more than
    ``budget`` raises torch's out-of-memory error."""

    def __init__(self, budget: int, exc: type[BaseException] = OutOfMemoryError) -> None:
        super().__init__(spec=MODELS["echo"])
        self.budget = budget
        self.exc = exc
        self.calls: list[list[str]] = []

    def predict(self, items: list[WorkItem]) -> list[Result]:
        self.calls.append([i.job_id for i in items])
        if sum(int(i.raw_input["size"]) for i in items) > self.budget:
            raise self.exc("CUDA out of memory. Tried to allocate 2.00 GiB")
        return [{"size": i.raw_input["size"]} for i in items]


def work(*sizes: int) -> list[WorkItem]:
    return [
        WorkItem(job_id=f"j{n}", input=EchoInput(), raw_input={"size": s})
        for n, s in enumerate(sizes)
    ]


def test_a_batch_out_of_memory_is_retried_item_by_item_and_the_innocent_survive() -> None:
    handler = Budgeted(budget=10)
    results = run_batch(handler, work(3, 4, 20, 2))
    assert results[0] == {"size": 3}
    assert results[1] == {"size": 4}
    assert results[3] == {"size": 2}
    assert isinstance(results[2], OutOfMemory) and results[2].code == "out_of_memory"
    assert handler.calls == [["j0", "j1", "j2", "j3"], ["j0"], ["j1"], ["j2"], ["j3"]]


def test_a_single_item_out_of_memory_fails_at_once_without_a_retry() -> None:
    handler = Budgeted(budget=10)
    results = run_batch(handler, work(20))
    assert isinstance(results[0], OutOfMemory)
    assert handler.calls == [["j0"]]


class CpuAllocatorError(RuntimeError):
    """What torch's CPU allocator raises when an allocation fails."""

    def __init__(self, _message: str) -> None:
        super().__init__("[enforce fail] DefaultCPUAllocator: can't allocate memory")


def test_memory_error_and_the_cpu_allocator_error_split_too() -> None:
    for exc in (MemoryError, CpuAllocatorError):
        handler = Budgeted(budget=5, exc=exc)
        results = run_batch(handler, work(3, 3))
        assert results == [{"size": 3}, {"size": 3}], exc


def test_other_errors_are_not_split() -> None:
    class Broken(Budgeted):
        def predict(self, items: list[WorkItem]) -> list[Result]:
            self.calls.append([i.job_id for i in items])
            raise ValueError("a bug")

    handler = Broken(budget=0)
    results = run_batch(handler, work(1, 1))
    assert all(isinstance(r, TransientError) for r in results)
    assert handler.calls == [["j0", "j1"]]


def test_out_of_memory_results_a_handler_returns_are_retried_alone() -> None:
    class PerItem(Budgeted):
        def predict(self, items: list[WorkItem]) -> list[Result]:
            self.calls.append([i.job_id for i in items])
            if len(items) > 1:
                return [OutOfMemory("batch"), {"ok": 1}, OutOfMemory("batch")]
            return [{"alone": items[0].job_id}]

    handler = PerItem(budget=0)
    results = run_batch(handler, work(1, 1, 1))
    assert results == [{"alone": "j0"}, {"ok": 1}, {"alone": "j2"}]
    assert handler.calls == [["j0", "j1", "j2"], ["j0"], ["j2"]]


def test_the_serve_loop_finishes_each_job_with_its_own_result() -> None:
    class Source:
        def __init__(self, batch: list[WorkItem]) -> None:
            self.batch = batch
            self.finished: dict[str, Any] = {}

        @property
        def stopping(self) -> bool:
            return not self.batch

        def take(self, max_items: int, timeout: float) -> list[WorkItem]:
            out, self.batch = self.batch[:max_items], self.batch[max_items:]
            return out

        def finish(self, item: WorkItem, result: Result) -> None:
            self.finished[item.job_id] = result

    source = Source(work(4, 50, 4))
    Budgeted(budget=10).serve(source, max_batch_size=3)
    assert source.finished["j0"] == {"size": 4} and source.finished["j2"] == {"size": 4}
    assert isinstance(source.finished["j1"], OutOfMemory)


def test_the_embeddings_handler_splits_an_out_of_memory_batch(monkeypatch: Any) -> None:
    handler = MiniLMHandler(spec=MODELS["all-minilm-l6-v2"])

    def embed(self: MiniLMHandler, texts: list[str]) -> list[list[float]]:
        if len(texts) > 3:
            raise OutOfMemoryError("CUDA out of memory")
        return [[float(len(t))] for t in texts]

    monkeypatch.setattr(MiniLMHandler, "embed", embed)
    items = [
        WorkItem(job_id="small", input=EmbeddingInput(texts=["a", "bb"])),
        WorkItem(job_id="huge", input=EmbeddingInput(texts=["x"] * 5)),
        WorkItem(job_id="tiny", input=EmbeddingInput(texts=["ccc"])),
    ]
    results = run_batch(handler, items)
    assert results[0] == {"embeddings": [[1.0], [2.0]], "dim": 384}
    assert results[2] == {"embeddings": [[3.0]], "dim": 384}
    assert isinstance(results[1], OutOfMemory)


def test_out_of_memory_detection() -> None:
    assert is_out_of_memory(MemoryError())
    assert is_out_of_memory(OutOfMemoryError("CUDA out of memory"))
    assert is_out_of_memory(RuntimeError("DefaultCPUAllocator: can't allocate memory"))
    assert not is_out_of_memory(RuntimeError("shape mismatch"))
