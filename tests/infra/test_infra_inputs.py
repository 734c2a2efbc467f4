"""Input locations an operator allows (context ``input_locations``): the workers may read exactly
those prefixes, they learn them from the environment, and cdk-nag stays clean."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.infra.conftest import DOCKERFILE

LOCATIONS = "shared-data/public,whole-bucket"


def _synth(mode: str, outdir: Path) -> tuple[dict[str, Any], str | None]:
    import aws_cdk as cdk
    from cdk_nag import AwsSolutionsChecks

    from infra.app import build_app, feature_flags

    context = {
        **feature_flags(),
        "worker_dockerfile": DOCKERFILE,
        "compute": mode,
        "input_locations": LOCATIONS,
    }
    app = cdk.App(context=context, outdir=str(outdir))
    _, stack = build_app(app)
    cdk.Validations.of(app).add_plugins(AwsSolutionsChecks(app))
    error = None
    try:
        app.synth()
    except Exception as exc:
        error = str(exc)
    template = json.loads((outdir / f"{stack.stack_name}.template.json").read_text())
    return template, error


@pytest.fixture(scope="module", params=["ecs", "sagemaker"])
def synthed(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> tuple[str, dict[str, Any], str | None]:
    template, error = _synth(request.param, tmp_path_factory.mktemp(f"cdk-in-{request.param}"))
    return request.param, template, error


def _get_object_resources(template: dict[str, Any]) -> list[str]:
    out = []
    for res in template["Resources"].values():
        if res["Type"] != "AWS::IAM::Policy":
            continue
        for st in res["Properties"]["PolicyDocument"]["Statement"]:
            if st.get("Action") == "s3:GetObject":
                resources = st["Resource"] if isinstance(st["Resource"], list) else [st["Resource"]]
                out += [json.dumps(r) for r in resources]
    return out


def test_readers_may_get_objects_under_each_location_only(
    synthed: tuple[str, dict[str, Any], str | None],
) -> None:
    _, template, _ = synthed
    granted = _get_object_resources(template)
    assert any(":s3:::shared-data/public/*" in r for r in granted)
    assert any(":s3:::whole-bucket/*" in r for r in granted)
    assert not any(":s3:::shared-data/*" in r for r in granted)


def test_locations_reach_the_api_and_workers(
    synthed: tuple[str, dict[str, Any], str | None],
) -> None:
    mode, template, _ = synthed
    fns = [
        r["Properties"].get("Environment", {}).get("Variables", {})
        for r in template["Resources"].values()
        if r["Type"] == "AWS::Lambda::Function"
    ]
    assert any(v.get("ASYNCINFER_INPUT_LOCATIONS") == LOCATIONS for v in fns)
    if mode == "ecs":
        envs = [
            {e["Name"]: e.get("Value") for e in c.get("Environment", [])}
            for r in template["Resources"].values()
            if r["Type"] == "AWS::ECS::TaskDefinition"
            for c in r["Properties"]["ContainerDefinitions"]
        ]
        assert envs and all(e.get("ASYNCINFER_INPUT_LOCATIONS") == LOCATIONS for e in envs)


def test_cdk_nag_stays_clean(synthed: tuple[str, dict[str, Any], str | None]) -> None:
    _, _, error = synthed
    assert error is None, error


def test_bad_location_is_a_config_error() -> None:
    from infra.config import DeployConfigError, load_config

    with pytest.raises(DeployConfigError, match="input_locations"):
        load_config({"input_locations": "Not_A_Bucket/x"})
    assert load_config({"input_locations": " a-bkt/p/ ,a-bkt/p"}).input_locations == ("a-bkt/p",)
