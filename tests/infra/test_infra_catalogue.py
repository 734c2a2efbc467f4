"""The CDK app reads the model catalogue (``models_file``): per entry its own service with that
entry's instance type, GPUs, scaling bounds and backlog target; CPU entries without a GPU; S3
read grants on exactly the weight prefixes; an invalid catalogue stops synth (issue 13, 2 and 7).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.infra.conftest import DOCKERFILE, ROOT, Synth, synth

CATALOGUE3 = ROOT / "tests/infra/fixtures/catalogue3/models.yaml"
#: The fixture's entries: instance type, GPUs, min/max workers, backlog target.
EXPECTED = {
    "llama-s3": ("g6.2xlarge", 1, 1, 3, 5),
    "encoder-s3": ("g5.xlarge", 1, 0, 4, 10),
    "cpu-echo": ("c7i.large", 0, 0, 2, 20),
}
WEIGHTS = {
    "llama-s3": ("acme-weights", "llama/v1/"),
    "encoder-s3": ("acme-encoders", "minilm/"),
}


@pytest.fixture(scope="module")
def cat3(tmp_path_factory: pytest.TempPathFactory) -> Synth:
    return synth("catalogue3", tmp_path_factory.mktemp("cdk-catalogue3"))


@pytest.fixture(scope="module")
def cat3_sm(tmp_path_factory: pytest.TempPathFactory) -> Synth:
    return synth("catalogue3-sagemaker", tmp_path_factory.mktemp("cdk-catalogue3-sm"))


def _ref(value: Any) -> str:
    """The logical id a ``Ref`` or ``Fn::GetAtt`` points at (followed, never matched)."""
    if "Ref" in value:
        return str(value["Ref"])
    return str(value["Fn::GetAtt"][0])


def _model_of_task(td: dict[str, Any]) -> str:
    return str(td["Properties"]["ContainerDefinitions"][0]["Command"][-1])


def _tasks(s: Synth) -> dict[str, dict[str, Any]]:
    """model id -> its task definition resource."""
    return {_model_of_task(td): td for td in s.resources("AWS::ECS::TaskDefinition").values()}


def test_each_entry_gets_its_own_service_on_its_own_instance_type(cat3: Synth) -> None:
    resources = cat3.template["Resources"]
    tasks = {
        lid: _model_of_task(td) for lid, td in cat3.resources("AWS::ECS::TaskDefinition").items()
    }
    seen = {}
    for svc in cat3.props("AWS::ECS::Service"):
        model = tasks[_ref(svc["TaskDefinition"])]
        cp = resources[_ref(svc["CapacityProviderStrategy"][0]["CapacityProvider"])]
        asg = resources[_ref(cp["Properties"]["AutoScalingGroupProvider"]["AutoScalingGroupArn"])]
        lt = resources[_ref(asg["Properties"]["LaunchTemplate"]["LaunchTemplateId"])]
        seen[model] = lt["Properties"]["LaunchTemplateData"]["InstanceType"]
    assert seen == {m: e[0] for m, e in EXPECTED.items()}


def test_each_entry_has_its_own_gpu_count(cat3: Synth) -> None:
    for model, td in _tasks(cat3).items():
        c = td["Properties"]["ContainerDefinitions"][0]
        gpus = EXPECTED[model][1]
        want = [{"Type": "GPU", "Value": str(gpus)}] if gpus else None
        assert c.get("ResourceRequirements") == want, model


def test_a_cpu_entry_has_no_gpu_reservation_and_runs_on_the_standard_ami(cat3: Synth) -> None:
    c = _tasks(cat3)["cpu-echo"]["Properties"]["ContainerDefinitions"][0]
    assert "ResourceRequirements" not in c
    assert c["MemoryReservation"] <= 2048  # placeable on a 4 GiB c7i.large
    amis = {}
    for lt in cat3.props("AWS::EC2::LaunchTemplate"):
        data = lt["LaunchTemplateData"]
        amis[data["InstanceType"]] = cat3.template["Parameters"][data["ImageId"]["Ref"]]["Default"]
    assert "/gpu/" not in amis["c7i.large"]
    assert "/gpu/" in amis["g6.2xlarge"] and "/gpu/" in amis["g5.xlarge"]


def test_each_entry_scales_within_its_own_bounds_and_backlog_target(cat3: Synth) -> None:
    bounds = sorted(
        (t["MinCapacity"], t["MaxCapacity"])
        for t in cat3.props("AWS::ApplicationAutoScaling::ScalableTarget")
    )
    assert bounds == sorted((e[2], e[3]) for e in EXPECTED.values())
    targets = {}
    for p in cat3.props("AWS::ApplicationAutoScaling::ScalingPolicy"):
        if p["PolicyType"] != "TargetTrackingScaling":
            continue
        spec = p["TargetTrackingScalingPolicyConfiguration"]
        dims = {d["Name"]: d["Value"] for d in spec["CustomizedMetricSpecification"]["Dimensions"]}
        targets[dims["Model"]] = spec["TargetValue"]
    assert targets == {m: e[4] for m, e in EXPECTED.items()}
    services = {
        _model_of_task(cat3.template["Resources"][_ref(s["TaskDefinition"])]): s["DesiredCount"]
        for s in cat3.props("AWS::ECS::Service")
    }
    assert services == {m: e[2] for m, e in EXPECTED.items()}


def _statements(s: Synth, role_lid: str) -> list[dict[str, Any]]:
    out = []
    for p in s.props("AWS::IAM::Policy"):
        if any(_ref(r) == role_lid for r in p.get("Roles", [])):
            out.extend(p["PolicyDocument"]["Statement"])
    return out


def _s3_weight_resources(statements: list[dict[str, Any]]) -> set[str]:
    """The resources of statements naming a weights bucket (rendered), with ListBucket prefixes."""
    found = set()
    for st in statements:
        res = st["Resource"] if isinstance(st["Resource"], list) else [st["Resource"]]
        for r in res:
            text = json.dumps(r)
            if "acme-" in text:
                parts = r["Fn::Join"][1] if isinstance(r, dict) else [r]
                arn = "".join(p if isinstance(p, str) else "<p>" for p in parts)
                cond = st.get("Condition", {}).get("StringLike", {}).get("s3:prefix")
                found.add(f"{st['Action']} {arn} {cond}")
    return found


def test_s3_read_grants_are_scoped_to_each_entrys_weight_prefixes(cat3: Synth) -> None:
    for model, td in _tasks(cat3).items():
        role = _ref(td["Properties"]["TaskRoleArn"])
        got = _s3_weight_resources(_statements(cat3, role))
        if model not in WEIGHTS:
            assert got == set(), model
            continue
        bucket, prefix = WEIGHTS[model]
        assert got == {
            f"s3:GetObject arn:<p>:s3:::{bucket}/{prefix}* None",
            f"s3:ListBucket arn:<p>:s3:::{bucket} ['{prefix}*']",
        }, model


def test_sagemaker_endpoints_take_each_entrys_instance_type_and_scoped_role(
    cat3_sm: Synth,
) -> None:
    resources = cat3_sm.template["Resources"]
    types = {}
    for lid, m in cat3_sm.resources("AWS::SageMaker::Model").items():
        model = m["Properties"]["PrimaryContainer"]["Environment"]["ASYNCINFER_MODELS"]
        role = _ref(m["Properties"]["ExecutionRoleArn"])
        got = _s3_weight_resources(_statements(cat3_sm, role))
        if model in WEIGHTS:
            bucket, prefix = WEIGHTS[model]
            assert f"s3:GetObject arn:<p>:s3:::{bucket}/{prefix}* None" in got
            assert len(got) == 2, got  # nothing of the other entry's weights
        else:
            assert got == set()
        for cfg in cat3_sm.props("AWS::SageMaker::EndpointConfig"):
            variant = cfg["ProductionVariants"][0]
            if _ref(variant["ModelName"]) == lid:
                types[model] = variant["InstanceType"]
    assert types == {m: f"ml.{e[0]}" for m, e in EXPECTED.items()}
    assert resources  # the template was read


def test_lambdas_and_workers_point_at_the_catalogue_in_their_asset_and_image(cat3: Synth) -> None:
    for f in cat3.props("AWS::Lambda::Function"):
        if f.get("Handler") != "app.handler":
            continue
        env = f["Environment"]["Variables"]
        assert env["ASYNCINFER_MODELS_FILE"] == "/var/task/catalogue/models.yaml"
    for td in _tasks(cat3).values():
        c = td["Properties"]["ContainerDefinitions"][0]
        env = {e["Name"]: e["Value"] for e in c["Environment"]}
        assert env["ASYNCINFER_MODELS_FILE"] == (
            "/opt/asyncinfer/tests/infra/fixtures/catalogue3/models.yaml"
        )
    staged = list(cat3.outdir.glob("asset.*/catalogue/models.yaml"))
    assert staged and all(p.read_text() == CATALOGUE3.read_text() for p in staged)


def test_the_default_catalogue_is_the_image_copy(ecs: Synth) -> None:
    for td in ecs.props("AWS::ECS::TaskDefinition"):
        env = {e["Name"]: e["Value"] for e in td["ContainerDefinitions"][0]["Environment"]}
        assert env["ASYNCINFER_MODELS_FILE"] == "/opt/asyncinfer/models.yaml"


def test_an_invalid_catalogue_fails_synth_naming_every_problem(tmp_path: Path) -> None:
    import aws_cdk as cdk

    from asyncinfer.core.errors import CatalogueError
    from infra.app import build_app, feature_flags

    bad = tmp_path / "models.yaml"
    bad.write_text(
        "models:\n"
        "  - id: Bad_Id\n    kind: echo\n"
        "  - id: llm\n    kind: causal-lm\n"
        "  - id: emb\n    kind: embeddings\n    source: s3://x\n"
        "    compute: {gpus: -1, min_workers: 3, max_workers: 1}\n"
    )
    app = cdk.App(
        context={**feature_flags(), "worker_dockerfile": DOCKERFILE, "models_file": str(bad)}
    )
    with pytest.raises(CatalogueError) as info:
        build_app(app)
    text = str(info.value)
    for fragment in (
        "models[0].id",
        "models[1].source: required for kind causal-lm",
        "models[2].source",
        "models[2].compute.gpus",
        "models[2].compute.min_workers",
    ):
        assert fragment in text, fragment
    assert not app.node.find_all()[1:]  # no stack, no resource was created


def test_an_invalid_catalogue_makes_cdk_synth_exit_1_with_the_list(tmp_path: Path) -> None:
    import os
    import subprocess
    import sys

    bad = tmp_path / "models.yaml"
    bad.write_text("models:\n  - id: a\n    kind: nope\n  - id: a\n    kind: echo\n")
    ctx = {"models_file": str(bad), "worker_dockerfile": DOCKERFILE}
    env = {
        **os.environ,
        "CDK_CONTEXT_JSON": json.dumps(ctx),
        "CDK_OUTDIR": str(tmp_path / "out"),
        "PYTHONPATH": str(ROOT / "src"),
    }
    r = subprocess.run(
        [sys.executable, str(ROOT / "infra" / "app.py")],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 1
    assert "models[0].kind: unknown kind 'nope'" in r.stderr
    assert "models[1].id: duplicate id 'a'" in r.stderr


def test_entries_on_two_backends_without_a_compute_setting_are_refused(tmp_path: Path) -> None:
    from infra.config import DeployConfigError, load_config

    two = tmp_path / "models.yaml"
    two.write_text(
        "models:\n"
        "  - {id: a, kind: echo, compute: {backend: ecs, gpus: 0, instance_type: c7i.large}}\n"
        "  - {id: b, kind: echo, compute: {backend: sagemaker, instance_type: g5.xlarge}}\n"
    )
    base = {"models_file": str(two), "worker_dockerfile": DOCKERFILE}
    with pytest.raises(DeployConfigError, match=r"ecs: a; sagemaker: b"):
        load_config(base)
    assert load_config({**base, "compute": "sagemaker"}).compute == "sagemaker"
    assert load_config({**base, "models": "b"}).compute == "sagemaker"


def test_a_gpu_entry_on_a_cpu_instance_type_is_a_conflict_naming_it(tmp_path: Path) -> None:
    from infra.config import DeployConfigError, load_config

    f = tmp_path / "models.yaml"
    f.write_text("models:\n  - {id: a, kind: echo, compute: {instance_type: c7i.large}}\n")
    with pytest.raises(DeployConfigError, match=r"a: instance_type 'c7i.large' has no NVIDIA"):
        load_config({"models_file": str(f), "worker_dockerfile": DOCKERFILE})


def test_the_three_entry_stack_fits_the_environment_limits(cat3: Synth) -> None:
    from tests.infra.test_infra_limits import LAMBDA_ENV_MAX, lambda_environments

    for name, env in lambda_environments(cat3).items():
        assert len(json.dumps(env, separators=(",", ":")).encode()) <= LAMBDA_ENV_MAX, name
    assert cat3.validation_error is None, cat3.validation_error
