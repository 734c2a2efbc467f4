"""The worker image's entry point finds its model through the settings (ASYNCINFER_MODELS)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest

from asyncinfer.core import envvars as ev
from tests.conftest import apply_env

ROOT = Path(__file__).resolve().parents[2]


def _entrypoint() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "entrypoint", ROOT / "container" / "entrypoint.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("models", ["", "echo,all-minilm-l6-v2"])
def test_worker_needs_one_model(
    models: str, clean_env: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    apply_env(clean_env, {ev.MODELS: models})
    assert _entrypoint().main(["worker"]) == 2
    assert ev.MODELS in capsys.readouterr().err


def test_a_bad_setting_is_reported_by_name(
    clean_env: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    apply_env(clean_env, {ev.MODELS: "echo", ev.VISIBILITY_TIMEOUT: "soon"})
    assert _entrypoint().main(["worker"]) == 2
    assert ev.VISIBILITY_TIMEOUT in capsys.readouterr().err


def test_one_model_is_passed_to_the_worker(
    clean_env: pytest.MonkeyPatch, monkeypatch: pytest.MonkeyPatch
) -> None:
    import asyncinfer.worker.__main__ as worker_main

    seen: list[list[str]] = []
    monkeypatch.setattr(worker_main, "main", lambda argv: seen.append(argv) or 0)
    apply_env(clean_env, {ev.MODELS: "echo"})
    assert _entrypoint().main(["worker"]) == 0
    assert seen == [["--model", "echo"]]
