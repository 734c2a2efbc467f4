"""Requests of the generation engine, typed, with a status enum (in the manner of vLLM v1's
``Request`` and ``RequestStatus``).

A :class:`Request` is created by the serving layer from a job, added to the
:class:`~asyncinfer.models.engine.scheduler.Scheduler` (``WAITING``), admitted into the running
batch (``RUNNING``), possibly sent back to the waiting queue by an out-of-memory error
(``PREEMPTED``), and ends in one of the ``FINISHED_*`` statuses. No torch import here.
"""

from __future__ import annotations

import enum
import itertools
from dataclasses import dataclass, field
from typing import Any

_ids = itertools.count(1)


class RequestStatus(enum.Enum):
    """Where a request is. The ``FINISHED_*`` members are terminal (:attr:`finished`)."""

    WAITING = "waiting"
    RUNNING = "running"
    PREEMPTED = "preempted"
    #: An end-of-sequence token or a stop string ended it (``finish_reason: stop``).
    FINISHED_STOPPED = "finished_stopped"
    #: ``max_new_tokens`` reached (``finish_reason: length``).
    FINISHED_LENGTH_CAPPED = "finished_length_capped"
    #: Cancelled, timed out or given back at shutdown (:attr:`Request.error` says which).
    FINISHED_ABORTED = "finished_aborted"
    #: Failed: out of memory on its own, or its prefill raised (:attr:`Request.error`).
    FINISHED_ERROR = "finished_error"

    @property
    def finished(self) -> bool:
        """Whether the status is terminal."""
        return self.name.startswith("FINISHED_")


@dataclass(eq=False, kw_only=True)
class Request:
    """One generation request.

    Attributes:
        prompt_ids: the prompt's token ids.
        max_new_tokens: most tokens to generate (the end-of-sequence token counts), tokens.
        temperature: 0 for greedy decoding.
        top_p: nucleus sampling mass, (0, 1].
        seed: seeds this request's own generator (random when ``None``).
        request_id: a unique name (the job id in the worker; a counter by default).
        tag: anything the caller wants back (the work item).
        generated: the tokens generated so far.
        status: see :class:`RequestStatus`.
        stop_reason: ``"eos"``, ``"stop"`` (a stop string) or ``"length"`` once finished so.
        error: the exception of an aborted or failed request.
        generator: the request's ``torch.Generator`` (made on its first sampled token).
        compute_seconds: its share of the engine's time so far, seconds (its prefill, and its
            share of each decoding step it was in).
        preemptions: how many times an out-of-memory error sent it back to the waiting queue.
    """

    prompt_ids: list[int]
    max_new_tokens: int
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None
    request_id: str = field(default_factory=lambda: f"req-{next(_ids)}")
    tag: Any = None
    generated: list[int] = field(default_factory=list)
    status: RequestStatus = RequestStatus.WAITING
    stop_reason: str | None = None
    error: BaseException | None = None
    generator: Any = None
    compute_seconds: float = 0.0
    preemptions: int = 0

    @property
    def reserved_tokens(self) -> int:
        """Tokens this request may hold in the KV cache: prompt plus ``max_new_tokens``."""
        return len(self.prompt_ids) + self.max_new_tokens

    @property
    def all_token_ids(self) -> list[int]:
        """Prompt and generated tokens (what a re-admitted request prefills)."""
        return [*self.prompt_ids, *self.generated]

    @property
    def finished(self) -> bool:
        """Whether the request is in a terminal status."""
        return self.status.finished
