"""Warm pools (issue 13, item 5): an entry's ``compute.warm_pool`` gives its ECS capacity group
an EC2 Auto Scaling warm pool of that many stopped instances, whose user data lets the ECS agent
wait out the warm-up and pre-pulls the worker image; every task mounts the instance's weight
cache."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.infra.conftest import DOCKERFILE, Synth, synth


@pytest.fixture(scope="module")
def cat3(tmp_path_factory: pytest.TempPathFactory) -> Synth:
    return synth("catalogue3", tmp_path_factory.mktemp("cdk-catalogue3"))


def _ref(value: Any) -> str:
    return str(value["Ref"] if "Ref" in value else value["Fn::GetAtt"][0])


def _user_data(s: Synth, asg_id: str) -> str:
    """The launch template user data of one Auto Scaling group, as the JSON of its Fn::Join."""
    resources = s.template["Resources"]
    asg = resources[asg_id]
    lt = resources[_ref(asg["Properties"]["LaunchTemplate"]["LaunchTemplateId"])]
    return json.dumps(lt["Properties"]["LaunchTemplateData"]["UserData"])


def _asg_of_instance_type(s: Synth, itype: str) -> str:
    resources = s.template["Resources"]
    for lid, asg in s.resources("AWS::AutoScaling::AutoScalingGroup").items():
        lt = resources[_ref(asg["Properties"]["LaunchTemplate"]["LaunchTemplateId"])]
        if lt["Properties"]["LaunchTemplateData"]["InstanceType"] == itype:
            return lid
    raise AssertionError(f"no group on {itype}")


def test_the_entry_with_a_warm_pool_gets_one_of_its_size_of_stopped_instances(cat3: Synth) -> None:
    pools = cat3.props("AWS::AutoScaling::WarmPool")
    assert len(pools) == 1
    (pool,) = pools
    assert _ref(pool["AutoScalingGroupName"]) == _asg_of_instance_type(cat3, "g6.2xlarge")
    assert pool["MinSize"] == 2
    assert pool["MaxGroupPreparedCapacity"] == 2
    assert pool["PoolState"] == "Stopped"


def test_a_warm_pool_never_reuses_instances_on_scale_in(cat3: Synth) -> None:
    (pool,) = cat3.props("AWS::AutoScaling::WarmPool")
    assert pool.get("InstanceReusePolicy", {}).get("ReuseOnScaleIn", False) is False


def test_the_pooled_groups_agent_waits_for_warm_up_and_prefers_the_cached_image(
    cat3: Synth,
) -> None:
    ud = _user_data(cat3, _asg_of_instance_type(cat3, "g6.2xlarge"))
    assert "ECS_WARM_POOLS_CHECK=true" in ud
    assert "ECS_IMAGE_PULL_BEHAVIOR=prefer-cached" in ud
    assert "docker pull" in ud


def test_groups_without_a_pool_keep_the_default_agent_settings(cat3: Synth) -> None:
    for itype in ("g5.xlarge", "c7i.large"):
        ud = _user_data(cat3, _asg_of_instance_type(cat3, itype))
        assert "ECS_WARM_POOLS_CHECK" not in ud
        assert "docker pull" not in ud


def test_every_group_makes_the_weight_cache_for_the_workers_user(cat3: Synth) -> None:
    for lid in cat3.resources("AWS::AutoScaling::AutoScalingGroup"):
        ud = _user_data(cat3, lid)
        assert "mkdir -p /var/cache/asyncinfer" in ud
        assert "chown 1000:1000 /var/cache/asyncinfer" in ud


def test_every_worker_task_mounts_the_instances_weight_cache(cat3: Synth) -> None:
    tasks = cat3.props("AWS::ECS::TaskDefinition")
    assert len(tasks) == 3
    for td in tasks:
        volumes = {v["Name"]: v for v in td["Volumes"]}
        assert volumes["weights-cache"]["Host"]["SourcePath"] == "/var/cache/asyncinfer"
        (worker,) = td["ContainerDefinitions"]
        mount = {"ContainerPath": "/var/cache/asyncinfer", "ReadOnly": False}
        assert worker["MountPoints"] == [{**mount, "SourceVolume": "weights-cache"}]


def test_a_warm_pool_on_a_sagemaker_entry_is_refused_naming_the_field(tmp_path: Path) -> None:
    from asyncinfer.core.errors import CatalogueError
    from asyncinfer.models.catalogue import load_catalogue

    f = tmp_path / "models.yaml"
    f.write_text("models:\n  - {id: a, kind: echo, compute: {backend: sagemaker, warm_pool: 1}}\n")
    with pytest.raises(
        CatalogueError, match=r"models\[0\]\.compute\.warm_pool: only for backend ecs"
    ):
        load_catalogue(f)


def test_a_sagemaker_override_of_an_ecs_entry_leaves_its_pool_out(tmp_path: Path) -> None:
    from infra.config import load_config

    f = tmp_path / "models.yaml"
    f.write_text(
        "models:\n  - {id: a, kind: echo,"
        " compute: {gpus: 0, instance_type: c7i.large, warm_pool: 1}}\n"
    )
    ecs = load_config({"models_file": str(f), "worker_dockerfile": DOCKERFILE})
    sm = load_config(
        {"models_file": str(f), "worker_dockerfile": DOCKERFILE, "compute": "sagemaker"}
    )
    assert ecs.model_compute["a"].warm_pool == 1
    assert sm.model_compute["a"].warm_pool == 0


def test_the_catalogue_refuses_a_negative_warm_pool_naming_the_field(tmp_path: Path) -> None:
    from asyncinfer.core.errors import CatalogueError
    from asyncinfer.models.catalogue import load_catalogue

    f = tmp_path / "models.yaml"
    f.write_text("models:\n  - {id: a, kind: echo, compute: {warm_pool: -1}}\n")
    with pytest.raises(CatalogueError, match=r"models\[0\]\.compute\.warm_pool"):
        load_catalogue(f)
