"""Where a catalogue entry's weights are on this machine (spec ``models.md``, "Sources").

``file:///abs/path`` and paths relative to the catalogue are read in place; ``wheel:DIST[/PATH]``
is a folder inside an installed Python distribution (its top-level package, or ``PATH`` within
that package). ``s3://`` sources are downloaded by the worker to its cache (:mod:`.weights`).
"""

from __future__ import annotations

import importlib.metadata
from pathlib import Path

from asyncinfer.models.catalogue import _WHEEL


def wheel_dir(source: str) -> Path:
    """The folder of a ``wheel:DIST[/PATH]`` source.

    Raises:
        FileNotFoundError: the distribution is not installed, has no package folder, or ``PATH``
            is not inside it.
    """
    m = _WHEEL.match(source)
    if not m:
        raise ValueError(f"not a wheel: source: {source!r}")
    dist_name, sub = m.group(1), (m.group(3) or "").lstrip("/")
    try:
        dist = importlib.metadata.distribution(dist_name)
    except importlib.metadata.PackageNotFoundError:
        raise FileNotFoundError(
            f"distribution {dist_name!r} is not installed (pip install --no-deps {dist_name})"
        ) from None
    packages = sorted(
        {f.parts[0] for f in dist.files or [] if len(f.parts) > 1 and f.parts[0].isidentifier()}
    )
    if not packages:
        raise FileNotFoundError(f"distribution {dist_name!r} has no package folder")
    folder = Path(str(dist.locate_file(packages[0]))) / sub
    if not folder.exists():
        raise FileNotFoundError(f"{source}: {folder} does not exist")
    return folder


def local_source_dir(source: str, base_dir: Path) -> Path:
    """The folder of a ``file:``, relative or ``wheel:`` source (``base_dir``: the catalogue's).

    Raises:
        NotImplementedError: an ``s3://`` source (the worker's download cache resolves those).
        FileNotFoundError: a ``wheel:`` distribution that is not installed.
    """
    if source.startswith("s3://"):
        raise NotImplementedError(f"{source}: s3:// sources are downloaded by the worker's cache")
    if source.startswith("wheel:"):
        return wheel_dir(source)
    p = Path(source.removeprefix("file://"))
    return p if p.is_absolute() else (base_dir / p).resolve()
