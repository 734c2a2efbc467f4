"""The deployment settings' keys, defaults and converters (:mod:`infra.config` validates them).

Context keys and their defaults are listed in :data:`DEFAULTS` (``docs/deploy.md`` documents
each). Values given on the command line arrive as strings; :func:`convert` turns each into its
type.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

#: The repository root: ``models_file`` and ``worker_dockerfile`` are relative to it.
REPO_ROOT = Path(__file__).resolve().parent.parent

#: Default value of every context key (the ``asyncinfer:`` prefix is optional on the CLI).
DEFAULTS: dict[str, Any] = {
    "compute": "ecs",
    "instance_type": "g5.xlarge",
    "gpu": True,
    "min_workers": 0,
    "max_workers": 2,
    "models": "all",
    "models_file": "models.yaml",
    "visibility_timeout": 120,
    "heartbeat_seconds": 0,
    "max_receive_count": 3,
    "throttle_rate": 50,
    "throttle_burst": 100,
    "quota_limit": 100_000,
    "quota_period": "DAY",
    "waf_max_body_kb": 0,
    "backlog_per_worker": 20,
    "stop_timeout": 120,
    "drain_seconds": 100,
    "sagemaker_max_concurrent_invocations": 4,
    "bridge_timeout": 20,
    "dlq_handler_timeout": 30,
    "object_expiry_days": 7,
    "record_retention_days": 30,
    "log_retention_days": 30,
    "oldest_message_alarm_seconds": 900,
    "failure_rate_alarm_percent": 10,
    "alarm_email": "",
    "retain_data": True,
    "lambda_body_guard": True,
    "powertools_layer_version": 0,
    "worker_dockerfile": "container/Dockerfile",
    "input_locations": "",
    "resource_prefix": "",
    "container_insights": False,
    "dashboard": True,
    "trace_scheduled_functions": True,
    "instance_ssm_access": False,
    "waf_rate_limit": 2000,
    "dlq_reserved_concurrency": 5,
    "webhooks_reserved_concurrency": 10,
    "sweeper_reserved_concurrency": 1,
    "bridge_reserved_concurrency": 10,
    "completion_reserved_concurrency": 10,
}

#: The internal functions whose reserved concurrency is a setting (issue 14, behaviour 7): a
#: burst of API long polls cannot take the account's concurrency away from them.
RESERVED_CONCURRENCY_KEYS = (
    "dlq_reserved_concurrency",
    "webhooks_reserved_concurrency",
    "sweeper_reserved_concurrency",
    "bridge_reserved_concurrency",
    "completion_reserved_concurrency",
)


def to_bool(v: Any) -> bool:
    """``1/0``, ``true/false``, ``yes/no``, ``on/off`` (any case; empty is false).

    Raises:
        ValueError: anything else.
    """
    if isinstance(v, bool):
        return v
    s = str(v).strip().lower()
    if s in ("1", "true", "yes", "on"):
        return True
    if s in ("0", "false", "no", "off", ""):
        return False
    raise ValueError(f"{v!r} is not a boolean")


def to_int(v: Any) -> int:
    """An integer, from an int, a whole float or a decimal string.

    Raises:
        ValueError: a boolean, a fraction or not a number.
    """
    if isinstance(v, bool):
        raise ValueError(f"{v!r} is not an integer")
    if isinstance(v, float) and not v.is_integer():
        raise ValueError(f"{v!r} is not an integer")
    return int(v)


def to_models(v: Any) -> tuple[str, ...]:
    """Model ids from a list, a JSON list or a comma-separated string: stripped, empty ones
    dropped, duplicates removed (first order kept).

    Raises:
        ValueError: a string starting with ``[`` that is not JSON.
    """
    if isinstance(v, list | tuple):
        items = [str(x).strip() for x in v]
    else:
        s = str(v).strip()
        if s.startswith("["):
            items = [str(x).strip() for x in json.loads(s)]
        else:
            items = [x.strip() for x in s.split(",")]
    items = [x for x in items if x]
    return tuple(dict.fromkeys(items))  # ("all",) is resolved against the catalogue


#: An ``input_locations`` entry: an S3 bucket name (S3 naming rules), optionally ``/prefix``.
LOCATION_RE = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9](/[^*?\s,]*)?$")


def to_locations(v: Any) -> tuple[str, ...]:
    """``input_locations`` entries (a list or a comma-separated string) without surrounding
    ``/``, duplicates removed.

    Raises:
        ValueError: an entry that is not ``bucket`` or ``bucket/prefix`` (:data:`LOCATION_RE`).
    """
    items = [str(x).strip() for x in v] if isinstance(v, list | tuple) else str(v).split(",")
    out = tuple(dict.fromkeys(x.strip().strip("/") for x in items if x.strip()))
    bad = [x for x in out if not LOCATION_RE.match(x)]
    if bad:
        raise ValueError(f"not bucket or bucket/prefix: {bad}")
    return out


#: Settings whose type is not their default's (int or str): name -> converter.
CONVERTERS: dict[str, Callable[[Any], Any]] = {
    "input_locations": to_locations,
    "compute": lambda v: str(v).strip().lower(),
    "instance_type": lambda v: str(v).strip(),
    "gpu": to_bool,
    "models": to_models,
    "models_file": lambda v: str(v).strip(),
    "heartbeat_seconds": float,
    "throttle_rate": float,
    "quota_period": lambda v: str(v).strip().upper(),
    "failure_rate_alarm_percent": float,
    "alarm_email": lambda v: str(v).strip(),
    "retain_data": to_bool,
    "lambda_body_guard": to_bool,
    "resource_prefix": lambda v: str(v).strip(),
    "container_insights": to_bool,
    "dashboard": to_bool,
    "trace_scheduled_functions": to_bool,
    "instance_ssm_access": to_bool,
}


def convert(name: str, value: Any) -> Any:
    """``value`` of setting ``name`` as its type (:data:`CONVERTERS`; else an int for a key whose
    default is an int, a str otherwise).

    Raises:
        TypeError, ValueError: ``value`` is not valid for ``name``.
    """
    conv = CONVERTERS.get(name) or (to_int if isinstance(DEFAULTS[name], int) else str)
    return conv(value)
