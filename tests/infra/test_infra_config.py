"""Context settings: defaults, conversions, and every conflict reported in one error."""

from __future__ import annotations

from typing import Any

import pytest

from infra.config import DEFAULTS, REPO_ROOT, DeployConfigError
from infra.config import load_config as _load

#: While container/Dockerfile is not in the repository, validate against the tests' stand-in.
_DOCKERFILE = (
    {}
    if (REPO_ROOT / "container" / "Dockerfile").is_file()
    else {"worker_dockerfile": "tests/infra/fixtures/Dockerfile"}
)


def load_config(context: dict[str, Any]) -> Any:
    return _load({**_DOCKERFILE, **context})


def test_defaults_are_valid_and_deploy_every_model() -> None:
    from asyncinfer.models.registry import MODELS

    cfg = load_config({})
    assert cfg.compute == "ecs"
    assert cfg.models == tuple(MODELS)
    assert cfg.min_workers == 0
    assert cfg.max_receive_count == 3
    assert cfg.drain_seconds < cfg.stop_timeout <= 120


def test_cli_strings_are_converted() -> None:
    cfg = load_config(
        {
            "compute": "SageMaker",
            "max_workers": "4",
            "gpu": "false",
            "models": "echo, all-minilm-l6-v2",
            "asyncinfer:retain_data": "no",
            "throttle_rate": "12.5",
        }
    )
    assert cfg.compute == "sagemaker"
    assert cfg.max_workers == 4
    assert cfg.gpu is False
    assert cfg.models == ("echo", "all-minilm-l6-v2")
    assert cfg.retain_data is False
    assert cfg.throttle_rate == 12.5
    assert cfg.sagemaker_instance_type == "ml.g5.xlarge"


def test_every_conflict_is_reported_in_one_error() -> None:
    with pytest.raises(DeployConfigError) as info:
        load_config(
            {
                "compute": "lambda",
                "models": "echo,gpt-17",
                "min_workers": 3,
                "max_workers": 2,
                "visibility_timeout": 30,
                "heartbeat_seconds": 20,
                "max_receive_count": 0,
                "quota_period": "YEAR",
                "instance_type": "t3.large",
                "drain_seconds": 130,
                "log_retention_days": 31,
                "asyncinfer:typo_setting": 1,
                "min_workers_": 1,
            }
        )
    text = str(info.value)
    expected = [
        "compute='lambda'",
        "unknown model id(s) ['gpt-17']",
        "max_workers=2 is below min_workers=3",
        "shorter than three heartbeat intervals",
        "max_receive_count=0",
        "quota_period='YEAR'",
        "instance_type='t3.large' has no NVIDIA GPU",
        "drain_seconds=130",
        "log_retention_days=31",
        "unknown setting 'asyncinfer:typo_setting'",
    ]
    for fragment in expected:
        assert fragment in text, fragment
    assert len(info.value.problems) >= len(expected)


def test_sqs_triggered_lambda_needs_six_times_its_timeout() -> None:
    with pytest.raises(DeployConfigError, match="less than six times bridge_timeout=30"):
        load_config({"compute": "sagemaker", "visibility_timeout": 120, "bridge_timeout": 30})
    # the bridge exists only in sagemaker mode
    load_config({"compute": "ecs", "visibility_timeout": 120, "bridge_timeout": 30})


def test_malformed_values_are_reported_with_the_rest() -> None:
    with pytest.raises(DeployConfigError) as info:
        load_config({"max_workers": "many", "gpu": "perhaps", "models": "nope"})
    assert len(info.value.problems) == 3


def test_cpu_only_deployment_allows_any_instance_type() -> None:
    assert load_config({"gpu": "false", "instance_type": "c7i.2xlarge"}).gpu is False


def test_missing_dockerfile_is_a_conflict() -> None:
    with pytest.raises(DeployConfigError, match="worker_dockerfile"):
        load_config({"worker_dockerfile": "container/NoSuchDockerfile"})


def test_every_default_is_documented() -> None:
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[2] / "docs" / "deploy.md").read_text()
    for key in DEFAULTS:
        assert f"`{key}`" in doc, key


def test_invalid_context_fails_the_app_before_any_resource() -> None:
    import aws_cdk as cdk

    from infra.app import build_app

    app = cdk.App(context={"compute": "k8s", "max_workers": "0", "models": "x", **_DOCKERFILE})
    with pytest.raises(DeployConfigError) as info:
        build_app(app)
    assert len(info.value.problems) >= 3
