"""Unit-test fixtures: moto in-process (no network) holding the service's resources."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from moto import mock_aws

from asyncinfer.core.settings import Settings
from asyncinfer.local.resources import Resources, create_resources
from asyncinfer.models.registry import MODELS
from tests.conftest import ApiCaller, apply_env


@pytest.fixture
def resources(clean_env: pytest.MonkeyPatch) -> Iterator[Resources]:
    """Every resource of the service in moto's in-process mock, and the environment set."""
    with mock_aws():
        res = create_resources(Settings(visibility_timeout_seconds=30), list(MODELS))
        apply_env(clean_env, {**res.env(), "ASYNCINFER_LOCAL": "0"})
        yield res


@pytest.fixture
def settings(resources: Resources) -> Settings:
    """Settings read from the environment of :func:`resources`."""
    return Settings.from_env()


@pytest.fixture
def api(resources: Resources) -> ApiCaller:
    """Call the API as tenant ``tenant-a`` (``api(..., key_id="tenant-b")`` for another)."""
    return ApiCaller("tenant-a")
