"""The scheduler of the generation engine, kept apart from the model runner in the manner of
vLLM v1's scheduler interface: :meth:`Scheduler.add_request`, :meth:`Scheduler.schedule` (which
requests to prefill, which rows to decode, which to drop), :meth:`Scheduler.update_from_output`
(the runner's sampled tokens: stop conditions, errors) and :meth:`Scheduler.finish_requests`
(aborts). No torch import here: it works on token ids and counts.

**Admission.** Waiting requests are admitted in order (first come, first served; a preempted
request goes back to the head) while the batch has a free slot (``max_num_seqs``) and its
padded size stays within the token budget: rows x the largest ``prompt + max_new_tokens`` among
them (the runner's rows are right-aligned, so every row is as wide as the longest; a budget on
this figure bounds the KV cache's memory, where a sum of tokens would let one long prompt pad
every short row to its length).

**Out of memory** (issue 13 item 1; vLLM's recompute preemption). When a decoding step of more
than one row runs out of memory, the most recently admitted row is preempted: dropped from the
batch and put back at the head of the waiting queue, its generated tokens kept (it prefills them
with its prompt when it is admitted again), and the batch goes on without it. A prefill that
runs out of memory beside running rows waits the same way. Until the batch is next empty, no
admission may bring it back to the padded size that failed (an *out-of-memory ceiling* below the
budget). Only a request that runs out of memory alone fails (``FINISHED_ERROR``,
:class:`~asyncinfer.core.errors.OutOfMemory`). Any other error of a step fails the rows in it; of a
prefill, that request.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from asyncinfer.core.errors import InvalidInput, OutOfMemory
from asyncinfer.models.engine.request import Request, RequestStatus

log = logging.getLogger("asyncinfer.models.engine")


def is_out_of_memory(exc: BaseException) -> bool:
    """:func:`asyncinfer.models.base.is_out_of_memory` (imported late: no cycle)."""
    from asyncinfer.models.base import is_out_of_memory as check

    return check(exc)


@dataclass
class SchedulerOutput:
    """What the runner does in one engine step (:meth:`BatchedDecoder.execute`).

    Attributes:
        removed: rows to drop first (finished, aborted or preempted since the last step).
        decode: the rows to decode, one token each (every row the runner then holds).
        prefill: requests admitted now, to prefill in order (they decode from the next step).
    """

    removed: list[Request] = field(default_factory=list)
    decode: list[Request] = field(default_factory=list)
    prefill: list[Request] = field(default_factory=list)


class Scheduler:
    """Continuous batching of :class:`Request` objects. Not thread-safe (one loop owns it).

    Args:
        max_num_seqs: most requests running at once.
        token_budget: most KV-cache entries the batch may come to hold, padding included.
        eos_ids: end-of-sequence token ids.
        stop_check: called after each new token of a running request; ``True`` ends it with
            ``FINISHED_STOPPED`` (stop strings: the serving layer's tokenizer decides).
    """

    def __init__(
        self,
        *,
        max_num_seqs: int,
        token_budget: int,
        eos_ids: set[int],
        stop_check: Callable[[Request], bool] | None = None,
    ) -> None:
        self.max_num_seqs = max(1, max_num_seqs)
        self.token_budget = token_budget
        self.eos_ids = eos_ids
        self.stop_check = stop_check
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []  # in order of admission
        self.oom_ceiling: int | None = None
        self._removed: list[Request] = []

    # ------------------------------------------------------------------ requests
    def add_request(self, req: Request) -> None:
        """Queue ``req`` (``WAITING``).

        Raises:
            InvalidInput: it could never run: prompt plus ``max_new_tokens`` is over the budget.
        """
        if req.reserved_tokens > self.token_budget:
            raise InvalidInput(
                f"prompt ({len(req.prompt_ids)} tokens) plus max_new_tokens "
                f"({req.max_new_tokens}) exceeds the worker's token budget of {self.token_budget}"
            )
        req.status = RequestStatus.WAITING
        self.waiting.append(req)

    def finish_requests(
        self, reqs: list[Request], status: RequestStatus, error: BaseException | None = None
    ) -> None:
        """End ``reqs`` with ``status`` (e.g. ``FINISHED_ABORTED`` for a cancel), waiting or
        running; running ones leave the batch at the next step."""
        for req in reqs:
            if req.finished:
                continue
            if req in self.waiting:
                self.waiting.remove(req)
            elif req in self.running:
                self.running.remove(req)
                self._removed.append(req)
            req.status, req.error = status, error
        if not self.running:
            self.oom_ceiling = None

    def has_unfinished_requests(self) -> bool:
        """Whether any request waits or runs."""
        return bool(self.waiting or self.running)

    @property
    def free_slots(self) -> int:
        """Slots neither running nor promised to a waiting request."""
        return self.max_num_seqs - len(self.running) - len(self.waiting)

    def padded_tokens(self, extra: Request | None = None) -> int:
        """Running rows (and ``extra``) x the largest ``reserved_tokens`` among them, tokens."""
        rows = [*self.running, *([extra] if extra is not None else [])]
        return len(rows) * max((r.reserved_tokens for r in rows), default=0)

    def _limit(self) -> int:
        if self.oom_ceiling is None:
            return self.token_budget
        return min(self.token_budget, self.oom_ceiling)

    # ------------------------------------------------------------------ one step
    def schedule(self) -> SchedulerOutput:
        """The next engine step: drop what left, decode what runs, admit what fits."""
        out = SchedulerOutput(removed=self._removed, decode=list(self.running))
        self._removed = []
        while (
            self.waiting
            and len(self.running) < self.max_num_seqs
            and self.padded_tokens(self.waiting[0]) <= self._limit()
        ):
            req = self.waiting.popleft()
            req.status = RequestStatus.RUNNING
            self.running.append(req)
            out.prefill.append(req)
        return out

    def update_from_output(
        self,
        sched: SchedulerOutput,
        sampled: list[tuple[Request, int]],
        error: BaseException | None = None,
        failed: Request | None = None,
        not_run: list[Request] | None = None,
    ) -> list[Request]:
        """Apply the runner's output of ``sched``: append each sampled token and end requests
        on end-of-sequence, ``max_new_tokens`` or ``stop_check``; then the error, if any (see
        the module docstring). Returns the requests that finished (in any ``FINISHED_*``
        status) in this step; preempted ones are back in the waiting queue."""
        done: list[Request] = []
        for req, token in sampled:
            if req.finished:  # aborted while the step ran
                continue
            req.generated.append(token)
            if token in self.eos_ids:
                req.status, req.stop_reason = RequestStatus.FINISHED_STOPPED, "eos"
            elif self.stop_check is not None and self.stop_check(req):
                req.status, req.stop_reason = RequestStatus.FINISHED_STOPPED, "stop"
            elif len(req.generated) >= req.max_new_tokens:
                req.status, req.stop_reason = RequestStatus.FINISHED_LENGTH_CAPPED, "length"
            else:
                continue
            done.append(req)
        for req in not_run or []:  # admitted, never prefilled: first in line again
            if req in self.running:
                self.running.remove(req)
        for req in reversed(not_run or []):
            if not req.finished:
                req.status = RequestStatus.WAITING
                self.waiting.appendleft(req)
        if error is not None:
            done.extend(self._on_error(sched, error, failed))
        for req in done:
            if req in self.running:
                self.running.remove(req)
                self._removed.append(req)
        if not self.running:
            self.oom_ceiling = None
        return done

    def _on_error(
        self, sched: SchedulerOutput, error: BaseException, failed: Request | None
    ) -> list[Request]:
        """The requests an error fails; preempts one instead where that can help."""
        oom = is_out_of_memory(error)
        if failed is not None:  # a prefill
            others = [r for r in self.running if r is not failed]
            if oom and others:
                self.running.remove(failed)
                self._preempt(failed, self.padded_tokens())
                return []
            failed.status = RequestStatus.FINISHED_ERROR
            failed.error = (
                OutOfMemory("the request did not fit in memory (prefill)") if oom else error
            )
            return [failed]
        rows = [r for r in sched.decode if not r.finished]
        if oom and len(rows) > 1:
            victim = next(r for r in reversed(self.running) if r in rows)
            self.running.remove(victim)
            self._removed.append(victim)
            self._preempt(victim, self.padded_tokens())
            return []
        for req in rows:
            req.status = RequestStatus.FINISHED_ERROR
            req.error = (
                OutOfMemory("the request did not fit in memory (decoding step)") if oom else error
            )
        return rows

    def _preempt(self, req: Request, ceiling: int) -> None:
        req.status = RequestStatus.PREEMPTED
        req.preemptions += 1
        self.waiting.appendleft(req)
        self.oom_ceiling = ceiling
        log.warning(
            "out of memory: request %s preempted (back to the waiting queue); the batch goes on "
            "with %d rows, at most %d padded tokens until it empties",
            req.request_id,
            len(self.running),
            ceiling,
        )
