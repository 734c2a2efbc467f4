"""cdk-nag AwsSolutions (zero unacknowledged findings) and cfn-lint (zero errors) on both
synthesized modes and the engine catalogues (conftest.ENGINE_CATALOGUES); and the Lambda code
assets."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest


def test_cdk_nag_has_no_unacknowledged_findings(nagged: Any) -> None:
    any_mode = nagged
    report_path = any_mode.outdir / "validation-report.json"
    violations = []
    if report_path.exists():
        report = json.loads(report_path.read_text())
        for plugin in report.get("pluginReports", []):
            for v in plugin.get("violations", []):
                paths = [c["constructPath"] for c in v["violatingConstructs"]]
                violations.append(f"{v['ruleName']} ({v['severity']}): {paths}")
    assert not violations, "\n".join(violations)
    assert any_mode.validation_error is None, any_mode.validation_error


def test_every_acknowledgement_has_a_one_line_reason() -> None:
    from infra import nag

    for table in (nag.RULES, nag.MANAGED_POLICIES, nag.WILDCARD_ACTIONS):
        for rule, reason in table.items():
            assert reason.strip() and "\n" not in reason, rule


def test_cfn_lint_finds_no_errors(linted: Any) -> None:
    any_mode = linted
    cfn_lint = Path(sys.executable).with_name("cfn-lint")
    if not cfn_lint.exists():
        pytest.skip("cfn-lint is not installed")
    proc = subprocess.run(
        [str(cfn_lint), "--format", "json", str(any_mode.template_path)],
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )
    findings = json.loads(proc.stdout or "[]")
    errors = [f for f in findings if f["Level"] == "Error"]
    assert not errors, json.dumps(errors, indent=1)[:4000]


def test_lambda_assets_hold_the_package_ulid_and_entry_point(any_mode: Any) -> None:
    t = any_mode.template["Resources"]
    manifest = json.loads(
        (any_mode.outdir / f"{any_mode.stack.stack_name}.assets.json").read_text()
    )
    dirs = {
        k: v["source"]["path"]
        for k, v in manifest["files"].items()
        if v["source"].get("packaging") == "zip"
    }
    ours = [
        f["Properties"]
        for f in t.values()
        if f["Type"] == "AWS::Lambda::Function" and f["Properties"].get("Handler") == "app.handler"
    ]
    assert ours
    for fn in ours:
        key = fn["Code"]["S3Key"].split(".")[0]
        folder = any_mode.outdir / dirs[key]
        assert (folder / "app.py").is_file()
        assert (folder / "asyncinfer" / "jobs" / "store.py").is_file()
        assert (folder / "ulid" / "__init__.py").is_file()
        assert not list(folder.rglob("__pycache__"))


def test_worker_image_is_an_asset_without_the_venv(any_mode: Any) -> None:
    manifest = json.loads(
        (any_mode.outdir / f"{any_mode.stack.stack_name}.assets.json").read_text()
    )
    images = list(manifest["dockerImages"].values())
    assert len(images) == 1
    folder = any_mode.outdir / images[0]["source"]["directory"]
    assert (folder / "src" / "asyncinfer").is_dir()
    for excluded in (".venv", "node_modules", ".git", "cdk.out", "tests"):
        assert not (folder / excluded).exists(), excluded
