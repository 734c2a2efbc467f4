"""The tokenizer side of the generation engine, for any transformers tokenizer: the prompt's
token ids (the chat template applied to ``messages``), the generated text with stop strings cut,
the end-of-sequence ids."""

from __future__ import annotations

from typing import Any

from asyncinfer.core.errors import InvalidInput
from asyncinfer.models.engine.request import Request


class TextCodec:
    """Text <-> tokens for one model.

    Args:
        tokenizer: a transformers tokenizer with the model's chat template.
        eos_ids: end-of-sequence token ids (the generation config's ``eos_token_id``, else the
            tokenizer's).
    """

    def __init__(self, tokenizer: Any, eos_ids: set[int]) -> None:
        self.tokenizer = tokenizer
        self.eos_ids = eos_ids

    def encode(self, inp: Any) -> Any:
        """Token ids (a 1 x n tensor) of a :class:`GenerationInput`'s prompt: the chat template
        applied to ``messages`` (with the generation prompt), ``prompt`` as raw text.

        Raises:
            InvalidInput: ``messages`` for a tokenizer without a chat template.
        """
        if inp.messages is not None:
            if not getattr(self.tokenizer, "chat_template", None):
                raise InvalidInput("this model has no chat template; send 'prompt' instead")
            enc = self.tokenizer.apply_chat_template(
                [m.model_dump() for m in inp.messages],
                add_generation_prompt=True,
                return_dict=True,
                return_tensors="pt",
            )
            return enc["input_ids"]
        return self.tokenizer(inp.prompt, return_tensors="pt")["input_ids"]

    def prompt_ids(self, inp: Any, max_prompt_tokens: int) -> list[int]:
        """:meth:`encode` as a list, checked against ``max_prompt_tokens`` (tokens).

        Raises:
            InvalidInput: the prompt is longer (or empty once tokenized).
        """
        ids: list[int] = self.encode(inp)[0].tolist()
        if len(ids) > max_prompt_tokens:
            raise InvalidInput(f"prompt is {len(ids)} tokens; at most {max_prompt_tokens}")
        if not ids:
            raise InvalidInput("prompt has no tokens")
        return ids

    def text(self, tokens: list[int], stop: list[str]) -> tuple[str, bool]:
        """The text of ``tokens`` (special tokens dropped, cut before the first stop string)
        and whether a stop string was found."""
        text = self.tokenizer.decode(tokens, skip_special_tokens=True)
        cut = min((i for i in (text.find(s) for s in stop) if i >= 0), default=-1)
        if cut >= 0:
            return text[:cut], True
        return text, False

    def hit_stop(self, req: Request) -> bool:
        """Whether the tail of ``req``'s generated text holds one of its job's stop strings
        (``req.tag["item"].input.stop``)."""
        tag = req.tag
        stops = tag["item"].input.stop if isinstance(tag, dict) and "item" in tag else []
        if not stops or not req.generated:
            return False
        # Every token decodes to at least one character (or to part of one), so the last
        # len(stop) + a few tokens hold any stop string that ended at this step.
        window = max(16, max(len(s) for s in stops) + 4)
        tail = self.tokenizer.decode(req.generated[-window:])
        return any(s in tail for s in stops)
