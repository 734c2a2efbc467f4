"""Scaling: the one policy (:mod:`.policy`) and wake-on-submit (:mod:`.wake`)."""

from asyncinfer.scaling.policy import (
    Decision,
    Observation,
    ScalingConfig,
    backlog,
    backlog_per_worker,
    backlog_without_capacity,
    decide,
    desired_workers,
    needed_workers,
    pick_scale_in,
)

__all__ = [
    "Decision",
    "Observation",
    "ScalingConfig",
    "backlog",
    "backlog_per_worker",
    "backlog_without_capacity",
    "decide",
    "desired_workers",
    "needed_workers",
    "pick_scale_in",
]
