"""The ``echo`` model: returns its input. For tests and overhead benchmarks."""

from __future__ import annotations

import time

from asyncinfer.errors import InvalidInput, JobError, TransientError, WorkerStopping
from asyncinfer.models.base import ModelHandler, Result, WorkItem
from asyncinfer.models.schemas import EchoInput


class EchoHandler(ModelHandler):
    """Returns each input unchanged (``sleep_seconds`` included). Sleeps in 50 ms steps, checking
    for cancel, timeout and shutdown between steps, as a real model checks between decoding
    steps. ``fail`` raises a retryable or permanent error on early attempts."""

    STEP_SECONDS = 0.05

    def predict(self, items: list[WorkItem]) -> list[Result]:
        results: list[Result] = []
        for item in items:
            try:
                results.append(self._one(item))
            except (JobError, WorkerStopping) as exc:
                results.append(exc)
        return results

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
