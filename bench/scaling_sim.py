"""Scaling simulator (a benchmark, not a test): replays request traces through

(a) asyncinfer's policy (:mod:`asyncinfer.scaling.policy`, evaluated once a minute as the backlog
    Lambda's period) plus wake-on-submit (0 -> 1 at the first submit), and
(b) SageMaker's documented policy for asynchronous endpoints ("Autoscale an asynchronous
    endpoint"): target tracking on ApproximateBacklogSizePerInstance (scale-out alarm: 3 of 3
    one-minute datapoints above target; scale-in alarm: 15 of 15 below 90 % of it; cooldowns
    300 s out / 600 s in, the guide's example), plus the step policy on HasBacklogWithoutCapacity
    (alarm: 2 of 2 one-minute datapoints; +1 instance; cooldown 300 s),

with the same instance start time (boot + image pull + model load) and job service times, and
prints, per trace and policy: GPU-hours (launch to termination), p50/p95/max queue wait (submit
to start) and scale events (changes of the desired count).

    .venv/bin/python bench/scaling_sim.py [--seed 7] [--boot 90 --pull 60 --load 20]
"""

from __future__ import annotations

import argparse
import math
import random
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from asyncinfer.scaling.policy import Observation, ScalingConfig, decide, pick_scale_in

PERIOD = 60  # metric / decision period, seconds


@dataclass
class Instance:
    ready_at: float
    launched: float
    job_end: float = 0.0  # busy until
    draining: bool = False

    def busy_at(self, t: float) -> bool:
        return self.job_end > t

    @property
    def busy(self) -> bool:  # for pick_scale_in (set before each call)
        return self._busy

    _busy: bool = False


@dataclass
class Result:
    gpu_hours: float
    waits: list[float]
    scale_events: int
    unfinished: int

    def pct(self, p: float) -> float:
        if not self.waits:
            return 0.0
        s = sorted(self.waits)
        return s[min(len(s) - 1, math.ceil(p / 100 * len(s)) - 1)]


@dataclass
class Sim:
    arrivals: list[float]
    service: list[float]
    horizon: float
    startup: float
    max_workers: int
    target: float
    instances: list[Instance] = field(default_factory=list)
    desired: int = 0
    scale_events: int = 0
    gpu_seconds: float = 0.0
    queue: deque[tuple[float, float]] = field(default_factory=deque)

    def _queue_len(self, t: float) -> int:
        return len(self.queue)

    def run(self, controller: Callable[[Sim, float, bool], None]) -> Result:
        queue = self.queue
        waits: list[float] = []
        nxt = 0
        t = 0.0
        while t < self.horizon or queue or any(i.busy_at(t) for i in self.instances):
            arrived = False
            while nxt < len(self.arrivals) and self.arrivals[nxt] <= t:
                queue.append((self.arrivals[nxt], self.service[nxt]))
                nxt += 1
                arrived = True
            controller(self, t, arrived)
            self._reconcile(t)
            for inst in self.instances:
                if inst.ready_at <= t and not inst.busy_at(t) and not inst.draining and queue:
                    at, svc = queue.popleft()
                    waits.append(t - at)
                    inst.job_end = t + svc
            # drained instances that finished go away
            for inst in [i for i in self.instances if i.draining and not i.busy_at(t)]:
                self._terminate(inst, t)
            t += 1.0
            if t > self.horizon + 86400:
                break
        for inst in list(self.instances):
            self._terminate(inst, t)
        return Result(self.gpu_seconds / 3600, waits, self.scale_events, len(queue))

    def set_desired(self, n: int) -> None:
        n = max(0, min(self.max_workers, n))
        if n != self.desired:
            self.scale_events += 1
            self.desired = n

    def active(self) -> list[Instance]:
        return [i for i in self.instances if not i.draining]

    def _terminate(self, inst: Instance, t: float) -> None:
        self.gpu_seconds += t - inst.launched
        self.instances.remove(inst)

    def _reconcile(self, t: float) -> None:
        active = self.active()
        for _ in range(self.desired - len(active)):
            self.instances.append(Instance(ready_at=t + self.startup, launched=t))
        if len(active) > self.desired:
            for inst in active:
                inst._busy = inst.busy_at(t)
            surplus = len(active) - self.desired
            victims = pick_scale_in(active, surplus)
            for inst in victims:
                self._terminate(inst, t)
            for inst in [i for i in active if i.busy_at(t)][: surplus - len(victims)]:
                inst.draining = True  # SageMaker may pick a busy one: it finishes, then goes


# ---------------------------------------------------------------------- controllers
def ours(cfg: ScalingConfig) -> Callable[[Sim, float, bool], None]:
    state = {"last_active": 0.0, "last_out": -math.inf}

    def control(sim: Sim, t: float, arrived: bool) -> None:
        if arrived and sim.desired == 0:
            sim.set_desired(1)  # wake on submit
            state["last_out"] = t
        if int(t) % PERIOD:
            return
        visible = sim._queue_len(t)
        active = sim.active()
        busy = sum(1 for i in active if i.busy_at(t))
        if visible or busy:
            state["last_active"] = t
        obs = Observation(
            visible=visible,
            in_flight=busy,
            running=len(active),
            busy=busy,
            idle_for=t - state["last_active"],
            since_scale_out=t - state["last_out"],
        )
        desired = decide(obs, cfg).desired
        if desired > sim.desired:
            state["last_out"] = t
        sim.set_desired(desired)

    return control


def sagemaker(target: float) -> Callable[[Sim, float, bool], None]:
    st = {"points": [], "last_out": -1e9, "last_in": -1e9, "last_step": -1e9}

    def control(sim: Sim, t: float, arrived: bool) -> None:
        if int(t) % PERIOD or t == 0:
            return
        active = sim.active()
        in_service = sum(1 for i in active if i.ready_at <= t)
        backlog = sim._queue_len(t) + sum(1 for i in active if i.busy_at(t))
        per_instance = backlog / in_service if in_service else float(backlog)
        pts: list[tuple[float, int, int]] = st["points"]  # type: ignore[assignment]
        pts.append((per_instance, backlog, in_service))
        cap = sim.desired
        # HasBacklogWithoutCapacity: 2 of 2 datapoints.
        if (
            len(pts) >= 2
            and all(b > 0 and n == 0 for _, b, n in pts[-2:])
            and t - st["last_step"] >= 300  # type: ignore[operator]
        ):
            sim.set_desired(cap + 1)
            st["last_step"] = t
            return
        if cap == 0:
            return  # target tracking cannot leave zero
        if len(pts) >= 3 and all(p > target for p, _, _ in pts[-3:]):
            if t - st["last_out"] >= 300:  # type: ignore[operator]
                new = math.ceil(cap * per_instance / target)
                if new > cap:
                    sim.set_desired(new)
                    st["last_out"] = t
        elif (
            len(pts) >= 15
            and all(p < 0.9 * target for p, _, _ in pts[-15:])
            and t - st["last_in"] >= 600  # type: ignore[operator]
        ):
            new = math.ceil(cap * per_instance / target)
            if new < cap:
                sim.set_desired(new)
                st["last_in"] = t

    return control


# ---------------------------------------------------------------------- traces
def spike(rng: random.Random) -> tuple[list[float], float]:
    """2 h: quiet, then 400 jobs within one minute at 30 min."""
    return sorted(1800 + rng.uniform(0, 60) for _ in range(400)), 7200.0


def diurnal(rng: random.Random) -> tuple[list[float], float]:
    """24 h: Poisson arrivals, rate 0 at night up to 1 job/s at midday."""
    out, t = [], 0.0
    peak = 1.0
    while t < 86400:
        t += rng.expovariate(peak)
        rate = peak * max(0.0, math.sin(math.pi * (t / 86400))) ** 3
        if rng.random() < rate / peak:
            out.append(t)
    return out, 86400.0


def bursty(rng: random.Random) -> tuple[list[float], float]:
    """6 h: bursts every ~20 min (exponential gaps), 20..200 jobs within 30 s each."""
    out, t = [], 0.0
    while True:
        t += rng.expovariate(1 / 1200)
        if t > 21600:
            break
        out += [t + rng.uniform(0, 30) for _ in range(rng.randint(20, 200))]
    return sorted(out), 21600.0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--boot", type=float, default=90, help="instance boot, s")
    ap.add_argument("--pull", type=float, default=60, help="image pull, s")
    ap.add_argument("--load", type=float, default=20, help="model load, s")
    ap.add_argument("--service", type=float, default=4.0, help="mean job run time, s")
    ap.add_argument("--target", type=float, default=5.0, help="backlog per instance target")
    ap.add_argument("--idle", type=float, default=600, help="our idle period, s")
    ap.add_argument("--max-workers", type=int, default=8)
    ap.add_argument(
        "--cooldown", type=float, default=900, help="our scale-in cooldown after a scale-out, s"
    )
    args = ap.parse_args()
    startup = args.boot + args.pull + args.load
    cfg = ScalingConfig(
        backlog_per_worker=args.target,
        idle_seconds=args.idle,
        max_workers=args.max_workers,
        scale_in_cooldown_seconds=args.cooldown,
    )
    print(
        f"start {startup:.0f}s (boot {args.boot:.0f} + pull {args.pull:.0f} + load "
        f"{args.load:.0f}), mean run {args.service:g}s, target {args.target:g}/instance, "
        f"max {args.max_workers}, our idle period {args.idle:.0f}s, our scale-in cooldown "
        f"{args.cooldown:.0f}s, seed {args.seed}\n"
    )
    header = (
        f"| {'trace':<8} | {'policy':<26} | {'jobs':>5} | {'GPU-h':>6} | {'p50 wait':>8} "
        f"| {'p95 wait':>8} | {'max wait':>8} | {'scale events':>12} |"
    )
    print(header)
    print("|" + "|".join("-" * (len(c)) for c in header.split("|")[1:-1]) + "|")
    for name, gen in (("spike", spike), ("diurnal", diurnal), ("bursty", bursty)):
        rng = random.Random(f"{args.seed}-{name}")
        arrivals, horizon = gen(rng)
        service = [rng.expovariate(1 / args.service) for _ in arrivals]
        for label, ctl in (
            ("asyncinfer + wake-on-submit", lambda: ours(cfg)),
            ("SageMaker documented", lambda: sagemaker(args.target)),
        ):
            sim = Sim(arrivals, service, horizon, startup, args.max_workers, args.target)
            r = sim.run(ctl())
            print(
                f"| {name:<8} | {label:<26} | {len(arrivals):>5} | {r.gpu_hours:>6.2f} "
                f"| {r.pct(50):>7.0f}s | {r.pct(95):>7.0f}s | {max(r.waits, default=0):>7.0f}s "
                f"| {r.scale_events:>12} |"
            )


if __name__ == "__main__":
    main()
