"""The worker image installs only pinned Python dependencies, the versions the tests run."""

from __future__ import annotations

import re
import sys
from importlib.metadata import version
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))


def _constraints() -> dict[str, str]:
    out = {}
    for line in (ROOT / "container" / "constraints.txt").read_text().splitlines():
        line = line.split("#")[0].strip()
        if line:
            name, _, pinned = line.partition("==")
            assert pinned, f"not an exact pin: {line!r}"
            out[name] = pinned
    return out


def test_every_pip_install_of_the_image_uses_the_constraints() -> None:
    text = (ROOT / "container" / "Dockerfile").read_text().replace("\\\n", " ")
    installs = re.findall(r"pip install ([^&\n]*)", text)
    assert installs
    for args in installs:
        assert "-c constraints.txt" in args, args
        for token in args.split():
            if not token.startswith("-") and token not in ("constraints.txt", "'.[worker]'"):
                assert token in _constraints(), f"{token} is not pinned"


def test_constraints_are_the_versions_the_tests_run() -> None:
    pins = _constraints()
    for dist in ("aws-lambda-powertools", "pydantic", "transformers", "boto3", "python-ulid"):
        assert pins[dist] == version(dist), dist
    assert pins["torch"] == version("torch").split("+")[0]


def test_constraints_file_is_up_to_date() -> None:
    import pin_image

    assert pin_image.pins() == _constraints()
