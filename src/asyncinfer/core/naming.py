"""The naming rule of a deployment's per-model resources, shared by the CDK app (which names the
resources) and :mod:`asyncinfer.core.settings` (which derives their URLs and names at run time).

A deployment has one *resource prefix* (default ``<stack name>-``, e.g. ``asyncinfer-ecs-``).
For a model id ``m`` and that prefix ``p``:

* job queues: ``p + "jobs-" + m`` (priority ``normal``), the same + ``"-high"`` / ``"-low"``;
* dead-letter queue: ``p + "dlq-" + m``;
* ECS worker service: ``p + m``;
* SageMaker endpoint: ``p + m`` with runs of other characters made ``-``, at most 63 characters.

The functions and processes then need only the prefix and the queue URL base
(``https://sqs.<region>.<url suffix>/<account>/``) in their environment, a constant size
whatever the number of models, instead of a map that grows ~420 bytes per model (Lambda
environments are limited to 4 KB in all, SageMaker CreateModel to 1,024 bytes per value). The
``jobs-`` and ``dlq-`` infixes let one IAM resource pattern (``<p>jobs-*``) name every job queue
of the deployment and nothing else (CloudFormation-generated names never contain them).
"""

from __future__ import annotations

import re

#: Priority classes (spec ``priority``) -> queue name suffix.
QUEUE_SUFFIXES: dict[str, str] = {"normal": "", "high": "-high", "low": "-low"}
JOBS_INFIX = "jobs-"
DLQ_INFIX = "dlq-"
#: SQS queue names: 1..80 of ``[A-Za-z0-9_-]`` (SQS API reference, CreateQueue QueueName).
SQS_NAME_MAX = 80
SQS_NAME = re.compile(r"[A-Za-z0-9_-]{1,80}")
#: ECS service names: up to 255 letters, numbers, hyphens, underscores (CreateService).
ECS_SERVICE_NAME = re.compile(r"[A-Za-z0-9_-]{1,255}")
#: SageMaker endpoint names: ``^[a-zA-Z0-9](-*[a-zA-Z0-9]){0,62}`` (CreateEndpoint).
ENDPOINT_NAME_MAX = 63


def queue_name(prefix: str, model: str, priority: str = "normal") -> str:
    """The SQS queue name of ``model``'s ``priority`` class (``KeyError`` for an unknown
    class)."""
    return f"{prefix}{JOBS_INFIX}{model}{QUEUE_SUFFIXES[priority]}"


def dlq_name(prefix: str, model: str) -> str:
    """The SQS dead-letter queue name of ``model``."""
    return f"{prefix}{DLQ_INFIX}{model}"


def queue_key(model: str, priority: str = "normal") -> str:
    """The key of a queue in :attr:`asyncinfer.core.settings.Settings.queue_urls`: the model id for
    ``normal``, ``<model>#high`` / ``<model>#low`` for the other classes."""
    return model if priority == "normal" else f"{model}#{priority}"


def queue_urls(base: str, prefix: str, models: list[str]) -> dict[str, str]:
    """``{queue key: URL}`` of every class queue of ``models`` (``base`` ends with ``/``)."""
    return {
        queue_key(m, p): f"{base}{queue_name(prefix, m, p)}" for m in models for p in QUEUE_SUFFIXES
    }


def ecs_service_name(prefix: str, model: str) -> str:
    """The ECS worker service name of ``model``."""
    return f"{prefix}{model}"


def endpoint_name(prefix: str, model: str) -> str:
    """The SageMaker endpoint name of ``model``: lower case, runs of characters outside
    ``[a-z0-9]`` made ``-``, at most 63 characters, no leading or trailing ``-``."""
    raw = re.sub(r"[^a-z0-9]+", "-", f"{prefix}{model}".lower()).strip("-")
    return raw[:ENDPOINT_NAME_MAX].rstrip("-")


def problems(prefix: str, models: list[str]) -> list[str]:
    """Every way ``prefix`` and ``models`` break the services' naming rules; empty when the
    names are valid and distinct."""
    out: list[str] = []
    for m in models:
        for name in [queue_name(prefix, m, p) for p in QUEUE_SUFFIXES] + [dlq_name(prefix, m)]:
            if not SQS_NAME.fullmatch(name):
                out.append(
                    f"queue name {name!r} (prefix {prefix!r} + model {m!r}) is not "
                    f"1..{SQS_NAME_MAX} letters, digits, '-' or '_' (SQS CreateQueue)"
                )
        if not ECS_SERVICE_NAME.fullmatch(ecs_service_name(prefix, m)):
            out.append(f"ECS service name {ecs_service_name(prefix, m)!r} is not valid")
    endpoints = [endpoint_name(prefix, m) for m in models]
    if len(set(endpoints)) != len(endpoints) or not all(endpoints):
        out.append(
            f"SageMaker endpoint names {endpoints} are empty or not distinct (at most "
            f"{ENDPOINT_NAME_MAX} characters each); choose a shorter resource prefix"
        )
    return out
