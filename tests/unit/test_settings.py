"""The settings object reads the environment once and reports every bad variable."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from pydantic import ValidationError

from asyncinfer.core import envvars as ev
from asyncinfer.core.errors import ConfigError
from asyncinfer.core.settings import Settings
from asyncinfer.core.settings_parts import (
    ApiSettings,
    BridgeSettings,
    CompletionSettings,
    DlqSettings,
    ModelSettings,
    OpenAISettings,
    ScalingSettings,
    SettingsPart,
    SweeperSettings,
    WebhookSettings,
    WorkerSettings,
)


def test_from_env_reads_queues_and_defaults_models_to_their_keys() -> None:
    s = Settings.from_env(
        {
            "ASYNCINFER_QUEUE_URLS": '{"echo": "http://q/echo"}',
            "ASYNCINFER_VISIBILITY_TIMEOUT": "90",
            "AWS_REGION": "eu-west-1",
        }
    )
    assert s.queue_url("echo") == "http://q/echo"
    assert s.models == ["echo"]
    assert s.heartbeat_interval == 30
    assert s.region == "eu-west-1"
    assert s.max_receive_count == 3


def test_every_bad_variable_is_reported_at_once() -> None:
    with pytest.raises(ConfigError) as info:
        Settings.from_env(
            {
                "ASYNCINFER_VISIBILITY_TIMEOUT": "soon",
                "ASYNCINFER_MAX_RECEIVE_COUNT": "x",
                "ASYNCINFER_QUEUE_URLS": "[1]",
            }
        )
    msg = str(info.value)
    assert "ASYNCINFER_VISIBILITY_TIMEOUT" in msg
    assert "ASYNCINFER_MAX_RECEIVE_COUNT" in msg
    assert "ASYNCINFER_QUEUE_URLS" in msg


def test_unknown_model_queue_is_a_config_error() -> None:
    with pytest.raises(ConfigError):
        Settings().queue_url("echo")


# --- pydantic-settings: every variable, its errors, the parts (issue 14) -------------------

_EVERY_VAR: list[tuple[str, str, str, object]] = [
    # (variable, raw value, field, parsed value)
    (ev.TABLE, "t", "table_name", "t"),
    (ev.BUCKET, "b", "bucket", "b"),
    (ev.TOPIC_ARN, "arn:aws:sns:us-east-1:1:t", "topic_arn", "arn:aws:sns:us-east-1:1:t"),
    (ev.QUEUE_URLS, '{"echo": "http://q"}', "queue_urls", {"echo": "http://q"}),
    (ev.RESOURCE_PREFIX, "p-", "resource_prefix", "p-"),
    (ev.QUEUE_URL_BASE, "https://sqs/1/", "queue_url_base", "https://sqs/1/"),
    (ev.MODELS, "echo, all-minilm-l6-v2,", "models", ["echo", "all-minilm-l6-v2"]),
    (ev.MODELS_FILE, "/x/models.yaml", "models_file", Path("/x/models.yaml")),
    (ev.MAX_RECEIVE_COUNT, "5", "max_receive_count", 5),
    (ev.VISIBILITY_TIMEOUT, "90", "visibility_timeout_seconds", 90),
    (ev.HEARTBEAT_SECONDS, "1.5", "heartbeat_seconds", 1.5),
    (ev.LEASE_SECONDS, "12", "lease_seconds", 12.0),
    (ev.SWEEP_SECONDS, "0.5", "sweep_seconds", 0.5),
    (ev.OUTBOX_GRACE, "12.5", "outbox_grace_seconds", 12.5),
    (ev.RECEIVE_WAIT, "1", "receive_wait_seconds", 1),
    (ev.DRAIN_SECONDS, "3", "drain_seconds", 3.0),
    (ev.RETRY_DELAY, "0.2", "retry_delay_seconds", 0.2),
    (ev.INLINE_INPUT_BYTES, "1024", "inline_input_limit_bytes", 1024),
    (ev.RECORD_RETENTION, "86400", "record_retention_seconds", 86400),
    (ev.MAX_INPUT_BYTES, "1048576", "max_input_bytes", 1048576),
    (ev.INPUT_LOCATIONS, "b1, b2/p/", "input_locations", ["b1", "b2/p/"]),
    (ev.SUBMIT_LEASE, "60", "submit_lease_seconds", 60),
    (ev.MAX_WAITS_PER_TENANT, "0", "max_waits_per_tenant", 0),
    (ev.MODEL_CACHE, "/cache", "model_cache_dir", Path("/cache")),
    (ev.ENGINE_URL, "http://engine:8000", "engine_url", "http://engine:8000"),
    (ev.WEIGHTS_CACHE, "/var/cache/asyncinfer", "weights_cache_dir", Path("/var/cache/asyncinfer")),
    (ev.MAX_BATCH_SIZE, "4", "max_batch_size", 4),
    (ev.MAX_WAIT_MS, "10", "max_wait_ms", 10.0),
    (ev.TOKEN_BUDGET, "4096", "token_budget", 4096),
    (ev.ECHO_BATCHING, "0", "echo_batching", False),
    (ev.BUSY_FILE, "/tmp/busy", "busy_file", "/tmp/busy"),
    (ev.ECS_AGENT_URI, "http://169.254.170.2/api/x", "ecs_agent_uri", "http://169.254.170.2/api/x"),
    (ev.LOCAL, "1", "local_mode", True),
    (ev.EMULATOR_FAULTS, "true", "local_emulator_faults", True),
    (ev.WEBHOOK_QUEUE_URL, "http://wq", "webhook_queue_url", "http://wq"),
    (ev.WEBHOOK_DLQ_URL, "http://wdlq", "webhook_dlq_url", "http://wdlq"),
    (ev.WEBHOOK_SECRETS_KEY, "alias/k", "webhook_secrets_key", "alias/k"),
    (ev.WEBHOOK_RETRY_BASE, "1", "webhook_retry_base_seconds", 1.0),
    (ev.WEBHOOK_RETRY_MAX, "600", "webhook_retry_max_delay_seconds", 600.0),
    (ev.WEBHOOK_RETRY_WINDOW, "3600", "webhook_retry_window_seconds", 3600.0),
    (ev.BATCH_QUEUE_URL, "http://q/b", "batch_queue_url", "http://q/b"),
    (ev.BATCH_EVENTS_QUEUE_URL, "http://q/e", "batch_events_queue_url", "http://q/e"),
    (ev.BATCH_CHUNK, "100", "batch_chunk_lines", 100),
    (ev.COMPUTE, "sagemaker", "compute", "sagemaker"),
    (ev.ECS_CLUSTER, "c", "ecs_cluster", "c"),
    (ev.ECS_SERVICES, '{"echo": "svc"}', "ecs_services", {"echo": "svc"}),
    (ev.SAGEMAKER_ENDPOINTS, '{"echo": "ep"}', "sagemaker_endpoints", {"echo": "ep"}),
    (ev.SAGEMAKER_ENGINES, '{"llm": "chat"}', "sagemaker_engines", {"llm": "chat"}),
    (ev.WAKE_CACHE_SECONDS, "5", "wake_cache_seconds", 5.0),
    (ev.AWS_ENDPOINT_URL, "http://127.0.0.1:5000", "endpoint_url", "http://127.0.0.1:5000"),
    (ev.AWS_REGION, "eu-west-1", "region", "eu-west-1"),
    (ev.AWS_DEFAULT_REGION, "eu-west-2", "region", "eu-west-2"),
]


@pytest.mark.parametrize(
    ("var", "raw", "field", "value"), _EVERY_VAR, ids=[v[0] for v in _EVERY_VAR]
)
def test_each_variable_sets_its_field(var: str, raw: str, field: str, value: object) -> None:
    # the naming rule needs the model list and the URL base with a prefix
    more = (
        {ev.MODELS: "echo", ev.QUEUE_URL_BASE: "https://sqs/1/"}
        if var == ev.RESOURCE_PREFIX
        else {}
    )
    assert getattr(Settings.from_env({var: raw, **more}), field) == value
    assert getattr(Settings.from_env({var: ""}), field) == getattr(Settings(), field)


def test_every_name_in_envvars_is_read_and_tested() -> None:
    names = {v for k, v in vars(ev).items() if k.isupper() and isinstance(v, str)}
    names -= set(ev.SDK_ONLY)
    assert names == {v[0] for v in _EVERY_VAR}
    read = {Settings.env_name(f) for f in Settings.model_fields} | {ev.AWS_DEFAULT_REGION}
    assert names == read - {None}


def test_defaults_are_kept() -> None:
    s = Settings.from_env({})
    assert (s.max_receive_count, s.visibility_timeout_seconds, s.receive_wait_seconds) == (
        3,
        120,
        20,
    )
    assert (s.drain_seconds, s.retry_delay_seconds, s.sweep_seconds) == (10.0, 2.0, 5.0)
    assert s.inline_input_limit_bytes == 65536 and s.max_input_bytes == 64 * 1024 * 1024
    assert s.record_retention_seconds == 30 * 86400 and s.submit_lease_seconds == 120
    assert (s.max_waits_per_tenant, s.max_wait_ms, s.token_budget) == (10, 50.0, 32768)
    assert s.echo_batching is True and s.local_mode is False and s.local_emulator_faults is False
    assert (s.webhook_retry_base_seconds, s.webhook_retry_max_delay_seconds) == (5.0, 3600.0)
    assert s.webhook_retry_window_seconds == 86400.0 and s.wake_cache_seconds == 30.0
    assert s.region == "us-east-1" and s.endpoint_url is None and s.models_file is None
    assert s.receive_max_messages == 10 and s.heartbeat_interval == 40 and s.lease_interval == 120


def test_aws_region_wins_over_the_default_region() -> None:
    s = Settings.from_env({ev.AWS_REGION: "eu-west-1", ev.AWS_DEFAULT_REGION: "eu-west-2"})
    assert s.region == "eu-west-1"


_BAD = [
    (ev.MAX_RECEIVE_COUNT, "0"),  # SQS: 1..1000
    (ev.VISIBILITY_TIMEOUT, "43201"),  # SQS: 0..43200 s
    (ev.RECEIVE_WAIT, "21"),  # SQS: 0..20 s
    (ev.HEARTBEAT_SECONDS, "soon"),
    (ev.SWEEP_SECONDS, "0"),
    (ev.INLINE_INPUT_BYTES, "1.5"),
    (ev.MAX_INPUT_BYTES, "-1"),
    (ev.MAX_WAITS_PER_TENANT, "many"),
    (ev.WEBHOOK_RETRY_MAX, "43201"),  # SQS's largest message delay/visibility
    (ev.ECHO_BATCHING, "maybe"),
    (ev.LOCAL, "2"),
    (ev.COMPUTE, "lambda"),
    (ev.QUEUE_URLS, "{not json"),
    (ev.ECS_SERVICES, '["echo"]'),
    (ev.SAGEMAKER_ENDPOINTS, "3"),
]


@pytest.mark.parametrize(("var", "raw"), _BAD, ids=[b[0] for b in _BAD])
def test_a_bad_value_is_a_config_error_naming_the_variable(var: str, raw: str) -> None:
    with pytest.raises(ConfigError, match=var) as info:
        Settings.from_env({var: raw})
    assert repr(raw) in str(info.value)
    assert isinstance(info.value.__cause__, ValidationError)


def test_a_directly_built_object_reads_no_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ev.VISIBILITY_TIMEOUT, "7")
    monkeypatch.setenv(ev.TABLE, "from-env")
    assert Settings().visibility_timeout_seconds == 120 and Settings().table_name == ""
    assert Settings.from_env().visibility_timeout_seconds == 7


def test_fields_without_a_variable_are_not_read_from_the_environment() -> None:
    s = Settings.from_env({"receive_max_messages": "1", "table_name": "x", "REGION": "x"})
    assert s.receive_max_messages == 10 and s.table_name == "" and s.region == "us-east-1"


_PARTS = [
    ApiSettings,
    WorkerSettings,
    ModelSettings,
    WebhookSettings,
    SweeperSettings,
    ScalingSettings,
    DlqSettings,
    BridgeSettings,
    CompletionSettings,
    OpenAISettings,
]


@pytest.mark.parametrize("part", _PARTS, ids=[p.__name__ for p in _PARTS])
def test_each_part_copies_its_fields_from_the_settings(part: type[SettingsPart]) -> None:
    s = Settings.from_env({ev.TABLE: "t", ev.HEARTBEAT_SECONDS: "2", ev.LOCAL: "1"})
    view = part.of(s)
    for name in part.model_fields:
        assert getattr(view, name) == getattr(s, name)
    assert set(part.source_fields()) <= set(Settings.model_fields)
    with pytest.raises(ValidationError):  # frozen: a component cannot change the settings
        view.region = "x"  # type: ignore[misc]


def test_parts_through_the_settings_and_their_variables() -> None:
    s = Settings.from_env({ev.WEBHOOK_RETRY_BASE: "1", ev.LEASE_SECONDS: "9"})
    assert s.webhooks.webhook_retry_base_seconds == 1.0
    assert s.worker.lease_interval == 9 and s.sweeper.lease_interval == 9
    assert ev.LEASE_SECONDS in WorkerSettings.env_names()
    assert ev.WEBHOOK_QUEUE_URL in WebhookSettings.env_names()
    assert ev.WEBHOOK_QUEUE_URL not in WorkerSettings.env_names()
    # queue URLs may come from the naming rule: the parts that read them need its inputs too
    assert {ev.RESOURCE_PREFIX, ev.QUEUE_URL_BASE, ev.MODELS} <= set(SweeperSettings.env_names())


_ROOT = Path(__file__).resolve().parents[2]


def test_no_variable_name_is_spelled_outside_envvars() -> None:
    """The service's own code sets and reads ASYNCINFER_* by the envvars constants (the client
    SDK's user-side variables excepted)."""
    pattern = re.compile(r"[\"'](?:ASYNCINFER|AWS)_[A-Z_]+[\"']")
    found = []
    for top in ("src/asyncinfer", "infra", "lambdas", "container"):
        for path in (_ROOT / top).rglob("*.py"):
            rel = path.relative_to(_ROOT).as_posix()
            if rel.endswith("core/envvars.py") or "/client/" in rel:
                continue
            found += [f"{rel}: {m}" for m in pattern.findall(path.read_text())]
    assert found == []
