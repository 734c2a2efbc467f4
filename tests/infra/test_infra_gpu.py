"""The GPU reaches the worker process (issue 13 item 1): an entry's ``gpus: N`` is the ECS
container's GPU reservation on a GPU-AMI instance whose agent has GPU support on (the nvidia
runtime); a SageMaker entry with GPUs runs on a GPU instance type; GPU counts an instance type
cannot hold are refused; the image has a CUDA build of torch; every ECS task shares the
instance's weights cache."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from tests.infra.conftest import DOCKERFILE, ROOT, VARIANTS, Synth, synth

GPUS_FILE = ROOT / "tests/infra/fixtures/gpus/models.yaml"
VARIANTS.setdefault("gpus", {"models_file": str(GPUS_FILE)})
VARIANTS.setdefault("gpus-sagemaker", {"compute": "sagemaker", "models_file": str(GPUS_FILE)})
#: model id -> (instance type, gpus) of the fixture.
EXPECTED = {
    "four-gpus": ("g6.12xlarge", 4),
    "one-gpu": ("g5.xlarge", 1),
    "cpu-only": ("c7i.large", 0),
}


@pytest.fixture(scope="module")
def gpus(tmp_path_factory: pytest.TempPathFactory) -> Synth:
    return synth("gpus", tmp_path_factory.mktemp("cdk-gpus"))


@pytest.fixture(scope="module")
def gpus_sm(tmp_path_factory: pytest.TempPathFactory) -> Synth:
    return synth("gpus-sagemaker", tmp_path_factory.mktemp("cdk-gpus-sm"))


def _ref(value: Any) -> str:
    return str(value["Ref"]) if "Ref" in value else str(value["Fn::GetAtt"][0])


def _tasks(s: Synth) -> dict[str, dict[str, Any]]:
    """model id -> task definition properties."""
    out = {}
    for td in s.props("AWS::ECS::TaskDefinition"):
        out[str(td["ContainerDefinitions"][0]["Command"][-1])] = td
    return out


def _user_data(lt: dict[str, Any]) -> str:
    """A launch template's user data with its references left out."""
    parts = lt["LaunchTemplateData"]["UserData"]["Fn::Base64"]["Fn::Join"][1]
    return "".join(p if isinstance(p, str) else "<ref>" for p in parts)


def _launch_templates_by_model(s: Synth) -> dict[str, dict[str, Any]]:
    resources = s.template["Resources"]
    tasks = {
        lid: str(td["Properties"]["ContainerDefinitions"][0]["Command"][-1])
        for lid, td in s.resources("AWS::ECS::TaskDefinition").items()
    }
    out = {}
    for svc in s.props("AWS::ECS::Service"):
        cp = resources[_ref(svc["CapacityProviderStrategy"][0]["CapacityProvider"])]
        asg = resources[_ref(cp["Properties"]["AutoScalingGroupProvider"]["AutoScalingGroupArn"])]
        lt = resources[_ref(asg["Properties"]["LaunchTemplate"]["LaunchTemplateId"])]
        out[tasks[_ref(svc["TaskDefinition"])]] = lt["Properties"]
    return out


def test_an_entrys_gpus_are_its_containers_gpu_reservation(gpus: Synth) -> None:
    got = {
        m: td["ContainerDefinitions"][0].get("ResourceRequirements")
        for m, td in _tasks(gpus).items()
    }
    assert got == {
        "four-gpus": [{"Type": "GPU", "Value": "4"}],
        "one-gpu": [{"Type": "GPU", "Value": "1"}],
        "cpu-only": None,
    }


def test_gpu_instances_run_the_gpu_ami_with_the_agents_gpu_support_on(gpus: Synth) -> None:
    for model, lt in _launch_templates_by_model(gpus).items():
        data = lt["LaunchTemplateData"]
        assert data["InstanceType"] == EXPECTED[model][0]
        ami = gpus.template["Parameters"][data["ImageId"]["Ref"]]["Default"]
        script = _user_data(lt)
        if EXPECTED[model][1]:
            assert "/gpu/" in ami, model
            assert "echo ECS_ENABLE_GPU_SUPPORT=true >> /etc/ecs/ecs.config" in script, model
        else:
            assert "/gpu/" not in ami
            assert "ECS_ENABLE_GPU_SUPPORT" not in script


def test_every_task_shares_the_instances_weights_cache(gpus: Synth) -> None:
    for model, td in _tasks(gpus).items():
        [volume] = [v for v in td["Volumes"] if v["Name"] == "weights-cache"]
        assert volume["Host"] == {"SourcePath": "/var/cache/asyncinfer"}, model
        c = td["ContainerDefinitions"][0]
        assert {
            "ContainerPath": "/var/cache/asyncinfer",
            "SourceVolume": "weights-cache",
            "ReadOnly": False,
        } in c["MountPoints"], model
        env = {e["Name"]: e["Value"] for e in c["Environment"]}
        assert env["ASYNCINFER_WEIGHTS_CACHE"] == "/var/cache/asyncinfer"
    for lt in _launch_templates_by_model(gpus).values():
        script = _user_data(lt)
        # Created and owned by the image's worker user (uid 1000) before the agent starts tasks.
        assert "mkdir -p /var/cache/asyncinfer\nchown 1000:1000 /var/cache/asyncinfer" in script
    assert "useradd --uid 1000" in (ROOT / "container" / "Dockerfile").read_text()


def test_sagemaker_entries_with_gpus_run_on_gpu_instance_types(gpus_sm: Synth) -> None:
    from infra.config import GPU_FAMILIES

    by_model = {}
    models = {
        lid: m["Properties"]["PrimaryContainer"]["Environment"]["ASYNCINFER_MODELS"]
        for lid, m in gpus_sm.resources("AWS::SageMaker::Model").items()
    }
    for cfg in gpus_sm.props("AWS::SageMaker::EndpointConfig"):
        variant = cfg["ProductionVariants"][0]
        by_model[models[_ref(variant["ModelName"])]] = variant["InstanceType"]
    assert by_model == {m: f"ml.{e[0]}" for m, e in EXPECTED.items()}
    for model, itype in by_model.items():
        family = itype.removeprefix("ml.").split(".")[0]
        assert (family in GPU_FAMILIES) == bool(EXPECTED[model][1]), model


@pytest.mark.parametrize("backend", ["ecs", "sagemaker"])
def test_gpus_an_instance_type_cannot_hold_are_refused(tmp_path: Path, backend: str) -> None:
    from infra.config import DeployConfigError, load_config

    f = tmp_path / "models.yaml"
    f.write_text(
        "models:\n"
        f"  - {{id: a, kind: echo, compute: {{backend: {backend}, instance_type: g6.xlarge, "
        "gpus: 2}}\n"
        f"  - {{id: b, kind: echo, compute: {{backend: {backend}, instance_type: c7i.large, "
        "gpus: 1}}\n"
        f"  - {{id: c, kind: echo, compute: {{backend: {backend}, instance_type: g6.48xlarge, "
        "gpus: 8}}\n"
    )
    with pytest.raises(DeployConfigError) as info:
        load_config({"models_file": str(f), "worker_dockerfile": DOCKERFILE})
    text = str(info.value)
    assert "a: gpus=2 but instance_type 'g6.xlarge' has 1 GPU;" in text
    assert "b: instance_type 'c7i.large' has no NVIDIA GPU" in text
    assert "c:" not in text


def test_instance_gpu_table() -> None:
    from infra.model_compute import instance_gpus

    assert [
        instance_gpus(t) for t in ("g6.xlarge", "g5.12xlarge", "p4d.24xlarge", "c7i.large")
    ] == [1, 4, 8, None]


def test_the_image_installs_a_cuda_build_of_torch() -> None:
    text = (ROOT / "container" / "Dockerfile").read_text()
    pins = (ROOT / "container" / "constraints.txt").read_text()
    # PyPI's torch for linux/x86_64 is the CUDA build; the image is built for linux/amd64
    # (infra/stack.py) from PyPI, with no CPU wheel index and no +cpu pin.
    assert re.search(r"^torch==\d+\.\d+\.\d+$", pins, re.M), "torch pin must be a plain version"
    assert "+cpu" not in pins and "whl/cpu" not in text and "index-url" not in text
    assert "Platform.LINUX_AMD64" in (ROOT / "infra" / "stack.py").read_text()
    # ... and the build fails if it got a CPU build anyway.
    [check] = [
        ln for ln in text.splitlines() if "torch.version.cuda" in ln and ln.startswith("RUN")
    ]
    assert check.startswith("RUN python -c") and "sys.exit(" in check
    code = check.split('"')[1]
    import subprocess
    import sys

    here = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    import torch

    assert (here.returncode == 0) == bool(torch.version.cuda), here.stderr
    if not torch.version.cuda:
        assert "is a CPU build" in here.stderr
    # The nvidia runtime gives the container the compute (CUDA) driver libraries.
    assert re.search(r"NVIDIA_DRIVER_CAPABILITIES=compute,utility", text)


@pytest.mark.parametrize(
    "source", ["s3://acme-w/llama/v1/", "s3://acme-w/llama/v1", "s3://acme-w/", "s3://acme-w"]
)
def test_the_downloader_lists_exactly_the_prefix_the_role_may_read(source: str) -> None:
    """The worker's ListObjectsV2 prefix is the one the CDK app grants (an ``s3:prefix``
    condition of ``PREFIX*``), so a folder never fails with AccessDenied nor reads a sibling."""
    from asyncinfer.models.catalogue import ModelEntry
    from asyncinfer.models.weights import parse_s3
    from infra.model_compute import weight_prefixes

    entry = ModelEntry(id="m", kind="embeddings", source=source)
    assert weight_prefixes(entry) == (parse_s3(source),)
