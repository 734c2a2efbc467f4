"""The image URIs of AWS's serving containers that ``engine.image: aws:NAME`` names (issue 16),
from the SageMaker Python SDK at synth time: ``sagemaker-core``'s ``image_uris``
(``retrieve(NAME, region=..., version=...)``, ``list_versions``, ``config_for_framework``).

Those read the tables bundled in the wheel (``sagemaker/core/image_uri_config/NAME.json``) and
botocore's bundled endpoint data: no network, no AWS session, no credentials. ``retrieve`` is not
one of the SDK's telemetry-emitting calls (those carry ``@_telemetry_emitter`` and need a
``sagemaker_session``); the JumpStart session in its defaults is lazy and used only for a
``model_id``, which is never passed here. ``tests/infra/test_infra_sagemaker_images.py`` checks
this with a socket guard.

The SDK is in the ``cdk`` extra only (``pip install -e '.[cdk]'``): the Lambda assets bundle
``src/`` and a few named pure-Python packages (:mod:`infra.lambda_code`), the worker image
installs ``.[worker]`` under ``container/constraints.txt``, so neither gets it. It is imported
only when a deployed entry names an ``aws:`` image, so a synth of a catalogue without one works
without it. This module imports no CDK.
"""

from __future__ import annotations

import importlib
from functools import cache
from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as dist_version
from typing import Any

#: How to install the SDK (the ``cdk`` extra of pyproject.toml).
EXTRA = "pip install -e '.[cdk]'"
#: The ECR domains a region-agnostic stack's ``CfnMapping`` covers: the commercial partition
#: (GovCloud's ECR hosts are under ``amazonaws.com`` too) and China; isolated partitions are left
#: out (a stack there names its region, and gets that region's URI).
DOMAINS = ("amazonaws.com", "amazonaws.com.cn")


class ImageError(RuntimeError):
    """An ``aws:NAME`` image the installed SDK cannot resolve (or no SDK); the message names
    ``engine.image`` / ``engine.version`` and lists what the SDK knows."""


def sdk() -> Any:
    """The SDK's ``image_uris`` module (``sagemaker.core.image_uris``, sagemaker-core >= 2.27).

    Raises:
        ImageError: the SDK is not installed (naming the extra to install).
    """
    try:
        return importlib.import_module("sagemaker.core.image_uris")
    except ImportError:
        raise ImageError(
            "engine.image aws:NAME is resolved at synth with the sagemaker SDK (sagemaker-core), "
            f"which is not installed: {EXTRA}"
        ) from None


def sdk_version() -> str:
    """The installed ``sagemaker-core`` version (``"?"`` when unknown)."""
    try:
        return dist_version("sagemaker-core")
    except PackageNotFoundError:
        return "?"


def known_versions(name: str) -> list[str]:
    """The versions (and aliases such as ``latest`` or ``3.3``) the SDK knows for container
    ``name``, oldest first: ``image_uris.list_versions(name)``."""
    return [str(v) for v in sdk().list_versions(name)]


def _registries(name: str, version: str) -> dict[str, str]:
    """``{region: account}`` of ``name`` at ``version`` (an alias resolved as ``retrieve`` does)."""
    config = sdk().config_for_framework(name)
    config = config.get("inference", config)
    real = (config.get("version_aliases") or {}).get(version, version)
    found: dict[str, str] = ((config.get("versions") or {}).get(real) or {}).get("registries") or {}
    return found


def _unknown(name: str, version: str) -> ImageError:
    return ImageError(
        f"engine.image aws:{name} version {version}: not an engine.version the sagemaker SDK "
        f"(sagemaker-core {sdk_version()}) knows (known: {', '.join(known_versions(name))}); "
        "upgrade sagemaker-core for a newer container, or give the image URI"
    )


@cache
def region_uris(name: str, version: str) -> dict[str, str]:
    """``{region: image URI}`` of container ``name`` at ``version`` for every region of
    :data:`DOMAINS` the SDK lists for it, each URI ``image_uris.retrieve(name, region=r,
    version=version)``.

    Raises:
        ImageError: no SDK, or a version it does not know (listing the known ones).
    """
    regions = sorted(_registries(name, version))
    if not regions:
        raise _unknown(name, version)
    out: dict[str, str] = {}
    for region in regions:  # the SDK's config read once above, not again per region
        uri = _retrieve(name, version, region)
        host = uri.split("/", 1)[0]
        if host.split(f".ecr.{region}.", 1)[-1] in DOMAINS:
            out[region] = uri
    return out


@cache
def region_uri(name: str, version: str, region: str) -> str:
    """The image URI of container ``name`` at ``version`` in ``region``:
    ``image_uris.retrieve(name, region=region, version=version)``.

    Raises:
        ImageError: no SDK, a version it does not know, or a region it has no image in (listing
            the regions it has).
    """
    regions = _registries(name, version)
    if not regions:
        raise _unknown(name, version)
    if region not in regions:
        raise ImageError(
            f"engine.image aws:{name} version {version}: the sagemaker SDK lists no image in "
            f"{region} (it has: {', '.join(sorted(regions))})"
        )
    return _retrieve(name, version, region)


def _retrieve(name: str, version: str, region: str) -> str:
    """``image_uris.retrieve(name, region=region, version=version)`` for a region the SDK's
    config lists.

    Raises:
        ImageError: the SDK's own "Unsupported ..." (its tables disagree).
    """
    try:
        return str(sdk().retrieve(name, region=region, version=version))
    except ValueError as exc:
        raise ImageError(f"engine.image aws:{name} version {version} in {region}: {exc}") from None


def image_problems(model: str, name: str, version: str | None) -> list[str]:
    """What stops ``model``'s ``aws:NAME`` image from resolving (empty when it does), each naming
    the model and the field: no SDK, or an ``engine.version`` it does not know."""
    try:
        region_uris(name, version or "")
    except ImageError as exc:
        return [f"{model}: {exc}"]
    return []
