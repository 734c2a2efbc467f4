"""Fixtures of the CDK tests: each compute mode is synthesized once per session, with cdk-nag's
AwsSolutions checks applied in the same synth. No Docker, no AWS credentials needed."""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

os.environ.setdefault("JSII_SILENCE_WARNING_DEPRECATED_NODE_VERSION", "1")
ROOT = Path(__file__).resolve().parents[2]
for p in (ROOT, ROOT / "src"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

#: While container/Dockerfile is not in the repository, synth against a stand-in.
DOCKERFILE = (
    "container/Dockerfile"
    if (ROOT / "container" / "Dockerfile").is_file()
    else "tests/infra/fixtures/Dockerfile"
)

#: Context of each mode: ECS with every default; SageMaker with the optional parts switched on.
MODES: dict[str, dict[str, Any]] = {
    "ecs": {"compute": "ecs"},
    "sagemaker": {
        "compute": "sagemaker",
        "waf_max_body_kb": "64",
        "alarm_email": "ops@example.com",
    },
}


@dataclass
class Synth:
    """One synthesized stack: its template (dict and assertions), the stack object, the cloud
    assembly folder, the template path, and the synth error (cdk-nag validation) if any."""

    mode: str
    template: dict[str, Any]
    assertions: Any
    stack: Any
    outdir: Path
    template_path: Path
    validation_error: str | None

    def resources(self, rtype: str) -> dict[str, dict[str, Any]]:
        """Logical id -> resource of type ``rtype`` (ids are keys only, never matched)."""
        return {k: v for k, v in self.template["Resources"].items() if v["Type"] == rtype}

    def props(self, rtype: str) -> list[dict[str, Any]]:
        """The Properties of every resource of type ``rtype``."""
        return [r.get("Properties", {}) for r in self.resources(rtype).values()]


_cache: dict[str, Synth] = {}


def synth(mode: str, outdir: Path) -> Synth:
    """Synthesize ``mode`` once per session (with AwsSolutionsChecks)."""
    if mode in _cache:
        return _cache[mode]
    import aws_cdk as cdk
    from aws_cdk.assertions import Template
    from cdk_nag import AwsSolutionsChecks

    from infra.app import build_app, feature_flags

    context = {**feature_flags(), "worker_dockerfile": DOCKERFILE, **MODES[mode]}
    app = cdk.App(context=context, outdir=str(outdir))
    _, stack = build_app(app)
    cdk.Validations.of(app).add_plugins(AwsSolutionsChecks(app))
    error = None
    try:
        app.synth()
    except Exception as exc:  # cdk-nag findings fail validation after the templates are written
        error = str(exc)
    path = outdir / f"{stack.stack_name}.template.json"
    template = json.loads(path.read_text())
    _cache[mode] = Synth(
        mode=mode,
        template=template,
        assertions=Template.from_json(template),
        stack=stack,
        outdir=outdir,
        template_path=path,
        validation_error=error,
    )
    return _cache[mode]


@pytest.fixture(scope="session")
def ecs(tmp_path_factory: pytest.TempPathFactory) -> Synth:
    return synth("ecs", tmp_path_factory.mktemp("cdk-ecs"))


@pytest.fixture(scope="session")
def sagemaker(tmp_path_factory: pytest.TempPathFactory) -> Synth:
    return synth("sagemaker", tmp_path_factory.mktemp("cdk-sagemaker"))


@pytest.fixture(scope="session", params=sorted(MODES))
def any_mode(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Synth:
    """Both modes, one after the other (the properties every deployment has)."""
    return synth(request.param, tmp_path_factory.mktemp(f"cdk-{request.param}"))
