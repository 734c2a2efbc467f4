"""Where the API is and which key to send: :class:`Config` and :func:`resolve_config` (arguments,
then ``ASYNCINFER_URL`` / ``ASYNCINFER_API_KEY``, then the local stack's ``local.json``)."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from asyncinfer.client._transport import RetryPolicy
from asyncinfer.client.errors import ConfigurationError

#: Where the local stack writes its URL and key (``asyncinfer local --state-dir``), relative to
#: the working directory.
LOCAL_JSON = Path(".asyncinfer") / "local.json"


@dataclass(frozen=True)
class Config:
    """Where the API is and how to call it. ``timeout`` is the per-request timeout in seconds
    (long-polls add their ``wait`` to it)."""

    base_url: str
    api_key: str
    timeout: float = 30.0
    retry: RetryPolicy = field(default_factory=RetryPolicy)


def _read_local_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def resolve_config(
    base_url: str | None = None,
    api_key: str | None = None,
    *,
    timeout: float = 30.0,
    max_retries: int = 3,
    local_json: str | os.PathLike[str] | None = None,
) -> Config:
    """The client's configuration: arguments first, then ``ASYNCINFER_URL`` /
    ``ASYNCINFER_API_KEY``, then the local stack's ``.asyncinfer/local.json`` (its key only
    when its ``api_url`` is the URL in use). Raises :class:`ConfigurationError`."""
    url = base_url or os.environ.get("ASYNCINFER_URL") or None
    key = api_key or os.environ.get("ASYNCINFER_API_KEY") or None
    if url is None or key is None:
        local = _read_local_json(Path(local_json) if local_json else LOCAL_JSON)
        if url is None and local.get("api_url"):
            url = str(local["api_url"])
        if key is None and local.get("api_key") and url == local.get("api_url"):
            key = str(local["api_key"])
    if not url:
        raise ConfigurationError(
            "no API URL: pass base_url, set ASYNCINFER_URL, or start the local stack "
            "(asyncinfer local writes .asyncinfer/local.json)"
        )
    if not key:
        raise ConfigurationError("no API key: pass api_key or set ASYNCINFER_API_KEY")
    return Config(
        base_url=url.rstrip("/"),
        api_key=key,
        timeout=timeout,
        retry=RetryPolicy(max_retries=max_retries),
    )
