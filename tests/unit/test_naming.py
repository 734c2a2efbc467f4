"""The naming rule of per-model resources (asyncinfer.core.naming) and the settings derived from it;
the job metrics' one definition (asyncinfer.core.job_metrics)."""

from __future__ import annotations

import json

import boto3
import pytest
from moto import mock_aws

from asyncinfer.core import job_metrics, naming
from asyncinfer.core.errors import ConfigError
from asyncinfer.core.settings import Settings
from asyncinfer.scaling.backlog import BacklogConfig, measure

BASE = "https://sqs.us-east-1.amazonaws.com/123456789012/"


def _env(**extra: str) -> dict[str, str]:
    return {
        "ASYNCINFER_RESOURCE_PREFIX": "asyncinfer-ecs-",
        "ASYNCINFER_QUEUE_URL_BASE": BASE,
        "ASYNCINFER_MODELS": "echo,all-minilm-l6-v2",
        **extra,
    }


def test_queue_urls_follow_from_the_prefix() -> None:
    s = Settings.from_env(_env())
    assert s.queue_url("echo") == f"{BASE}asyncinfer-ecs-jobs-echo"
    assert s.queue_url("echo", "high") == f"{BASE}asyncinfer-ecs-jobs-echo-high"
    assert s.priority_queues("all-minilm-l6-v2") == {
        "high": f"{BASE}asyncinfer-ecs-jobs-all-minilm-l6-v2-high",
        "normal": f"{BASE}asyncinfer-ecs-jobs-all-minilm-l6-v2",
        "low": f"{BASE}asyncinfer-ecs-jobs-all-minilm-l6-v2-low",
    }
    with pytest.raises(ConfigError):
        s.queue_url("smollm2-135m-instruct")  # not deployed


def test_service_and_endpoint_names_follow_from_the_prefix_per_compute_mode() -> None:
    ecs = Settings.from_env(_env(ASYNCINFER_COMPUTE="ecs"))
    assert ecs.ecs_services == {
        "echo": "asyncinfer-ecs-echo",
        "all-minilm-l6-v2": "asyncinfer-ecs-all-minilm-l6-v2",
    }
    assert ecs.sagemaker_endpoints == {}
    sm = Settings.from_env(_env(ASYNCINFER_COMPUTE="sagemaker"))
    assert sm.sagemaker_endpoints["echo"] == "asyncinfer-ecs-echo"
    assert sm.ecs_services == {}


def test_explicit_maps_win_over_the_rule() -> None:
    """The local stack passes its queue URLs as a map; the rule never overrides it."""
    env = _env(ASYNCINFER_QUEUE_URLS=json.dumps({"echo": "http://127.0.0.1:1/q"}))
    assert Settings.from_env(env).queue_url("echo") == "http://127.0.0.1:1/q"
    assert Settings.from_env({"ASYNCINFER_QUEUE_URLS": '{"echo": "u"}'}).queue_url("echo") == "u"


def test_prefix_without_base_or_models_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="ASYNCINFER_QUEUE_URL_BASE"):
        Settings.from_env({"ASYNCINFER_RESOURCE_PREFIX": "p-", "ASYNCINFER_MODELS": "echo"})
    with pytest.raises(ConfigError, match="ASYNCINFER_MODELS"):
        Settings.from_env({"ASYNCINFER_RESOURCE_PREFIX": "p-", "ASYNCINFER_QUEUE_URL_BASE": BASE})


def test_naming_problems_catch_long_and_colliding_names() -> None:
    assert naming.problems("asyncinfer-ecs-", ["echo", "all-minilm-l6-v2"]) == []
    assert naming.problems("p" * 70 + "-", ["echo"])  # queue names over 80 characters
    # endpoint names are cut at 63 characters: two models differing only after that collide
    long = "m" * 70
    assert any("not distinct" in p for p in naming.problems("p-", [long + "a", long + "b"]))
    assert naming.endpoint_name("Stack_X-", "Model.1") == "stack-x-model-1"


@mock_aws
def test_backlog_lambda_reads_its_queues_and_services_through_the_rule() -> None:
    sqs = boto3.client("sqs", region_name="us-east-1")
    ecs = boto3.client("ecs", region_name="us-east-1")
    ecs.create_cluster(clusterName="c")
    for p in naming.QUEUE_SUFFIXES:
        sqs.create_queue(QueueName=naming.queue_name("asyncinfer-ecs-", "echo", p))
    url = sqs.get_queue_url(QueueName="asyncinfer-ecs-jobs-echo-low")["QueueUrl"]
    sqs.send_message(QueueUrl=url, MessageBody="x")
    base = url.rsplit("/", 1)[0] + "/"
    config = BacklogConfig.from_env(
        {
            "ASYNCINFER_RESOURCE_PREFIX": "asyncinfer-ecs-",
            "ASYNCINFER_QUEUE_URL_BASE": base,
            "ASYNCINFER_MODELS": "echo",
            "ASYNCINFER_COMPUTE": "ecs",
            "ASYNCINFER_ECS_CLUSTER": "c",
            "AWS_REGION": "us-east-1",
        }
    )
    assert config.services == {"echo": "asyncinfer-ecs-echo"}
    points = measure(config, sqs=sqs, ecs=ecs)
    assert points["echo"]["Backlog"] == 1
    assert points["echo"]["BacklogWithoutCapacity"] == 1


def test_completion_metrics_carry_only_the_model_dimension(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Powertools adds a ``service`` dimension whenever POWERTOOLS_SERVICE_NAME is set (every
    Lambda); the alarms read {Model} only, so the completion Lambda must not use it."""
    monkeypatch.setenv("POWERTOOLS_SERVICE_NAME", "sagemaker-completion")
    monkeypatch.delenv("POWERTOOLS_METRICS_DISABLED", raising=False)  # set by tests/conftest.py
    from asyncinfer.functions.sagemaker_completion import emit

    emit(job_metrics.JOBS_FAILED, 1, "Count", "echo")
    doc = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    directive = doc["_aws"]["CloudWatchMetrics"][0]
    assert directive["Namespace"] == "asyncinfer"
    assert directive["Dimensions"] == [["Model"]]
    assert directive["Metrics"] == [{"Name": "JobsFailed", "Unit": "Count"}]
    assert doc["Model"] == "echo" and doc["JobsFailed"] == 1
    assert "service" not in doc


def test_job_metric_units_are_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("POWERTOOLS_METRICS_DISABLED", raising=False)
    with pytest.raises(ValueError):
        job_metrics.emit(job_metrics.RUN_SECONDS, 1.0, "Count", "echo", write=lambda _: None)
    lines: list[str] = []
    job_metrics.emit(job_metrics.RUN_SECONDS, 2.5, "Seconds", "echo", write=lines.append)
    assert json.loads(lines[0])["RunSeconds"] == 2.5


def test_job_metrics_honour_metrics_disabled(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("POWERTOOLS_METRICS_DISABLED", "true")
    lines: list[str] = []
    job_metrics.emit(job_metrics.JOBS_FAILED, 1, "Count", "echo", write=lines.append)
    assert lines == []


def test_sagemaker_bridge_finds_its_endpoints_through_the_rule(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The CDK app gives the bridge Lambda no endpoint map, only the prefix: the bridge built from
    its environment must still know every model's endpoint (it knew none: every job was
    released as 'no endpoint' in AWS)."""
    from asyncinfer.functions.sagemaker_bridge import Bridge

    for k, v in _env(ASYNCINFER_COMPUTE="sagemaker").items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("ASYNCINFER_SAGEMAKER_ENDPOINTS", raising=False)
    bridge = Bridge.from_env(store=object(), payloads=object(), runtime=object(), publish=print)
    assert bridge.endpoints == {
        "echo": "asyncinfer-ecs-echo",
        "all-minilm-l6-v2": "asyncinfer-ecs-all-minilm-l6-v2",
    }
