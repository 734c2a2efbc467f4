"""The generation engine serving jobs: continuous batching over a
:class:`~asyncinfer.models.base.WorkSource` (the worker's seam).

:class:`GenerationEngine` admits newly started jobs into the running batch whenever a slot
frees and the token budget allows (:class:`~.scheduler.Scheduler`), runs one decoding step for
every active job at a time (:class:`~.runner.BatchedDecoder`), and finishes each job the moment
it ends, while the others go on. Between steps it checks every job for cancel, timeout and
shutdown (one job's interruption leaves the others running) and reports progress. Text (the
prompt's tokens, the chat template, stop strings, the output) is a :class:`~.text.TextCodec`'s.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from asyncinfer.core.errors import (
    InvalidInput,
    JobCancelled,
    JobError,
    OutOfMemory,
    TransientError,
    WorkerStopping,
)
from asyncinfer.models.base import Result, WorkItem, WorkSource, _free_accelerator_memory
from asyncinfer.models.engine import runner as runner_module
from asyncinfer.models.engine.request import Request, RequestStatus
from asyncinfer.models.engine.runner import BatchedDecoder
from asyncinfer.models.engine.scheduler import Scheduler, is_out_of_memory
from asyncinfer.models.engine.text import TextCodec
from asyncinfer.models.schemas import GenerationInput

log = logging.getLogger("asyncinfer.models.engine")

#: Least time between two progress reports of one job, seconds.
PROGRESS_INTERVAL = 1.0


class GenerationEngine:
    """One model's engine: its runner, and a scheduler per :meth:`serve` call.

    Args:
        model: a transformers causal LM in eval mode, on its device.
        codec: the tokenizer side (:class:`TextCodec`).
        token_budget: most KV-cache entries a batch may come to hold, padding included, tokens.
        max_prompt_tokens: longest prompt accepted, tokens (:class:`InvalidInput` beyond).
        context_tokens: the model's context, tokens: a job's prompt plus its
            ``max_new_tokens`` must fit in it (``None``: not checked).
    """

    def __init__(
        self,
        model: Any,
        codec: TextCodec,
        *,
        token_budget: int,
        max_prompt_tokens: int,
        context_tokens: int | None = None,
    ) -> None:
        self.model = model
        self.codec = codec
        self.token_budget = token_budget
        self.max_prompt_tokens = max_prompt_tokens
        self.context_tokens = context_tokens

    def request(self, item: WorkItem) -> Request:
        """The engine request of ``item`` (tokenizing is the job's own compute time).

        Raises:
            InvalidInput: the prompt is longer than ``max_prompt_tokens``, or it and
                ``max_new_tokens`` do not fit the model's context.
        """
        inp = item.input
        assert isinstance(inp, GenerationInput)
        t0 = runner_module.clock()
        ids = self.codec.prompt_ids(inp, self.max_prompt_tokens)
        item.compute_seconds += runner_module.clock() - t0
        if self.context_tokens and len(ids) + inp.max_new_tokens > self.context_tokens:
            raise InvalidInput(
                f"prompt ({len(ids)} tokens) plus max_new_tokens ({inp.max_new_tokens}) "
                f"exceeds the model's context of {self.context_tokens} tokens"
            )
        return Request(
            request_id=item.job_id,
            prompt_ids=ids,
            max_new_tokens=inp.max_new_tokens,
            temperature=inp.temperature,
            top_p=inp.top_p,
            seed=inp.seed,
            tag={"item": item, "last_progress": time.monotonic()},
        )

    def serve(self, source: WorkSource, max_batch_size: int) -> None:
        """Continuous batching until the source stops and no job is left. Never raises for one
        job's sake: errors become that job's result."""
        scheduler = Scheduler(
            max_num_seqs=max_batch_size,
            token_budget=self.token_budget,
            eos_ids=self.codec.eos_ids,
            stop_check=self.codec.hit_stop,
        )
        runner = BatchedDecoder(self.model)
        live: list[Request] = []  # waiting or running

        def finish(req: Request) -> None:
            item: WorkItem = req.tag["item"]
            item.compute_seconds += req.compute_seconds  # prefill + its share of each step
            req.compute_seconds = 0.0
            live.remove(req)
            source.finish(item, self._result(req))

        while True:
            # 1. take started jobs while slots are free and no job waits for budget: a taken job
            # is running (its started_at set), and the jobs this worker cannot start stay in the
            # queue for others.
            if scheduler.free_slots > 0 and not scheduler.waiting and not source.stopping:
                busy = scheduler.has_unfinished_requests()
                for item in source.take(scheduler.free_slots, timeout=0 if busy else 0.2):
                    try:
                        req = self.request(item)
                        scheduler.add_request(req)
                    except (JobError, WorkerStopping) as bad:
                        source.finish(item, bad)
                        continue
                    except Exception as err:
                        log.exception("could not prepare job %s", item.job_id)
                        source.finish(item, TransientError(f"{type(err).__name__}: {err}"[:500]))
                        continue
                    live.append(req)
            if not scheduler.has_unfinished_requests():
                if source.stopping:
                    return
                continue
            # 2. interruptions (cancel, timeout, shutdown) of single jobs, between steps.
            for req in list(live):
                stop = req.tag["item"].interruption()
                if stop is not None:
                    scheduler.finish_requests([req], RequestStatus.FINISHED_ABORTED, stop)
                    finish(req)
            # 3. one engine step: drop, decode every row, prefill what was admitted.
            sched = scheduler.schedule()
            out = runner.execute(removed=sched.removed, decode=sched.decode, prefill=sched.prefill)
            if out.error is not None:
                where = "prefill" if out.failed is not None else "decoding step"
                if is_out_of_memory(out.error):
                    log.warning("out of memory in %s: %s", where, out.error)
                else:
                    log.error("%s failed", where, exc_info=out.error)
            done = scheduler.update_from_output(
                sched, out.sampled, out.error, out.failed, out.not_run
            )
            if out.error is not None and is_out_of_memory(out.error):
                out.error = None  # drop the traceback's tensors before emptying the cache
                _free_accelerator_memory()
            now = time.monotonic()
            for req in done:
                _first_token(req, now)
                finish(req)
            for req in scheduler.running:
                _first_token(req, now)
                self._progress(req, now)

    # ------------------------------------------------------------------ results
    def _result(self, req: Request) -> Result:
        codec = self.codec
        inp = req.tag["item"].input
        usage = {"prompt_tokens": len(req.prompt_ids), "completion_tokens": len(req.generated)}
        if req.status in (RequestStatus.FINISHED_STOPPED, RequestStatus.FINISHED_LENGTH_CAPPED):
            text, cut = codec.text(req.generated, inp.stop)
            finish = "stop" if (req.stop_reason in ("eos", "stop") or cut) else "length"
            return {"text": text, "finish_reason": finish, "usage": usage}
        exc = req.error
        if isinstance(exc, JobCancelled):
            text, _ = codec.text(req.generated, inp.stop)
            partial = {"text": text, "finish_reason": "cancelled", "usage": usage}
            return JobCancelled("job was cancelled", partial=partial)
        if isinstance(exc, (JobError, WorkerStopping)):
            return exc
        if exc is not None and is_out_of_memory(exc):
            return OutOfMemory(f"the batch did not fit in memory: {exc}"[:500])
        return TransientError(f"{type(exc).__name__}: {exc}"[:500])

    def _progress(self, req: Request, now: float) -> None:
        item: WorkItem = req.tag["item"]
        if item.on_progress is None or now - req.tag["last_progress"] < PROGRESS_INTERVAL:
            return
        req.tag["last_progress"] = now
        text, _ = self.codec.text(req.generated, item.input.stop)  # type: ignore[attr-defined]
        usage = {"prompt_tokens": len(req.prompt_ids), "completion_tokens": len(req.generated)}
        item.on_progress(len(req.generated), {"text": text, "finish_reason": None, "usage": usage})


def _first_token(req: Request, now: float) -> None:
    """Note on the request's item when its first output token came (``now``, monotonic
    seconds; :attr:`WorkItem.first_token_at`)."""
    item: WorkItem = req.tag["item"]
    if item.first_token_at is None and req.generated:
        item.first_token_at = now
