"""The model handler interface, in the spirit of SageMaker's ``model_fn`` / ``predict_fn``.

A handler is built once per worker process, loads its weights once (:meth:`ModelHandler.load`), then
runs lists of work items (:meth:`ModelHandler.predict`) and returns, per item, an output dict or a
:class:`~asyncinfer.core.errors.JobError`. A handler never touches AWS: the worker owns the job
lifecycle, queues and storage.

The worker drives a handler through :meth:`ModelHandler.serve` and a :class:`WorkSource`. The
default ``serve`` is dynamic batching: take up to ``max_batch_size`` started jobs, ``predict``
them together, finish each. A handler that can admit work into a running batch (continuous
batching for generation) overrides ``serve``: it takes new items whenever a slot frees and
finishes each item the moment it is done.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from pydantic import BaseModel

from asyncinfer.core.errors import (
    JobCancelled,
    JobError,
    JobTimeout,
    ModelError,
    OutOfMemory,
    TransientError,
    WorkerStopping,
)

if TYPE_CHECKING:
    from asyncinfer.core.settings_parts import ModelSettings
    from asyncinfer.models.registry import ModelSpec

log = logging.getLogger("asyncinfer.models")


@dataclass(kw_only=True)
class WorkItem:
    """One job as a handler sees it.

    Attributes:
        job_id: the job id (``job_<ULID>``).
        input: the validated input (an instance of the model's input schema).
        raw_input: the input exactly as submitted (JSON object).
        attempt: 1 for the first attempt, +1 for each retry.
        deadline: ``time.monotonic()`` value after which the attempt has timed out (seconds).
        cancel_event: set when the job is cancelled while it runs.
        stop_event: set when the worker must give the job back (shutdown past drain).
        on_progress: called with ``(completion_tokens, partial_output)`` as work advances.
        compute_seconds: the job's share of the worker's compute time so far, seconds: the
            handler (or :func:`run_batch`) adds to it; the worker records it on the terminal job
            as ``metrics.compute_seconds`` (shared/spec/models.md, "What a job shows").
        first_token_at: ``time.monotonic()`` when the item's first output token was produced
            (seconds), set by a handler that generates tokens (the generation engine); ``None``
            otherwise. The worker's ``first job`` line reads it (time to first token).
    """

    job_id: str
    input: BaseModel
    raw_input: dict[str, Any] = field(default_factory=dict)
    attempt: int = 1
    deadline: float = float("inf")
    cancel_event: threading.Event = field(default_factory=threading.Event)
    stop_event: threading.Event = field(default_factory=threading.Event)
    on_progress: Callable[[int, dict[str, Any]], None] | None = None
    compute_seconds: float = 0.0
    first_token_at: float | None = None

    def interruption(self) -> BaseException | None:
        """What should interrupt this item now, if anything: a :class:`WorkerStopping`,
        :class:`JobCancelled` or :class:`JobTimeout` instance, else ``None``. Handlers call this
        at each decoding step or batch boundary."""
        if self.stop_event.is_set():
            return WorkerStopping("worker is stopping")
        if self.cancel_event.is_set():
            return JobCancelled("job was cancelled")
        if time.monotonic() > self.deadline:
            return JobTimeout("job ran past its timeout_seconds")
        return None

    def check(self) -> None:
        """Raise :meth:`interruption` if there is one."""
        exc = self.interruption()
        if exc is not None:
            raise exc


Result = dict[str, Any] | JobError | WorkerStopping


class WorkSource(Protocol):
    """What the worker offers a handler's :meth:`ModelHandler.serve` loop."""

    @property
    def stopping(self) -> bool:
        """True once the worker takes no more work; ``serve`` returns when its items are done."""
        ...

    def take(self, max_items: int, timeout: float) -> list[WorkItem]:
        """Up to ``max_items`` newly started jobs (status ``running``), waiting up to ``timeout``
        seconds for the first; ``[]`` when none came or the worker is stopping."""
        ...

    def finish(self, item: WorkItem, result: Result) -> None:
        """Hand ``item``'s result back. The source records it (terminal write, then its event,
        then the message's deletion; or a release) at once, or with its next :meth:`take` if
        that comes within about a second; while the source is stopping, at once."""
        ...


#: The clock of compute attribution, seconds (monotonic wall time; tests replace it).
compute_clock: Callable[[], float] = time.perf_counter


def attribute(items: list[WorkItem], seconds: float) -> None:
    """Split ``seconds`` of compute time equally across ``items`` (a batch run as one step)."""
    if items and seconds > 0:
        share = seconds / len(items)
        for item in items:
            item.compute_seconds += share


def is_out_of_memory(exc: BaseException) -> bool:
    """Whether ``exc`` says an allocation failed: ``MemoryError``, torch's ``OutOfMemoryError``
    (CUDA and other accelerators), or the CPU allocator's ``RuntimeError`` ("can't allocate
    memory")."""
    if isinstance(exc, MemoryError) or type(exc).__name__ == "OutOfMemoryError":
        return True
    return isinstance(exc, RuntimeError) and "can't allocate memory" in str(exc)


def _free_accelerator_memory() -> None:
    """Give cached accelerator memory back after an out-of-memory error (only if torch is
    already imported; never raises)."""
    torch = sys.modules.get("torch")
    try:
        if torch is not None and torch.cuda.is_available():
            torch.cuda.empty_cache()
    except Exception:  # a lost device: the retry will say so
        log.debug("could not empty the accelerator cache", exc_info=True)


def _predict_once(handler: ModelHandler, items: list[WorkItem]) -> list[Result]:
    """``handler.predict(items)`` with an exception applied to every item (see
    :func:`run_batch`)."""
    try:
        results = handler.predict(items)
        if len(results) != len(items):
            raise ModelError(f"handler returned {len(results)} results for {len(items)} items")
        return results
    except (JobError, WorkerStopping) as exc:
        return [exc] * len(items)
    except Exception as exc:
        if is_out_of_memory(exc):
            log.warning(
                "model %s: out of memory for %d items: %s", handler.spec.id, len(items), exc
            )
            return [OutOfMemory(f"the batch did not fit in memory: {exc}"[:500])] * len(items)
        log.exception("model %s raised", handler.spec.id)
        return [TransientError(f"{type(exc).__name__}: {exc}"[:500])] * len(items)


def run_batch(handler: ModelHandler, items: list[WorkItem]) -> list[Result]:
    """``handler.predict(items)``, with an exception applied to every item: a ``JobError`` or
    ``WorkerStopping`` as itself, an out-of-memory error (:func:`is_out_of_memory`) as
    :class:`OutOfMemory`, anything else as a retryable :class:`TransientError` (a bug or a lost
    device may not recur; the dead-letter queue bounds the retries).

    **Out-of-memory split** (issue 14, behaviour 4): when a batch of more than one item runs out
    of memory (raised, or :class:`OutOfMemory` results the handler returned), each item that got
    :class:`OutOfMemory` is run again on its own, so that co-batched jobs that fit survive and
    only a job that does not fit alone fails with ``out_of_memory``. Items are retried one at a
    time, in order; each retry is an ordinary :meth:`ModelHandler.predict` call of one item, so
    it sees the item's own deadline, cancel and stop.

    **Compute time** (issue 13, per-job cost): the first call's wall time is the batch's compute
    time, and each retry's is its own job's: what the handler did not attribute to items itself
    (:attr:`WorkItem.compute_seconds`, as the generation engine does per step) is split equally
    across the items.
    """
    t0 = compute_clock()
    before = sum(item.compute_seconds for item in items)
    try:
        return _run_split(handler, items)
    finally:
        elapsed = compute_clock() - t0
        attribute(items, elapsed - (sum(item.compute_seconds for item in items) - before))


def _run_split(handler: ModelHandler, items: list[WorkItem]) -> list[Result]:
    """:func:`_predict_once`, then the out-of-memory split of :func:`run_batch`."""
    results = _predict_once(handler, items)
    if len(items) < 2:
        return results
    oom = [n for n, r in enumerate(results) if isinstance(r, OutOfMemory)]
    if not oom:
        return results
    log.warning(
        "model %s: %d of %d items out of memory; running them one at a time",
        handler.spec.id,
        len(oom),
        len(items),
    )
    out = list(results)
    for n in oom:
        _free_accelerator_memory()
        out[n] = run_batch(handler, [items[n]])[0]  # its time is charged to its own job
    return out


class ModelHandler:
    """Base class of model handlers.

    Subclasses implement :meth:`load` and :meth:`predict`. ``predict`` must return one result per
    item, in order: an output dict (the job's ``output``), a :class:`JobError` for that item alone
    (a permanent one fails the job, a retryable one sends it back to the queue), or
    :class:`WorkerStopping` when the item was given back unfinished. Raising from ``predict``
    applies the error to every item of the call.
    """

    @property
    def batching(self) -> bool:
        """Whether the handler runs the items of a batch together (one step for the batch, or
        concurrently): the worker then takes up to its ``max_batch_size`` jobs at once. A
        handler that runs items one at a time returns ``False``, and the worker takes one job at
        a time, leaving the others in the queue for other workers (docs/models.md, "Batching
        and concurrency"). Default ``True``."""
        return True

    def __init__(
        self, *, spec: ModelSpec, cache_dir: Any = None, settings: ModelSettings | None = None
    ) -> None:
        # settings: the model layer's part (the worker's ``model_settings``); None (tests): the
        # built-in defaults, and cache_dir as given. A given cache_dir wins over the part's.
        self.spec = spec
        self.settings = settings
        self.cache_dir = (
            cache_dir if cache_dir is not None or settings is None else settings.model_cache_dir
        )

    def capacity(self, max_batch_size: int) -> int:
        """Most jobs this handler runs at once in a worker whose batch size is
        ``max_batch_size``: that size when :attr:`batching`, else 1."""
        return max(1, max_batch_size) if self.batching else 1

    def ready(self) -> bool:
        """Whether the handler can start jobs now. While ``False`` the worker receives no
        messages (they wait in the queue, visible to other workers) and ``serve`` should take
        none: an ``openai-server`` handler whose engine is not up yet, or whose engine has a
        queue of its own. Default ``True``; read often, so it must be cheap."""
        return True

    def load(self) -> None:
        """Load weights once (idempotent). Raises on a model that cannot be loaded."""

    def predict(self, items: list[WorkItem]) -> list[Result]:
        """Run ``items`` (at most ``spec.max_batch_size``) and return one result per item."""
        raise NotImplementedError

    def serve(self, source: WorkSource, max_batch_size: int) -> None:
        """Dynamic batching until the source stops: take up to ``max_batch_size`` jobs, run them
        together, finish each."""
        while True:
            items = source.take(max_batch_size, timeout=0.2)
            if not items:
                if source.stopping:
                    return
                continue
            for item, result in zip(items, run_batch(self, items), strict=True):
                source.finish(item, result)
