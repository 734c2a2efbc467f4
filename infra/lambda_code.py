"""Lambda code assets assembled from the repository by a plain local step at synth time: no
Docker, no pip download. Each asset directory holds

* ``asyncinfer/``: the shared package from ``src/`` (without caches);
* the ``ulid`` package (python-ulid; pure Python), ``yaml`` (PyYAML, which the model
  catalogue needs; its optional C extension is skipped, the pure-Python loader runs) and
  ``pydantic_settings`` with its pure-Python dependencies ``dotenv`` and ``typing_inspection``
  (the settings object, :mod:`asyncinfer.core.settings`) copied from the current environment,
  because the Powertools layer does not ship them;
* the default model catalogue, ``asyncinfer/models/models.yaml`` (in the repository a link to the
  root ``models.yaml``; copied here as a file);
* the files of ``lambdas/<name>/`` at the top level, so the handler is ``app.handler``.

Powertools, pydantic and the X-Ray SDK come from the published Powertools Lambda layer; boto3
from the Lambda runtime.
"""

from __future__ import annotations

import atexit
import importlib.util
import shutil
import tempfile
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
_IGNORE = shutil.ignore_patterns("__pycache__", "*.pyc", "*.pyo", ".mypy_cache", ".ruff_cache")
#: Packages every asset gets: the shared package imports them at module level (pure-Python
#: fallbacks only).
ALWAYS_VENDORED = ("yaml", "pydantic_settings", "dotenv", "typing_inspection")
_IGNORE_VENDORED = shutil.ignore_patterns("__pycache__", "*.pyc", "*.pyo", "*.so")
_staged: dict[str, Path] = {}
_root: Path | None = None


def _staging_root() -> Path:
    global _root
    if _root is None:
        _root = Path(tempfile.mkdtemp(prefix="asyncinfer-lambda-"))
        atexit.register(shutil.rmtree, _root, True)
    return _root


def _package_dir(module: str) -> Path:
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError(
            f"package {module!r} is not installed in this environment; the Lambda asset needs it "
            "(install the project's dependencies first)"
        )
    return Path(next(iter(spec.submodule_search_locations)))


def stage_lambda_code(
    name: str, *, vendored: tuple[str, ...] = ("ulid",), models_file: Path | None = None
) -> str:
    """Assemble the code directory of ``lambdas/<name>`` and return its path.

    Args:
        name: a folder under ``lambdas/`` holding ``app.py`` (the entry point ``app.handler``).
        vendored: importable packages copied from the current environment into the asset.
        models_file: a model catalogue staged into the asset by :func:`stage_catalogue`
            (the function's ``ASYNCINFER_MODELS_FILE`` is then ``/var/task/`` +
            :func:`catalogue_path_in_asset`).

    The directory is built once per process; CDK fingerprints its content, so the asset hash
    changes only when the code does.
    """
    key = name if models_file is None else f"{name}|{Path(models_file).resolve()}"
    if key in _staged:
        return str(_staged[key])
    src = REPO_ROOT / "lambdas" / name
    if not src.is_dir():
        raise FileNotFoundError(f"no Lambda source folder {src}")
    out = _staging_root() / (name if models_file is None else f"{name}-{len(_staged)}")
    shutil.copytree(REPO_ROOT / "src" / "asyncinfer", out / "asyncinfer", ignore=_IGNORE)
    for module in vendored:
        shutil.copytree(_package_dir(module), out / module, ignore=_IGNORE)
    for module in ALWAYS_VENDORED:
        if module not in vendored:
            # Its compiled extension is built for this machine, not for Lambda's (arm64, 3.12).
            shutil.copytree(_package_dir(module), out / module, ignore=_IGNORE_VENDORED)
    for item in sorted(src.iterdir()):
        if item.name in ("__pycache__",) or item.suffix in (".pyc",):
            continue
        if item.is_dir():
            shutil.copytree(item, out / item.name, ignore=_IGNORE)
        else:
            shutil.copy2(item, out / item.name)
    if models_file is not None:
        stage_catalogue(Path(models_file), out)
    _staged[key] = out
    return str(out)


#: Where :func:`stage_catalogue` puts a catalogue inside a code asset (``/var/task/`` + this).
CATALOGUE_DIR = "catalogue"


def catalogue_path_in_asset(models_file: Path) -> str:
    """Where :func:`stage_catalogue` puts ``models_file`` inside an asset (relative)."""
    return f"{CATALOGUE_DIR}/{Path(models_file).name}"


def stage_catalogue(models_file: Path, out: Path) -> str:
    """Copy a model catalogue into a staged code asset, with the files its entries reference
    that the API reads (the ``input_schema`` files of ``python`` entries), at the same paths
    relative to the catalogue. Weights (``source``) are not copied: the API never reads them.

    Args:
        models_file: the catalogue (validated first; an invalid one raises ``CatalogueError``).
        out: the asset directory (as :func:`stage_lambda_code` returns it).

    Returns:
        The catalogue's path inside the asset (``catalogue/models.yaml``): the Lambda's
        ``ASYNCINFER_MODELS_FILE`` is ``/var/task/`` followed by it.

    Raises:
        CatalogueError: the catalogue is invalid (every problem listed).
        ValueError: an ``input_schema`` lies outside the catalogue's folder.
    """
    from asyncinfer.models.catalogue import load_catalogue

    catalogue = load_catalogue(models_file)
    src = Path(models_file).resolve()
    target = Path(out) / CATALOGUE_DIR
    target.mkdir(parents=True, exist_ok=True)
    shutil.copy2(src, target / src.name)
    for entry in catalogue.models:
        if not entry.input_schema:
            continue
        schema = catalogue.resolve(entry.input_schema)
        try:
            rel = schema.relative_to(src.parent)
        except ValueError:
            raise ValueError(
                f"{entry.id}: input_schema {entry.input_schema} is outside {src.parent}; "
                "keep schemas in the catalogue's folder"
            ) from None
        (target / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(schema, target / rel)
    return f"{CATALOGUE_DIR}/{src.name}"
