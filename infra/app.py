"""CDK entry point (``cdk.json``: ``app``). Reads the context settings, validates them (every
conflict in one error) and synthesizes the stack.

Usage: ``npx cdk synth`` (each model's compute from ``models.yaml``), ``-c models_file=PATH`` for
another catalogue, ``-c compute=sagemaker`` to put every model on SageMaker.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# Running ``python infra/app.py`` puts infra/ first on sys.path; the repository root must win.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != ROOT / "infra"]
for p in (ROOT, ROOT / "src"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

import aws_cdk as cdk  # noqa: E402

from asyncinfer.core.errors import CatalogueError  # noqa: E402
from infra.config import DeployConfigError, load_config  # noqa: E402
from infra.stack import AsyncInferStack  # noqa: E402


def feature_flags() -> dict[str, object]:
    """The CDK feature flags of ``cdk.json`` (tests create their ``App`` with them too)."""
    with (ROOT / "cdk.json").open() as f:
        return {
            k: v for k, v in json.load(f).get("context", {}).items() if k.startswith("@aws-cdk")
        }


def build_app(app: cdk.App | None = None) -> tuple[cdk.App, AsyncInferStack]:
    """Create the app and the stack from the app's context. Context ``stack_name`` names the
    stack (default ``asyncinfer-<compute>``); ``nag=true`` applies cdk-nag at synth."""
    app = app or cdk.App()
    ctx = app.node.get_all_context()
    config = load_config(
        {k: v for k, v in ctx.items() if k not in ("stack_name", "nag") and not k.startswith("@")}
    )
    name = str(ctx.get("stack_name") or f"asyncinfer-{config.compute}")
    env = None
    if os.environ.get("CDK_DEFAULT_ACCOUNT"):
        env = cdk.Environment(
            account=os.environ["CDK_DEFAULT_ACCOUNT"], region=os.environ.get("CDK_DEFAULT_REGION")
        )
    stack = AsyncInferStack(
        app, name, config=config, env=env, description=f"asyncinfer ({config.compute} compute)"
    )
    if str(ctx.get("nag", "")).lower() in ("1", "true", "yes"):
        from cdk_nag import AwsSolutionsChecks

        cdk.Validations.of(app).add_plugins(AwsSolutionsChecks(app))
    return app, stack


def main() -> None:
    """Synthesize; print the configuration errors (or the catalogue's, every problem of
    ``models_file`` listed) and exit 1 if the settings are invalid."""
    try:
        app, _ = build_app()
    except (DeployConfigError, CatalogueError) as exc:
        print(exc, file=sys.stderr)
        sys.exit(1)
    app.synth()


if __name__ == "__main__":
    main()
