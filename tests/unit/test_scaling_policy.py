"""The scaling policy's decisions, table-driven (asyncinfer.scaling.policy)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from asyncinfer.scaling.backlog import backlog_point
from asyncinfer.scaling.policy import (
    Observation,
    ScalingConfig,
    backlog_per_worker,
    backlog_without_capacity,
    decide,
    needed_workers,
    pick_scale_in,
)

CFG = ScalingConfig(backlog_per_worker=2, idle_seconds=60, min_workers=0, max_workers=4)


def obs(visible: int = 0, in_flight: int = 0, running: int = 0, busy: int = 0, idle: float = 0):
    return Observation(
        visible=visible, in_flight=in_flight, running=running, busy=busy, idle_for=idle
    )


# (name, observation, config, desired)
CASES = [
    ("at zero, nothing to do", obs(idle=3600), CFG, 0),
    ("at zero, one job arrives: wake to one", obs(visible=1, idle=0), CFG, 1),
    ("backlog 3 at 2 per worker: two workers", obs(visible=3), CFG, 2),
    ("backlog 4 at 2 per worker: two", obs(visible=4, running=2), CFG, 2),
    ("backlog 5: three", obs(visible=5, running=2), CFG, 3),
    ("in-flight work counts as load", obs(in_flight=5, running=3, busy=3), CFG, 3),
    ("visible plus in-flight", obs(visible=3, in_flight=3, running=1, busy=1), CFG, 3),
    ("capped at max_workers", obs(visible=100, running=1), CFG, 4),
    ("scale in when below half the target", obs(visible=1, running=4), CFG, 1),
    ("hysteresis: keep workers above half the target", obs(visible=3, running=3), CFG, 3),
    ("hysteresis: scale in to backlog / (target / 2)", obs(visible=3, running=4), CFG, 3),
    ("never below busy workers", obs(in_flight=3, running=4, busy=3), CFG, 3),
    ("busy workers beat the target", obs(in_flight=3, running=3, busy=3), CFG, 3),
    ("busy with no backlog reported yet", obs(running=2, busy=1), CFG, 1),
    (
        "busy workers beat max_workers",
        obs(in_flight=6, running=6, busy=6),
        ScalingConfig(backlog_per_worker=1, idle_seconds=60, max_workers=4),
        6,
    ),
    ("idle, not long enough: keep the running workers", obs(running=3, idle=10), CFG, 3),
    ("idle one worker, not long enough: keep it", obs(running=1, idle=59.9), CFG, 1),
    ("idle for the idle period: to zero", obs(running=1, idle=60), CFG, 0),
    ("idle for long, several running: to zero", obs(running=4, idle=600), CFG, 0),
    ("idle at zero stays at zero, even right after", obs(running=0, idle=1), CFG, 0),
    (
        "min_workers holds once idle",
        obs(running=3, idle=600),
        ScalingConfig(backlog_per_worker=2, idle_seconds=60, min_workers=1, max_workers=4),
        1,
    ),
    (
        "min_workers holds at start",
        obs(running=0, idle=0),
        ScalingConfig(backlog_per_worker=2, idle_seconds=60, min_workers=2, max_workers=4),
        2,
    ),
    (
        "idle_seconds 0: straight to zero",
        obs(running=2, idle=0),
        ScalingConfig(backlog_per_worker=1, idle_seconds=0, max_workers=2),
        0,
    ),
    (
        "fractional target",
        obs(visible=3),
        ScalingConfig(backlog_per_worker=0.5, idle_seconds=1, max_workers=10),
        6,
    ),
]


@pytest.mark.parametrize(("name", "o", "cfg", "desired"), CASES, ids=[c[0] for c in CASES])
def test_decide(name: str, o: Observation, cfg: ScalingConfig, desired: int) -> None:
    d = decide(o, cfg)
    assert d.desired == desired, (name, d)
    assert d.desired >= o.busy
    assert d.reason


@pytest.mark.parametrize(
    ("visible", "in_flight", "workers", "per_worker", "without"),
    [(0, 0, 0, 0.0, 0), (3, 0, 0, 3.0, 1), (3, 1, 2, 2.0, 0), (0, 2, 0, 2.0, 1), (0, 0, 3, 0, 0)],
)
def test_metric_definitions(
    visible: int, in_flight: int, workers: int, per_worker: float, without: int
) -> None:
    assert backlog_per_worker(visible, in_flight, workers) == per_worker
    assert backlog_without_capacity(visible, in_flight, workers) == without
    # The AWS metric publisher uses the same definitions (tasks = max(running, desired)).
    point = backlog_point(visible=visible, in_flight=in_flight, running=workers, desired=0)
    assert point["BacklogPerTask"] == per_worker
    assert point["BacklogWithoutCapacity"] == without


def test_needed_workers_rounds_up() -> None:
    assert [needed_workers(n, 0, 2) for n in range(6)] == [0, 1, 1, 2, 2, 3]


@pytest.mark.parametrize(
    "kwargs",
    [
        {"backlog_per_worker": 0},
        {"idle_seconds": -1},
        {"min_workers": 3, "max_workers": 2},
        {"min_workers": -1},
    ],
)
def test_config_rejects_nonsense(kwargs: dict) -> None:
    with pytest.raises(ValueError):
        ScalingConfig(**kwargs)


@dataclass
class W:
    name: str
    busy: bool


@pytest.mark.parametrize(
    ("workers", "count", "picked"),
    [
        ([W("a", False), W("b", False), W("c", False)], 2, ["c", "b"]),
        ([W("a", False), W("b", True), W("c", False)], 2, ["c", "a"]),
        ([W("a", True), W("b", True), W("c", False)], 2, ["c"]),
        ([W("a", True), W("b", True)], 1, []),
        ([W("a", False)], 0, []),
        ([W("a", False)], -1, []),
    ],
)
def test_pick_scale_in_never_picks_busy(workers: list[W], count: int, picked: list[str]) -> None:
    chosen = pick_scale_in(workers, count)
    assert [w.name for w in chosen] == picked
    assert not any(w.busy for w in chosen)


def test_never_below_busy_over_random_observations() -> None:
    import random

    rng = random.Random(4)
    for _ in range(2000):
        running = rng.randint(0, 8)
        busy = rng.randint(0, running)
        cfg = ScalingConfig(
            backlog_per_worker=rng.choice([0.5, 1, 2, 5]),
            idle_seconds=rng.choice([0, 5, 60]),
            min_workers=rng.randint(0, 2),
            max_workers=rng.randint(2, 6),
        )
        o = obs(rng.randint(0, 20), rng.randint(0, 10), running, busy, rng.uniform(0, 120))
        d = decide(o, cfg).desired
        assert d >= busy
        assert d >= cfg.min_workers
        assert d <= max(cfg.max_workers, busy)
        if o.visible + o.in_flight > 0:
            assert d >= 1


def test_no_scale_in_with_backlog_during_the_cooldown_after_a_scale_out() -> None:
    from asyncinfer.scaling.policy import Observation, ScalingConfig, decide

    cfg = ScalingConfig(backlog_per_worker=5, max_workers=8, scale_in_cooldown_seconds=900)
    low = {"visible": 1, "in_flight": 1, "running": 4, "busy": 1, "idle_for": 0.0}
    assert decide(Observation(**low, since_scale_out=60), cfg).desired == 4
    assert decide(Observation(**low, since_scale_out=901), cfg).desired == 1
    # The cooldown holds workers while there is backlog; idleness still scales to zero.
    idle = {"visible": 0, "in_flight": 0, "running": 4, "busy": 0, "idle_for": 10_000.0}
    assert decide(Observation(**idle, since_scale_out=60), cfg).desired == 0
