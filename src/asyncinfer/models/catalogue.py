"""The model catalogue: ``models.yaml`` (contract: ``shared/spec/models.md``), as pydantic models.

The file is data owned by whoever deploys the service; the API, the workers, the local stack and
the CDK app all read it. :func:`load_catalogue` validates the whole file and raises one
:class:`~asyncinfer.core.errors.CatalogueError` listing every problem, each as
``models[i].field: what is wrong`` (with the entry's id where it is known).

No torch, transformers or model code is imported here: the API Lambda loads this module.
Relative paths in the file (``source``, ``input_schema``) are relative to the file's folder.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from asyncinfer.core.errors import CatalogueError

Kind = Literal["causal-lm", "embeddings", "python", "openai-server", "echo"]
KINDS: tuple[str, ...] = ("causal-lm", "embeddings", "python", "openai-server", "echo")
#: Model ids (spec: 1..64 characters, ``[a-z0-9][a-z0-9.-]*``); part of the API.
ID_PATTERN = r"^[a-z0-9][a-z0-9.-]{0,63}$"
#: ``module:Class`` of a ``python`` entry's handler.
HANDLER_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*$"
_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")
#: S3 bucket names (AWS "Bucket naming rules": 3..63 of lower-case letters, digits, ``.``, ``-``).
_S3 = re.compile(r"^s3://([a-z0-9][a-z0-9.-]{1,61}[a-z0-9])(/.*)?$")
#: ``wheel:DIST[/PATH]``; DIST is a distribution name (PEP 508 names).
_WHEEL = re.compile(r"^wheel:([A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?)(/.+)?$")

#: Which optional fields each kind may set (spec, "Kinds"); a field outside its kinds is an error.
KIND_FIELDS: dict[str, tuple[str, ...]] = {
    "gguf_file": ("causal-lm",),
    "limits": ("causal-lm", "openai-server"),
    "handler": ("python",),
    "input_schema": ("python",),
    "engine": ("openai-server",),
    "pooling": ("embeddings",),
    "normalize": ("embeddings",),
    "source": ("causal-lm", "embeddings", "python", "openai-server"),
}
#: Fields each kind must set.
REQUIRED_FIELDS: dict[str, tuple[str, ...]] = {
    "causal-lm": ("source",),
    "embeddings": ("source",),
    "python": ("handler", "input_schema"),
    "openai-server": ("engine",),
    "echo": (),
}


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Limits(_Strict):
    """Per-job input limits the API enforces (``causal-lm`` / ``openai-server``), tokens."""

    max_new_tokens: int = Field(default=1024, ge=1, le=1_000_000, strict=True)
    max_prompt_tokens: int | None = Field(default=None, ge=1, strict=True)


class Compute(_Strict):
    """Where the CDK app runs the entry's workers (the local stack ignores it).

    ``gpus: 0`` is a CPU worker; ``price_per_hour`` is USD per worker-hour (per-job cost);
    ``backlog_per_worker`` is the jobs per worker the scaling policy aims at; ``warm_pool`` is
    the stopped instances an EC2 Auto Scaling warm pool keeps ready for the entry's ECS capacity
    (0: none; their EBS volumes are the idle cost), so a scale-out from zero skips the launch
    and boot of a new instance and the image pull.
    """

    backend: Literal["ecs", "sagemaker"] = "ecs"
    instance_type: str | None = Field(default=None, min_length=1, max_length=64)
    gpus: int = Field(default=1, ge=0, le=64, strict=True)
    min_workers: int = Field(default=0, ge=0, strict=True)
    max_workers: int = Field(default=2, ge=1, strict=True)
    backlog_per_worker: float = Field(default=20, gt=0)
    price_per_hour: float | None = Field(default=None, ge=0)
    warm_pool: int = Field(default=0, ge=0, le=100, strict=True)


#: ``engine.image: aws:NAME`` names one of AWS's serving containers, resolved per region at synth
#: by the ``sagemaker`` SDK (``sagemaker.core.image_uris.retrieve(NAME, region, version=...)``):
#: LMI (DJL, vLLM inside), TGI (``huggingface-llm``) and TEI (``huggingface-tei``, embeddings).
AWS_IMAGES: tuple[str, ...] = ("djl-lmi", "huggingface-llm", "huggingface-tei")
AWS_IMAGE_PREFIX = "aws:"


class Engine(_Strict):
    """The OpenAI-compatible server an ``openai-server`` entry's worker feeds: ``url`` of one
    already running, or ``image`` of one the CDK app runs beside the worker (ECS) or as the
    SageMaker endpoint's container.

    ``image`` is an image reference, or ``aws:NAME`` (:data:`AWS_IMAGES`, SageMaker only) with
    ``version`` (the container's version, e.g. ``0.31.0`` for LMI). ``api`` is what the engine
    serves the entry's jobs with: ``chat`` (``/v1/chat/completions`` and ``/v1/completions``;
    input and output of ``causal-lm``) or ``embeddings`` (``/v1/embeddings``; input and output
    of the ``embeddings`` kind: ``texts`` -> ``embeddings``, ``dim``)."""

    url: str | None = Field(default=None, pattern=r"^https?://")
    model: str = Field(min_length=1)
    image: str | None = Field(default=None, min_length=1)
    version: str | None = Field(default=None, min_length=1, max_length=64)
    args: list[str] = Field(default_factory=list)
    tensor_parallel: int = Field(default=1, ge=1, strict=True)
    api: Literal["chat", "embeddings"] = "chat"

    @property
    def aws_image(self) -> str | None:
        """``NAME`` of an ``image: aws:NAME``, else ``None``."""
        if self.image and self.image.startswith(AWS_IMAGE_PREFIX):
            return self.image[len(AWS_IMAGE_PREFIX) :]
        return None


class ModelEntry(_Strict):
    """One entry of ``models:`` (spec, "Shape"). Kind-specific fields are checked by
    :func:`parse_catalogue`, which knows the entry's kind even when other fields are wrong."""

    id: str = Field(pattern=ID_PATTERN)
    kind: Kind
    source: str | None = None
    gguf_file: str | None = Field(default=None, pattern=r"^[^/\\]+\.gguf$")
    description: str = Field(default="", max_length=500)
    device: Literal["auto", "cuda", "cpu"] = "auto"
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    max_batch_size: int = Field(default=1, ge=1, le=4096, strict=True)
    token_budget: Literal["auto"] | int = "auto"
    limits: Limits | None = None
    compute: Compute = Field(default_factory=Compute)
    handler: str | None = Field(default=None, pattern=HANDLER_PATTERN)
    input_schema: str | None = Field(default=None, min_length=1)
    engine: Engine | None = None
    pooling: Literal["mean", "cls"] = "mean"
    normalize: bool = True


class Catalogue(BaseModel):
    """A loaded catalogue: its entries in file order and the file it came from.

    Attributes:
        path: the file (absolute), or ``None`` for one built in memory.
        models: the entries.
        input_schemas: ``{id: JSON Schema}`` of the ``python`` entries, read from their files.
    """

    model_config = ConfigDict(frozen=True)

    path: Path | None = None
    models: tuple[ModelEntry, ...]
    input_schemas: dict[str, dict[str, Any]] = Field(default_factory=dict)

    @property
    def base_dir(self) -> Path:
        """The folder relative paths are resolved against."""
        return self.path.parent if self.path is not None else Path.cwd()

    @property
    def ids(self) -> list[str]:
        """Model ids in file order."""
        return [m.id for m in self.models]

    def get(self, model_id: str) -> ModelEntry | None:
        """The entry of ``model_id``, or ``None``."""
        return next((m for m in self.models if m.id == model_id), None)

    def resolve(self, relative: str) -> Path:
        """A path of the file (``input_schema``, a relative ``source``) made absolute."""
        p = Path(relative.removeprefix("file://"))
        return p if p.is_absolute() else (self.base_dir / p).resolve()


def source_problem(source: str) -> str | None:
    """What is wrong with a ``source`` value, or ``None`` (spec, "Sources": ``s3://bucket/prefix/``,
    ``file:///abs/path``, a path relative to the catalogue, ``wheel:DIST``)."""
    if not source.strip():
        return "must not be empty"
    if source.startswith("s3://"):
        if not _S3.match(source):
            return "s3:// source must be s3://BUCKET/PREFIX/ with a valid bucket name"
        return None
    if source.startswith("file:"):
        if not source.startswith("file:///"):
            return "file: source must be an absolute file:///path"
        return None
    if source.startswith("wheel:"):
        if not _WHEEL.match(source):
            return "wheel: source must be wheel:DIST or wheel:DIST/PATH (an installed distribution)"
        return None
    if _SCHEME.match(source):
        return "unknown source scheme; use s3://, file:///, wheel: or a relative path"
    if source.startswith(("/", "\\")):
        return f"absolute paths are written file://{source}"
    return None


def _where(index: int, entry: Any) -> tuple[str, str]:
    ident = entry.get("id") if isinstance(entry, dict) else None
    suffix = f" (model {ident!r})" if isinstance(ident, str) and ident else ""
    return f"models[{index}]", suffix


def _entry_problems(index: int, raw: Any) -> list[str]:
    """Every problem of one raw entry: pydantic's, then the kind-specific rules."""
    at, suffix = _where(index, raw)
    if not isinstance(raw, dict):
        return [f"{at}: must be a mapping of fields, not {type(raw).__name__}"]
    problems: list[str] = []
    try:
        ModelEntry.model_validate(raw)
    except ValidationError as exc:
        for err in exc.errors(include_url=False):
            loc = ".".join(str(p) for p in err["loc"])
            msg = err["msg"]
            if err["type"] == "literal_error" and err["loc"] == ("kind",):
                msg = f"unknown kind {raw.get('kind')!r}; one of {', '.join(KINDS)}"
            elif err["type"] == "string_pattern_mismatch" and err["loc"] == ("id",):
                msg = "must be 1..64 characters of [a-z0-9.-], starting with a letter or digit"
            problems.append(f"{at}.{loc}: {msg}{suffix}")
    kind = raw.get("kind")
    if kind in KINDS:
        for name, kinds in KIND_FIELDS.items():
            if name in raw and raw[name] is not None and kind not in kinds:
                problems.append(
                    f"{at}.{name}: only for kind {' or '.join(kinds)}, not {kind}{suffix}"
                )
        for name in REQUIRED_FIELDS[kind]:
            if raw.get(name) in (None, ""):
                problems.append(f"{at}.{name}: required for kind {kind}{suffix}")
    source = raw.get("source")
    if isinstance(source, str):
        why = source_problem(source)
        if why:
            problems.append(f"{at}.source: {why}{suffix}")
    elif source is not None:
        problems.append(f"{at}.source: must be a string{suffix}")
    if raw.get("gguf_file") is not None and kind == "causal-lm" and not raw.get("source"):
        problems.append(f"{at}.gguf_file: only for a GGUF source; the entry has no source{suffix}")
    compute = raw.get("compute")
    if isinstance(compute, dict):
        lo, hi = compute.get("min_workers", 0), compute.get("max_workers", 2)
        if isinstance(lo, int) and isinstance(hi, int) and lo > hi:
            problems.append(f"{at}.compute.min_workers: {lo} is more than max_workers {hi}{suffix}")
        pool = compute.get("warm_pool", 0)
        if compute.get("backend") == "sagemaker" and isinstance(pool, int) and pool > 0:
            problems.append(
                f"{at}.compute.warm_pool: only for backend ecs (a SageMaker endpoint has no warm "
                f"pool); set 0{suffix}"
            )
    engine = raw.get("engine")
    if (
        isinstance(engine, dict)
        and kind == "openai-server"
        and bool(engine.get("url")) == bool(engine.get("image"))
    ):
        problems.append(f"{at}.engine: exactly one of url or image is required{suffix}")
    if isinstance(engine, dict) and kind == "openai-server":
        problems.extend(_engine_problems(at, suffix, engine, raw.get("compute")))
    budget = raw.get("token_budget")
    if isinstance(budget, int) and not isinstance(budget, bool) and budget < 1:
        problems.append(f"{at}.token_budget: must be 'auto' or at least 1{suffix}")
    return problems


def _engine_problems(at: str, suffix: str, engine: dict[str, Any], compute: Any) -> list[str]:
    """The rules of an ``openai-server`` entry's ``engine`` beyond its fields' own: ``args`` and
    ``tensor_parallel`` are for an engine the CDK app runs (``image``), and a tensor-parallel
    engine needs that many GPUs (``compute.gpus``, default 1)."""
    out: list[str] = []
    if engine.get("url") and not engine.get("image"):
        for name in ("args", "tensor_parallel"):
            if engine.get(name) not in (None, [], 1):
                out.append(
                    f"{at}.engine.{name}: only for an engine.image the CDK app runs; an "
                    f"engine.url is already running{suffix}"
                )
    image = engine.get("image")
    if isinstance(image, str) and image.startswith(AWS_IMAGE_PREFIX):
        name = image[len(AWS_IMAGE_PREFIX) :]
        if name not in AWS_IMAGES:
            out.append(
                f"{at}.engine.image: unknown AWS container {name!r}; one of "
                f"{', '.join(AWS_IMAGE_PREFIX + n for n in AWS_IMAGES)}, or an image URI{suffix}"
            )
        if not engine.get("version"):
            out.append(
                f"{at}.engine.version: required with image {image} (the container's version, "
                f"as sagemaker.image_uris.retrieve takes it){suffix}"
            )
    elif engine.get("version") is not None:
        out.append(f"{at}.engine.version: only with an image aws:NAME{suffix}")
    tp = engine.get("tensor_parallel", 1)
    gpus = compute.get("gpus", 1) if isinstance(compute, dict) else 1
    if (
        engine.get("image")
        and isinstance(tp, int)
        and isinstance(gpus, int)
        and not isinstance(gpus, bool)
        and tp > max(gpus, 1)
    ):
        out.append(
            f"{at}.engine.tensor_parallel: {tp} needs as many GPUs; compute.gpus is {gpus}{suffix}"
        )
    return out


def _read_schema(path: Path) -> tuple[dict[str, Any] | None, str | None]:
    """``(schema, None)`` or ``(None, what is wrong)`` for an ``input_schema`` file."""
    try:
        schema = json.loads(path.read_text())
    except FileNotFoundError:
        return None, f"file {path} not found"
    except (OSError, ValueError) as exc:
        return None, f"file {path} is not JSON: {exc}"
    if not isinstance(schema, dict):
        return None, f"file {path} is not a JSON Schema object"
    from asyncinfer.models.json_input import schema_problem

    why = schema_problem(schema)
    if why:
        return None, f"file {path} is not a valid JSON Schema: {why}"
    return schema, None


def parse_catalogue(data: Any, path: Path | None = None) -> Catalogue:
    """Validate a parsed ``models.yaml`` document.

    Args:
        data: the YAML document (a mapping with ``models:``, a list of entries).
        path: the file it came from (relative paths resolve against its folder).

    Raises:
        CatalogueError: listing every problem of every entry and of the file, at once.
    """
    where = str(path) if path is not None else "models catalogue"
    base_dir = path.parent if path is not None else Path.cwd()
    if not isinstance(data, dict) or "models" not in data:
        raise CatalogueError(where, ["models: the file must be a mapping with a 'models:' list"])
    problems = [f"{k}: unknown top-level key" for k in data if k != "models"]
    raw_models = data["models"]
    if not isinstance(raw_models, list) or not raw_models:
        raise CatalogueError(where, [*problems, "models: must be a non-empty list of entries"])
    seen: dict[str, int] = {}
    for i, raw in enumerate(raw_models):
        problems.extend(_entry_problems(i, raw))
        ident = raw.get("id") if isinstance(raw, dict) else None
        if isinstance(ident, str):
            if ident in seen:
                problems.append(
                    f"models[{i}].id: duplicate id {ident!r} (also models[{seen[ident]}])"
                )
            else:
                seen[ident] = i
    schemas: dict[str, dict[str, Any]] = {}
    for i, raw in enumerate(raw_models):
        if not isinstance(raw, dict) or raw.get("kind") != "python":
            continue
        rel = raw.get("input_schema")
        if isinstance(rel, str) and rel:
            p = Path(rel.removeprefix("file://"))
            schema, why = _read_schema(p if p.is_absolute() else base_dir / p)
            at, suffix = _where(i, raw)
            if why:
                problems.append(f"{at}.input_schema: {why}{suffix}")
            elif schema is not None and isinstance(raw.get("id"), str):
                schemas[raw["id"]] = schema
    if problems:
        raise CatalogueError(where, problems)
    entries = tuple(ModelEntry.model_validate(raw) for raw in raw_models)
    return Catalogue(path=path, models=entries, input_schemas=schemas)


def load_catalogue(path: str | Path) -> Catalogue:
    """Read and validate the catalogue file at ``path``.

    Raises:
        CatalogueError: the file is missing, is not YAML, or has problems (all of them listed).
    """
    p = Path(path).expanduser().resolve()
    try:
        text = p.read_text()
    except OSError as exc:
        raise CatalogueError(str(p), [f"cannot read the file: {exc.strerror or exc}"]) from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise CatalogueError(str(p), [f"not valid YAML: {exc}"]) from None
    return parse_catalogue(data, p)


def default_models_file() -> Path:
    """The catalogue used when ``ASYNCINFER_MODELS_FILE`` is unset: the project's ``models.yaml``
    in a source checkout (the repository root), else the copy packaged with :mod:`asyncinfer`
    (``asyncinfer/models/models.yaml``, the same file: a link in the repository, a copy in
    wheels and in the Lambda code assets)."""
    packaged = Path(__file__).with_name("models.yaml")
    project = Path(__file__).resolve().parents[3] / "models.yaml"
    if (project.parent / "pyproject.toml").exists() and project.exists():
        return project
    return packaged
