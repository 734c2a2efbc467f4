"""A worker's time to ready, split into download, load and first token (issue 13 item 4).

Two log lines of the worker carry it as ``key=value`` fields (seconds, 3 decimals):

* ``worker ready: model=M queues=Q capacity=N download_seconds=D load_seconds=L``: ``D`` is the
  time spent getting the weights (an ``s3://`` source's listing, download and checks, or the wait
  for another worker's download of it on the same instance: :func:`asyncinfer.models.weights.
  download_seconds`; 0 for ``file:`` and ``wheel:`` sources, read in place), ``L`` the rest of
  building and loading the handler (reading the checkpoint, placing it on the device);
* after the first job that succeeds, ``first job: model=M job=J idle_seconds=I
  first_token_seconds=T first_result_seconds=R``, each from the ``worker ready`` line: ``I`` until
  the job started (0 when jobs were waiting), ``T`` until its first output token (the generation
  engine notes it on the item, :attr:`~asyncinfer.models.base.WorkItem.first_token_at`; for a
  handler that produces no tokens, its result), ``R`` until its result. A worker started onto a
  waiting queue is serving after ``D + L + T``.

In AWS (``ASYNCINFER_COMPUTE`` set) the same figures go out as EMF metrics with the job metrics'
namespace and ``Model`` dimension (:mod:`asyncinfer.core.job_metrics`): ``WeightsDownloadSeconds``
and ``ModelLoadSeconds`` once per start, ``FirstTokenSeconds`` once per worker.

The download counter is per process: workers sharing a process (tests) share it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from asyncinfer.core import job_metrics as jm
from asyncinfer.models import weights

log = logging.getLogger("asyncinfer.worker")


@dataclass
class StartTimes:
    """The start-up split of one worker.

    Attributes:
        model: the model id (the metrics' dimension).
        emit: whether to emit EMF metrics (AWS).
        download_seconds: time getting the weights, seconds.
        load_seconds: the rest of building and loading the handler, seconds.
        ready_at: ``time.monotonic()`` of the ``worker ready`` line (``None`` before).
        first_job_seen: whether the ``first job`` line was logged.
        clock: monotonic seconds (tests pass a fake one).
        write: where EMF lines go (default stdout, :func:`asyncinfer.core.job_metrics.emit`).
    """

    model: str
    emit: bool = False
    download_seconds: float = 0.0
    load_seconds: float = 0.0
    ready_at: float | None = None
    first_job_seen: bool = False
    clock: Callable[[], float] = time.monotonic
    write: Callable[[str], object] | None = None

    @contextmanager
    def loading(self) -> Iterator[None]:
        """Time the block (building and loading the handler) and split it into download and
        load by the weights module's counter."""
        t0, spent = self.clock(), weights.download_seconds()
        try:
            yield
        finally:
            total = self.clock() - t0
            self.download_seconds = min(max(weights.download_seconds() - spent, 0.0), total)
            self.load_seconds = total - self.download_seconds

    def ready_fields(self) -> str:
        """``download_seconds=D load_seconds=L`` for the ``worker ready`` line."""
        return f"download_seconds={self.download_seconds:.3f} load_seconds={self.load_seconds:.3f}"

    def ready(self) -> None:
        """Note the ``worker ready`` moment (and emit the start-up metrics in AWS)."""
        self.ready_at = self.clock()
        if self.emit:
            jm.emit(
                jm.DOWNLOAD_SECONDS, self.download_seconds, "Seconds", self.model, write=self.write
            )
            jm.emit(jm.LOAD_SECONDS, self.load_seconds, "Seconds", self.model, write=self.write)

    def finished(self, job_id: str, *, started: float, first_token_at: float | None) -> None:
        """A job succeeded: the first time, log the ``first job`` line (and emit
        ``FirstTokenSeconds`` in AWS).

        Args:
            job_id: the job.
            started: ``time.monotonic()`` when it started running (0: unknown, taken as ready).
            first_token_at: ``time.monotonic()`` of its first output token, or ``None``: its
                result is taken as its first token.
        """
        if self.first_job_seen or self.ready_at is None:
            return
        self.first_job_seen = True
        now = self.clock()
        idle = max((started or self.ready_at) - self.ready_at, 0.0)
        token = (first_token_at if first_token_at is not None else now) - self.ready_at
        log.info(
            "first job: model=%s job=%s idle_seconds=%.3f first_token_seconds=%.3f "
            "first_result_seconds=%.3f",
            self.model,
            job_id,
            idle,
            max(token, 0.0),
            now - self.ready_at,
        )
        if self.emit:
            jm.emit(
                jm.FIRST_TOKEN_SECONDS, max(token, 0.0), "Seconds", self.model, write=self.write
            )
