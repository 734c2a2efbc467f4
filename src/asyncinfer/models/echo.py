"""The ``echo`` model: returns its input. For tests and overhead benchmarks."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

from asyncinfer.core.errors import InvalidInput, JobError, TransientError, WorkerStopping
from asyncinfer.models.base import ModelHandler, Result, WorkItem
from asyncinfer.models.schemas import EchoInput


class EchoHandler(ModelHandler):
    """Returns each input unchanged (``sleep_seconds`` included). Sleeps in 50 ms steps, checking
    for cancel, timeout and shutdown between steps, as a real model checks between decoding
    steps. ``fail`` raises a retryable or permanent error on early attempts.

    The items of a batch run concurrently (their sleeps overlap), as a batched model runs them in
    one step, so a batch of jobs of ``sleep_seconds`` s each takes about that long. With the
    setting ``ASYNCINFER_ECHO_BATCHING=0`` it declares itself one-at-a-time
    (:attr:`~asyncinfer.models.base.ModelHandler.batching` false): the worker then takes one job
    at a time, as for a handler whose predict works on items one by one."""

    STEP_SECONDS = 0.05

    @property
    def batching(self) -> bool:
        """From the part's ``echo_batching`` (``ASYNCINFER_ECHO_BATCHING``, default on; on
        without a part)."""
        return self.settings is None or self.settings.echo_batching

    def predict(self, items: list[WorkItem]) -> list[Result]:
        if len(items) <= 1:
            return [self._safe(item) for item in items]
        with ThreadPoolExecutor(max_workers=len(items), thread_name_prefix="echo") as pool:
            return list(pool.map(self._safe, items))

    def _safe(self, item: WorkItem) -> Result:
        try:
            return self._one(item)
        except (JobError, WorkerStopping) as exc:
            return exc

    def _one(self, item: WorkItem) -> dict[str, object]:
        inp = item.input
        assert isinstance(inp, EchoInput)
        if inp.fail is not None and item.attempt <= inp.fail.attempts:
            if inp.fail.kind == "retryable":
                raise TransientError(f"injected retryable failure on attempt {item.attempt}")
            raise InvalidInput("injected permanent failure")
        end = time.monotonic() + inp.sleep_seconds
        while True:
            item.check()
            left = end - time.monotonic()
            if left <= 0:
                break
            time.sleep(min(self.STEP_SECONDS, left))
        return item.raw_input
