"""The model handler interface, in the spirit of SageMaker's ``model_fn`` / ``predict_fn``.

A handler is built once per worker process, loads its weights once (:meth:`ModelHandler.load`), then
runs lists of work items (:meth:`ModelHandler.predict`) and returns, per item, an output dict or a
:class:`~asyncinfer.errors.JobError`. A handler never touches AWS: the worker owns the job
lifecycle, queues and storage.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

from asyncinfer.errors import JobCancelled, JobError, JobTimeout, WorkerStopping

if TYPE_CHECKING:
    from asyncinfer.models.registry import ModelSpec


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
    """

    job_id: str
    input: BaseModel
    raw_input: dict[str, Any] = field(default_factory=dict)
    attempt: int = 1
    deadline: float = float("inf")
    cancel_event: threading.Event = field(default_factory=threading.Event)
    stop_event: threading.Event = field(default_factory=threading.Event)
    on_progress: Callable[[int, dict[str, Any]], None] | None = None

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


class ModelHandler:
    """Base class of model handlers.

    Subclasses implement :meth:`load` and :meth:`predict`. ``predict`` must return one result per
    item, in order: an output dict (the job's ``output``), a :class:`JobError` for that item alone
    (a permanent one fails the job, a retryable one sends it back to the queue), or
    :class:`WorkerStopping` when the item was given back unfinished. Raising from ``predict``
    applies the error to every item of the call.
    """

    def __init__(self, *, spec: ModelSpec, cache_dir: Any = None) -> None:
        self.spec = spec
        self.cache_dir = cache_dir

    def load(self) -> None:
        """Load weights once (idempotent). Raises on a model that cannot be loaded."""

    def predict(self, items: list[WorkItem]) -> list[Result]:
        """Run ``items`` (at most ``spec.max_batch_size``) and return one result per item."""
        raise NotImplementedError
