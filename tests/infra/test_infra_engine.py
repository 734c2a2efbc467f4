"""CDK: an ``openai-server`` entry with ``engine.image`` runs its engine as a second container
of the worker's ECS task: the GPUs on the engine, ``tensor_parallel`` passed, shared memory for
multi-GPU, a health check with a long start period, the worker depending on the engine being
healthy, and the weights copied from the entry's S3 source first (issue 16)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from infra.components.engine import HEALTH_START_PERIOD_SECONDS, engine_command
from tests.infra.conftest import Synth, synth


@pytest.fixture(scope="module")
def eng(tmp_path_factory: pytest.TempPathFactory) -> Synth:
    return synth("openai-engine", tmp_path_factory.mktemp("cdk-openai-engine"))


def containers(s: Synth, model: str) -> dict[str, dict[str, Any]]:
    """Container name -> definition, of the task whose worker serves ``model``."""
    for td in s.resources("AWS::ECS::TaskDefinition").values():
        defs = td["Properties"]["ContainerDefinitions"]
        if defs[0]["Command"][-1] == model:
            return {c["Name"]: c for c in defs}
    raise AssertionError(f"no task for {model}")


def test_the_task_has_a_worker_and_an_engine_container(eng: Synth) -> None:
    assert set(containers(eng, "llama-70b")) == {"worker", "engine"}
    assert set(containers(eng, "llama-8b")) == {"worker", "engine", "weights"}
    engine = containers(eng, "llama-8b")["engine"]
    assert engine["Image"] == "vllm/vllm-openai:v0.8.5" and engine["Essential"] is True


def test_the_gpus_are_reserved_for_the_engine_not_the_worker(eng: Synth) -> None:
    for model, gpus in (("llama-8b", "1"), ("llama-70b", "8")):
        c = containers(eng, model)
        assert c["engine"]["ResourceRequirements"] == [{"Type": "GPU", "Value": gpus}]
        assert "ResourceRequirements" not in c["worker"]


def test_tensor_parallel_is_passed_and_multi_gpu_gets_shared_memory(eng: Synth) -> None:
    big = containers(eng, "llama-70b")["engine"]
    assert big["Command"][-2:] == ["--tensor-parallel-size", "8"]
    small = containers(eng, "llama-8b")["engine"]
    assert "--tensor-parallel-size" not in small["Command"]
    assert small["Command"][:2] == ["--model", "/weights"]
    shm = big["LinuxParameters"]["SharedMemorySize"]
    assert shm > small["LinuxParameters"]["SharedMemorySize"] and shm >= 8 * 8192
    # A flag the args already set is not added again (SGLang's --tp, TGI's --num-shard).
    assert engine_command(["--tp", "4"], 4) == ["--tp", "4"]
    assert engine_command(["--num-shard=2"], 2) == ["--num-shard=2"]


def test_the_engine_health_check_has_a_long_start_period(eng: Synth) -> None:
    hc = containers(eng, "llama-70b")["engine"]["HealthCheck"]
    assert "/health" in " ".join(hc["Command"])
    assert hc["StartPeriod"] == HEALTH_START_PERIOD_SECONDS == 300  # ECS's most
    assert hc["Interval"] * hc["Retries"] >= 300  # and as long again after it


def test_the_worker_starts_once_the_engine_is_healthy_and_finds_it(eng: Synth) -> None:
    c = containers(eng, "llama-70b")
    assert c["worker"]["DependsOn"] == [{"ContainerName": "engine", "Condition": "HEALTHY"}]
    assert c["worker"]["Links"] == ["engine:engine"]
    env = {e["Name"]: e["Value"] for e in c["worker"]["Environment"]}
    assert env["ASYNCINFER_ENGINE_URL"] == "http://engine:8000"


def test_s3_weights_are_copied_to_the_instance_disk_before_the_engine(eng: Synth) -> None:
    c = containers(eng, "llama-8b")
    weights = c["weights"]
    assert weights["Essential"] is False
    assert weights["Command"][:4] == [
        "s3",
        "sync",
        "s3://acme-weights/llama-3.1-8b-instruct/",
        "/weights",
    ]
    assert c["engine"]["DependsOn"] == [{"ContainerName": "weights", "Condition": "SUCCESS"}]
    assert c["engine"]["MountPoints"][0]["ContainerPath"] == "/weights"
    (td,) = [
        t
        for t in eng.resources("AWS::ECS::TaskDefinition").values()
        if t["Properties"]["ContainerDefinitions"][0]["Command"][-1] == "llama-8b"
    ]
    # The engine's weights volume: a folder of the worker's instance weight cache (issue 13: one
    # weights cache per instance), apart from the worker's own downloads (<cache>/s3/).
    (vol,) = [v for v in td["Properties"]["Volumes"] if v["Name"] == "weights"]
    assert vol["Host"]["SourcePath"] == "/var/cache/asyncinfer/engine/llama-8b"
    (cache,) = [v for v in td["Properties"]["Volumes"] if v["Name"] == "weights-cache"]
    assert vol["Host"]["SourcePath"].startswith(cache["Host"]["SourcePath"] + "/")


def test_an_engine_image_on_sagemaker_is_refused_naming_the_model() -> None:
    from asyncinfer.models.catalogue import parse_catalogue
    from infra.config import GPU_FAMILIES
    from infra.model_compute import problems, resolve

    entry = {
        "id": "llama-8b",
        "kind": "openai-server",
        "engine": {"image": "vllm/vllm-openai:v0.8.5", "model": "m"},
        "compute": {"backend": "sagemaker", "instance_type": "g6e.xlarge"},
    }
    cat = parse_catalogue({"models": [entry]})
    values = {"compute": "ecs", "instance_type": "g5.xlarge", "gpu": True, "min_workers": 0}
    values |= {"max_workers": 1, "backlog_per_worker": 5.0}
    computes = resolve(cat, ["llama-8b"], values, set())
    (problem,) = problems(computes, GPU_FAMILIES)
    assert problem.startswith("llama-8b: an openai-server engine.image") and "ecs" in problem


def execution_policy(s: Synth, model: str) -> list[dict[str, Any]]:
    """The statements of the execution role of the task whose worker serves ``model``."""
    for td in s.resources("AWS::ECS::TaskDefinition").values():
        p = td["Properties"]
        if p["ContainerDefinitions"][0]["Command"][-1] == model:
            role = p["ExecutionRoleArn"]["Fn::GetAtt"][0]
            return [
                st
                for pol in s.props("AWS::IAM::Policy")
                if {"Ref": role} in pol["Roles"]
                for st in pol["PolicyDocument"]["Statement"]
            ]
    raise AssertionError(f"no task for {model}")


def test_a_private_ecr_engine_image_may_be_pulled_by_the_task_execution_role(eng: Synth) -> None:
    repo = "arn:aws:ecr:us-east-1:123456789012:repository/vllm-openai"
    pulls = [
        st
        for st in execution_policy(eng, "llama-70b")
        if "ecr:BatchGetImage" in st["Action"]
        and repo in (st["Resource"] if isinstance(st["Resource"], list) else [st["Resource"]])
    ]
    assert pulls and {"ecr:GetDownloadUrlForLayer"} <= set(pulls[0]["Action"])
    # The image is the entry's URI (CDK writes the domain as AWS::URLSuffix).
    sep, parts = containers(eng, "llama-70b")["engine"]["Image"]["Fn::Join"]
    image = sep.join("amazonaws.com" if p == {"Ref": "AWS::URLSuffix"} else p for p in parts)
    assert image == "123456789012.dkr.ecr.us-east-1.amazonaws.com/vllm-openai:v0.8.5"
    actions = [st["Action"] for st in execution_policy(eng, "llama-70b")]
    assert any("ecr:GetAuthorizationToken" in a for a in actions)
    # A public image (Docker Hub) needs no grant: nothing on that repository for llama-8b.
    assert repo not in json.dumps(execution_policy(eng, "llama-8b"))


def test_ecr_image_uris_and_their_repository_arns() -> None:
    from infra.components.ecr_images import is_ecr_image, repository_arn, split_image

    uri = "123456789012.dkr.ecr.cn-north-1.amazonaws.com.cn/team/engine@sha256:" + "a" * 64
    assert is_ecr_image(uri)
    assert split_image(uri) == ("team/engine", "sha256:" + "a" * 64)
    assert split_image("123456789012.dkr.ecr.us-east-1.amazonaws.com/e:1.2") == ("e", "1.2")
    assert repository_arn(uri) == "arn:aws-cn:ecr:cn-north-1:123456789012:repository/team/engine"
    assert not is_ecr_image("vllm/vllm-openai:v0.8.5")
    assert not is_ecr_image("public.ecr.aws/aws-cli/aws-cli:2.22.35")
    with pytest.raises(ValueError, match="not an Amazon ECR image URI"):
        repository_arn("vllm/vllm-openai:v0.8.5")
