"""The model registry: model ids (part of the contract), their tasks, input schemas, batch sizes,
and the handler class a worker loads. Adding a model means one handler module and one entry here.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ValidationError

from asyncinfer.errors import InvalidRequest
from asyncinfer.models.schemas import EchoInput, EmbeddingInput, GenerationInput

if TYPE_CHECKING:
    from asyncinfer.models.base import ModelHandler


@dataclass(frozen=True, kw_only=True)
class ModelSpec:
    """What the service knows of one model.

    Attributes:
        id: the model id of the spec ("Models" table).
        task: ``text-generation``, ``embeddings`` or ``echo``.
        input_model: pydantic model that validates a job's ``input``.
        handler: ``"module:Class"`` of its :class:`~asyncinfer.models.base.ModelHandler`.
        max_batch_size: most jobs a worker runs together.
        description: one line for ``GET /v1/models``.
    """

    id: str
    task: str
    input_model: type[BaseModel]
    handler: str
    max_batch_size: int
    description: str

    def load_handler(self, **kwargs: Any) -> ModelHandler:
        """Import and build this model's handler (does not load weights; call ``load()``)."""
        module_name, _, cls_name = self.handler.partition(":")
        cls = getattr(importlib.import_module(module_name), cls_name)
        return cls(spec=self, **kwargs)

    def describe(self) -> dict[str, Any]:
        """The entry of ``GET /v1/models``: ``{"id", "task", "input_schema", "max_batch_size"}``."""
        return {
            "id": self.id,
            "task": self.task,
            "description": self.description,
            "input_schema": self.input_model.model_json_schema(),
            "max_batch_size": self.max_batch_size,
        }


MODELS: dict[str, ModelSpec] = {
    spec.id: spec
    for spec in (
        ModelSpec(
            id="smollm2-135m-instruct",
            task="text-generation",
            input_model=GenerationInput,
            handler="asyncinfer.models.smollm2:SmolLM2Handler",
            max_batch_size=64,
            description="SmolLM2-135M-Instruct (Q4_1 GGUF, dequantised once) chat generation",
        ),
        ModelSpec(
            id="all-minilm-l6-v2",
            task="embeddings",
            input_model=EmbeddingInput,
            handler="asyncinfer.models.minilm:MiniLMHandler",
            max_batch_size=32,
            description="all-MiniLM-L6-v2 sentence embeddings, 384 floats, L2-normalised",
        ),
        ModelSpec(
            id="echo",
            task="echo",
            input_model=EchoInput,
            handler="asyncinfer.models.echo:EchoHandler",
            max_batch_size=10,
            description="Returns its input; for tests and overhead benchmarks",
        ),
    )
}


def get_spec(model_id: str) -> ModelSpec:
    """The spec of ``model_id``; :class:`InvalidRequest` naming the ``model`` field if unknown."""
    try:
        return MODELS[model_id]
    except KeyError:
        raise InvalidRequest(
            f"unknown model {model_id!r}",
            [{"field": "model", "message": f"must be one of {sorted(MODELS)}", "type": "enum"}],
        ) from None


def validate_input(spec: ModelSpec, data: Any) -> BaseModel:
    """Validate a job's ``input`` against ``spec``'s schema.

    Raises:
        InvalidRequest: with one ``details`` entry per problem, fields named ``input.<path>``.
    """
    try:
        return spec.input_model.model_validate(data)
    except ValidationError as exc:
        raise InvalidRequest(
            f"input is not valid for model {spec.id!r}", validation_details(exc, prefix=("input",))
        ) from None


def validation_details(exc: ValidationError, prefix: tuple[str, ...] = ()) -> list[dict[str, Any]]:
    """Turn a pydantic ``ValidationError`` into ``details`` entries naming dotted fields."""
    out = []
    for err in exc.errors(include_url=False):
        loc = [str(p) for p in (*prefix, *err["loc"])]
        out.append({"field": ".".join(loc), "message": err["msg"], "type": err["type"]})
    return out
