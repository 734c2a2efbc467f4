"""The settings object reads the environment once and reports every bad variable."""

from __future__ import annotations

import pytest

from asyncinfer.core.errors import ConfigError
from asyncinfer.core.settings import Settings


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
