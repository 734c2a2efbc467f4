"""``asyncinfer.core.observability.single``: one EMF metric with its own dimensions, printed unless
metrics are disabled (the local stack sets ``POWERTOOLS_METRICS_DISABLED``)."""

from __future__ import annotations

import json

import pytest

from asyncinfer.core.observability import single


def test_single_prints_emf_with_its_dimensions(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("POWERTOOLS_METRICS_DISABLED", "false")
    monkeypatch.delenv("POWERTOOLS_DEV", raising=False)
    single("JobsSubmitted", dimensions={"Model": "echo"})
    doc = json.loads(capsys.readouterr().out.strip())
    assert doc["JobsSubmitted"] == [1.0] and doc["Model"] == "echo"
    (directive,) = doc["_aws"]["CloudWatchMetrics"]
    assert directive["Namespace"] == "asyncinfer"
    assert directive["Dimensions"] == [["Model"]]


def test_single_prints_nothing_when_metrics_are_disabled(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("POWERTOOLS_METRICS_DISABLED", "true")
    single("JobsSubmitted", dimensions={"Model": "echo"})
    assert capsys.readouterr().out == ""
