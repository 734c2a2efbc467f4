"""The options of ``asyncinfer local`` (the CLI builds them; the stack,
:class:`~asyncinfer.local.stack.LocalStack`, reads them)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from asyncinfer.models.registry import MODELS


@dataclass(kw_only=True)
class LocalOptions:
    """Options of ``asyncinfer local`` (spec, "The local stack")."""

    port: int = 8000
    #: The model catalogue (``--models-file``); default: the one :data:`MODELS` reads (the
    #: project's ``models.yaml``, or ``ASYNCINFER_MODELS_FILE``). Workers and the API get it
    #: through ``ASYNCINFER_MODELS_FILE``.
    models_file: Path | None = None
    models: list[str] = field(default_factory=lambda: list(MODELS))
    max_workers: int = 1
    state_dir: Path = Path(".asyncinfer")
    extra_keys: list[str] = field(default_factory=list)
    visibility_timeout: int = 30
    max_receive_count: int = 3
    drain_seconds: float = 4.0
    #: Autoscaling (asyncinfer.scaling.policy): workers per model go between ``min_workers`` and
    #: ``max_workers``; to ``min_workers`` after ``idle_seconds`` without jobs.
    min_workers: int = 0
    idle_seconds: float = 60.0
    backlog_per_worker: float = 1.0
    scale_interval: float = 0.5
    #: ``--max-batch-size`` of each worker (default: the model's).
    worker_max_batch_size: int | None = None
    #: Workers' ReceiveMessage WaitTimeSeconds. Short, because a stopping worker waits for its
    #: last long poll (to release what it returns), and scale-in and Ctrl-C should be quick.
    worker_receive_wait: int = 2
    #: Fork workers from a fork server that has imported torch and transformers once
    #: (:mod:`asyncinfer.local.warm`; ready in ~1 s instead of ~4.5 s); ``False`` starts each as
    #: a new ``python -m asyncinfer.worker``, as the ECS container does.
    warm_workers: bool = True
