"""The one scaling policy of asyncinfer: how many workers a model should run.

The local autoscaler (:mod:`asyncinfer.local.autoscaler`), the backlog metric published for AWS
(:mod:`asyncinfer.scaling.backlog`), the wake-on-submit helper (:mod:`asyncinfer.scaling.wake`) and
the
simulator (``bench/scaling_sim.py``) all use the definitions here.

Definitions (one model, one instant):

* **backlog** = visible messages + in-flight messages of the model's queue. In-flight messages are
  jobs a worker holds (running or about to run), so work in progress counts as load.
* **backlog per worker** = backlog / workers, where workers = running (or starting) workers; with
  no worker it is the backlog itself (so that any backlog reads as "more than one worker's worth").
* **needed workers** = ceil(backlog / target backlog per worker).
* **idle** = no backlog and no busy worker; ``idle_for`` counts the seconds since the model was
  last not idle (the last job seen).

Decision (:func:`decide`), clamped to ``min_workers..max_workers``:

1. backlog > 0: ``max(needed, min(running, needed at target * SCALE_IN_RATIO), busy)``: scale
   out when the backlog per worker exceeds the target; scale in (down to what the backlog needs)
   only when it falls below half the target, and not within ``scale_in_cooldown_seconds`` of the
   last scale-out (as target tracking's scale-in cooldown), so that a fluctuating load does not
   flap and pay worker starts again; never below the busy workers;
2. no backlog, some busy worker: ``busy``;
3. idle for less than ``idle_seconds``: keep the running workers (``running``): a pause shorter
   than the idle period costs no start-up;
4. idle for ``idle_seconds`` or more: ``min_workers`` (0 by default: scale to zero).

The bounds win over rule 1..4 except that the result is never below ``busy``: a busy worker is
never stopped to honour ``max_workers`` (it stops itself when its jobs end). Which workers to stop
is :func:`pick_scale_in`: only idle ones.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, TypeVar

#: CloudWatch namespace, dimension and metric names of the backlog metrics (published by
#: :mod:`asyncinfer.scaling.backlog`; alarms and target tracking in the CDK app read these).
METRIC_NAMESPACE = "asyncinfer"
METRIC_DIMENSION = "Model"
METRIC_BACKLOG = "Backlog"
METRIC_BACKLOG_PER_WORKER = "BacklogPerTask"
METRIC_BACKLOG_WITHOUT_CAPACITY = "BacklogWithoutCapacity"
#: Hysteresis: with backlog, running workers are kept while the backlog per worker is at least
#: this fraction of the target (scale out above the target, in below target * ratio).
SCALE_IN_RATIO = 0.5


@dataclass(frozen=True, kw_only=True)
class ScalingConfig:
    """The policy's knobs.

    Attributes:
        backlog_per_worker: target backlog (visible + in-flight jobs) per worker; above it the
            policy adds workers.
        idle_seconds: how long a model must be idle (no backlog, no busy worker) before it goes
            to ``min_workers``.
        min_workers: floor once idle (0: scale to zero).
        max_workers: ceiling.
        scale_in_cooldown_seconds: while there is backlog, no scale-in within this many seconds
            of the last scale-out (0: none).
    """

    backlog_per_worker: float = 1.0
    idle_seconds: float = 60.0
    min_workers: int = 0
    max_workers: int = 1
    scale_in_cooldown_seconds: float = 0.0

    def __post_init__(self) -> None:
        if self.backlog_per_worker <= 0:
            raise ValueError("backlog_per_worker must be > 0")
        if self.idle_seconds < 0:
            raise ValueError("idle_seconds must be >= 0")
        if not 0 <= self.min_workers <= self.max_workers:
            raise ValueError("need 0 <= min_workers <= max_workers")


@dataclass(frozen=True, kw_only=True)
class Observation:
    """What the policy sees of one model.

    Attributes:
        visible: messages waiting in the queue (ApproximateNumberOfMessages).
        in_flight: messages held by workers (ApproximateNumberOfMessagesNotVisible).
        running: workers running or starting (not those already told to stop).
        busy: workers holding jobs (scale-in protected).
        idle_for: seconds since the model last had backlog or a busy worker.
        since_scale_out: seconds since the worker count last rose (infinity: never).
    """

    visible: int
    in_flight: int
    running: int
    busy: int
    idle_for: float
    since_scale_out: float = math.inf


@dataclass(frozen=True)
class Decision:
    """The policy's answer: ``desired`` workers and a short ``reason`` for logs."""

    desired: int
    reason: str


def backlog(visible: int, in_flight: int) -> int:
    """Backlog: visible plus in-flight messages (work in progress counts as load)."""
    return max(0, visible) + max(0, in_flight)


def backlog_per_worker(visible: int, in_flight: int, workers: int) -> float:
    """Backlog per worker; the backlog itself when there is no worker."""
    b = backlog(visible, in_flight)
    return b / workers if workers > 0 else float(b)


def backlog_without_capacity(visible: int, in_flight: int, workers: int) -> int:
    """1 when there is backlog and no worker (the 0 -> 1 signal), else 0."""
    return 1 if backlog(visible, in_flight) > 0 and workers <= 0 else 0


def needed_workers(visible: int, in_flight: int, target: float) -> int:
    """ceil(backlog / target): workers the backlog needs at ``target`` per worker."""
    return math.ceil(backlog(visible, in_flight) / target)


def is_idle(obs: Observation) -> bool:
    """No backlog and no busy worker."""
    return backlog(obs.visible, obs.in_flight) == 0 and obs.busy == 0


def decide(obs: Observation, cfg: ScalingConfig) -> Decision:
    """The desired worker count for ``obs`` (see the module docstring for the rules)."""
    load = backlog(obs.visible, obs.in_flight)
    busy = max(0, obs.busy)
    if load > 0:
        out = needed_workers(obs.visible, obs.in_flight, cfg.backlog_per_worker)
        keep = needed_workers(obs.visible, obs.in_flight, cfg.backlog_per_worker * SCALE_IN_RATIO)
        if obs.since_scale_out < cfg.scale_in_cooldown_seconds:
            keep = max(keep, obs.running)  # cooling down after a scale-out
        want = max(out, min(max(0, obs.running), keep), busy)
        reason = f"backlog={load}"
    elif busy > 0:
        want, reason = busy, f"busy={busy}"
    elif obs.idle_for < cfg.idle_seconds:
        want, reason = max(0, obs.running), f"idle {obs.idle_for:.0f}s"
    else:
        want, reason = cfg.min_workers, f"idle {obs.idle_for:.0f}s >= {cfg.idle_seconds:g}s"
    desired = max(cfg.min_workers, min(cfg.max_workers, want), busy)
    return Decision(desired, reason)


def desired_workers(obs: Observation, cfg: ScalingConfig) -> int:
    """Just the count of :func:`decide`."""
    return decide(obs, cfg).desired


class WorkerLike(Protocol):
    """What :func:`pick_scale_in` needs of a worker."""

    @property
    def busy(self) -> bool: ...


W = TypeVar("W", bound=WorkerLike)


def pick_scale_in(workers: Sequence[W], count: int) -> list[W]:
    """Up to ``count`` workers to stop: idle ones only, the most recently started first (the
    order of ``workers`` is oldest first). Fewer when not enough are idle; never a busy one."""
    if count <= 0:
        return []
    idle = [w for w in reversed(workers) if not w.busy]
    return idle[:count]
