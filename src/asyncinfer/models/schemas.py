"""Input schemas of the models of the spec's "Models" table. Pydantic models, so that the API
validates a job's ``input`` before anything is stored or enqueued, and so that ``GET /v1/models``
can publish each model's JSON Schema. No torch import here: the API Lambda loads this module."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, model_validator

#: Longest text ``all-minilm-l6-v2`` takes, characters. The model reads its first 256 tokens
#: (about 1,000 characters of English) and the tokenizer truncates the rest, so this bounds the
#: tokenizer's work and the job's memory (256 texts: at most ~4 M characters), not the result.
MAX_EMBEDDING_TEXT_CHARS = 16_384
EmbeddingText = Annotated[str, StringConstraints(max_length=MAX_EMBEDDING_TEXT_CHARS)]


class ChatMessage(BaseModel):
    """One chat turn."""

    model_config = ConfigDict(extra="forbid")

    role: Literal["system", "user", "assistant"]
    content: str = Field(max_length=200_000)


class GenerationInput(BaseModel):
    """Input of ``smollm2-135m-instruct`` (spec: ``messages`` or ``prompt``; ``max_new_tokens``
    1..1024, default 128; ``temperature`` 0..2, 0 = greedy; ``top_p`` in (0, 1]; ``seed``;
    ``stop``). ``prompt`` is raw text completed as is; ``messages`` get the chat template."""

    model_config = ConfigDict(extra="forbid")

    messages: list[ChatMessage] | None = Field(default=None, min_length=1, max_length=256)
    prompt: str | None = Field(default=None, min_length=1, max_length=200_000)
    max_new_tokens: int = Field(default=128, ge=1, le=1024, strict=True)
    temperature: float = Field(default=0.0, ge=0.0, le=2.0, strict=True)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0, strict=True)
    seed: int | None = Field(default=None, ge=0, le=2**63 - 1, strict=True)
    stop: list[str] = Field(default_factory=list, max_length=16)

    @model_validator(mode="after")
    def _one_of_messages_or_prompt(self) -> GenerationInput:
        if (self.messages is None) == (self.prompt is None):
            raise ValueError("exactly one of 'messages' or 'prompt' is required")
        if any(s == "" for s in self.stop):
            raise ValueError("'stop' strings must not be empty")
        return self


class EmbeddingInput(BaseModel):
    """Input of ``all-minilm-l6-v2``: ``texts``, 1..256 strings of at most
    :data:`MAX_EMBEDDING_TEXT_CHARS` characters each."""

    model_config = ConfigDict(extra="forbid")

    texts: list[EmbeddingText] = Field(min_length=1, max_length=256)


class EchoFault(BaseModel):
    """Fault injection for tests of the worker's error paths: the echo model raises the given
    kind of error while the job's attempt number is at most ``attempts``."""

    model_config = ConfigDict(extra="forbid")

    kind: Literal["retryable", "permanent"]
    attempts: int = Field(default=1_000_000, ge=1, strict=True)


class EchoInput(BaseModel):
    """Input of ``echo``: any JSON object, returned as the output. ``sleep_seconds`` (0..60) makes
    the job take that long; ``fail`` injects an error (tests)."""

    model_config = ConfigDict(extra="allow")

    sleep_seconds: float = Field(default=0.0, ge=0.0, le=60.0, strict=True)
    fail: EchoFault | None = None
