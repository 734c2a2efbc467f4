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
#: Both put every model of the default catalogue on one instance type with a GPU (explicit context
#: keys override each entry's ``compute:``; infra.model_compute), as the stack did before the
#: catalogue's per-entry compute; tests/infra/test_infra_catalogue.py covers per-entry compute.
ONE_INSTANCE_TYPE = {"instance_type": "g5.xlarge", "gpu": "true"}
MODES: dict[str, dict[str, Any]] = {
    "ecs": {"compute": "ecs", **ONE_INSTANCE_TYPE},
    "sagemaker": {
        "compute": "sagemaker",
        **ONE_INSTANCE_TYPE,
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
        """Logical id -> resource of type ``rtype`` (ids are keys only, never matched), in the
        stack and in its nested stacks (a large catalogue's models)."""
        out = {k: v for k, v in self.template["Resources"].items() if v["Type"] == rtype}
        for i, nested in enumerate(self.nested_templates()):
            for k, v in nested["Resources"].items():
                if v["Type"] == rtype:
                    out[f"nested{i}/{k}"] = v
        return out

    def nested_templates(self) -> list[dict[str, Any]]:
        """The templates of the stack's nested stacks (none for the default catalogue)."""
        return [
            json.loads(p.read_text()) for p in sorted(self.outdir.glob("*.nested.template.json"))
        ]

    def props(self, rtype: str) -> list[dict[str, Any]]:
        """The Properties of every resource of type ``rtype``."""
        return [r.get("Properties", {}) for r in self.resources(rtype).values()]


#: A 50-model catalogue (ids as long as real ones), for the limits that grow with models.
CATALOGUE_50 = [f"org-model-family-v{i:02d}-instruct" for i in range(50)]

#: Variants synthesized once each: the 50-model catalogue in both modes, with the non-default
#: settings (data not retained, SSM access, no dashboard, pinned Powertools layer) on the ECS one.
VARIANTS: dict[str, dict[str, Any]] = {
    "ecs-50": {
        "compute": "ecs",
        "models": ",".join(CATALOGUE_50),
        "retain_data": "false",
        "instance_ssm_access": "true",
        "dashboard": "false",
        "powertools_layer_version": "27",
    },
    "sagemaker-50": {
        "compute": "sagemaker",
        "models": ",".join(CATALOGUE_50),
        "alarm_email": "ops@example.com",
    },
    # tests/infra/fixtures/catalogue3: each entry's compute from the catalogue (no override).
    "catalogue3": {"models_file": str(ROOT / "tests/infra/fixtures/catalogue3/models.yaml")},
    # tests/infra/fixtures/openai_engine: openai-server entries with an engine image (issue 16).
    "openai-engine": {"models_file": str(ROOT / "tests/infra/fixtures/openai_engine/models.yaml")},
    # The same kind of entries on SageMaker: the endpoint runs the engine (issue 16).
    "openai-engine-sagemaker": {
        "models_file": str(ROOT / "tests/infra/fixtures/openai_engine_sagemaker/models.yaml")
    },
    "catalogue3-sagemaker": {
        "compute": "sagemaker",
        "models_file": str(ROOT / "tests/infra/fixtures/catalogue3/models.yaml"),
    },
}

_cache: dict[str, Synth] = {}


def write_catalogue(path: Path, models: list[str]) -> Path:
    """A ``models.yaml`` at ``path`` with an ``echo``-kind entry per id (compute: defaults), the
    catalogue the 50-model variants deploy (``models_file``)."""
    import yaml

    path.write_text(yaml.safe_dump({"models": [{"id": m, "kind": "echo"} for m in models]}))
    return path


def synth(mode: str, outdir: Path) -> Synth:
    """Synthesize ``mode`` (a key of :data:`MODES` or :data:`VARIANTS`) once per session (with
    AwsSolutionsChecks)."""
    if mode in _cache:
        return _cache[mode]
    import aws_cdk as cdk
    from aws_cdk.assertions import Template
    from cdk_nag import AwsSolutionsChecks

    from infra.app import build_app, feature_flags

    settings = dict(MODES.get(mode) or VARIANTS[mode])
    if mode in VARIANTS and "models_file" not in settings:
        settings["models_file"] = str(write_catalogue(outdir / "models.yaml", CATALOGUE_50))
    context = {**feature_flags(), "worker_dockerfile": DOCKERFILE, **settings}
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


@pytest.fixture(scope="session")
def ecs50(tmp_path_factory: pytest.TempPathFactory) -> Synth:
    """ECS mode, 50 models, data not retained, SSM access, no dashboard, pinned layer."""
    return synth("ecs-50", tmp_path_factory.mktemp("cdk-ecs-50"))


@pytest.fixture(scope="session")
def sagemaker50(tmp_path_factory: pytest.TempPathFactory) -> Synth:
    """SageMaker mode, 50 models."""
    return synth("sagemaker-50", tmp_path_factory.mktemp("cdk-sagemaker-50"))


#: The engine catalogues (issue 16) the cdk-nag and cfn-lint checks cover besides the modes: ECS
#: with engine sidecars (a public image; a private ECR image with tensor_parallel 8 on
#: p4d.24xlarge) and SageMaker engine endpoints (aws:djl-lmi, aws:huggingface-llm and
#: aws:huggingface-tei through the region mapping of a region-agnostic stack; an own ECR image).
ENGINE_CATALOGUES = ["openai-engine", "openai-engine-sagemaker"]


@pytest.fixture(scope="session", params=["ecs", "sagemaker", "ecs-50", "sagemaker-50"])
def every_synth(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Synth:
    """Both modes with the default catalogue and with 50 models."""
    return synth(request.param, tmp_path_factory.mktemp(f"cdk-{request.param}"))


@pytest.fixture(
    scope="session", params=["ecs", "sagemaker", "ecs-50", "sagemaker-50", *ENGINE_CATALOGUES]
)
def nagged(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Synth:
    """Every synth of :func:`every_synth` and the engine catalogues: the templates cdk-nag's
    AwsSolutions checks (each synthesized once per session, shared with the tests that read it)."""
    return synth(request.param, tmp_path_factory.mktemp(f"cdk-{request.param}"))


@pytest.fixture(scope="session", params=[*sorted(MODES), *ENGINE_CATALOGUES])
def linted(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Synth:
    """Both modes and the engine catalogues: the templates cfn-lint's default rules check."""
    return synth(request.param, tmp_path_factory.mktemp(f"cdk-{request.param}"))
