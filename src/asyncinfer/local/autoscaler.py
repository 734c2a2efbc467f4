"""The local autoscaler: :mod:`asyncinfer.scaling.policy` driving worker processes.

Every ``interval`` seconds, per model, it reads the queue's visible and in-flight counts (every
priority queue of the model), the running workers and which of them are busy (each worker
writes ``1``/``0`` to its ``ASYNCINFER_BUSY_FILE`` while it holds jobs / is idle), and how long
the model has been idle; :func:`~asyncinfer.scaling.policy.decide` gives the desired count. It
starts workers up to it, or sends SIGTERM to idle workers down to it (chosen by
:func:`~asyncinfer.scaling.policy.pick_scale_in`: never a busy one); a stopped worker drains and
exits 0 on its own. A worker that dies is forgotten, and the next tick starts another if the
policy still wants it (as ECS replaces a stopped task). Each change of a model's worker count is
printed as one line::

    asyncinfer local: workers model=echo count=2 was=1 desired=2 backlog=3 busy=1 (backlog=3)
"""

from __future__ import annotations

import logging
import math
import signal
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from asyncinfer.local.warm import WorkerProcess
from asyncinfer.scaling.policy import Decision, Observation, ScalingConfig, decide, pick_scale_in

log = logging.getLogger("asyncinfer.local")

#: Consecutive ticks that must want fewer workers before any is stopped.
SCALE_IN_TICKS = 2
#: spawn(model, busy_file) -> a started worker process.
Spawn = Callable[[str, Path], WorkerProcess]
#: queue_counts(model) -> (visible, in_flight).
QueueCounts = Callable[[str], tuple[int, int]]


@dataclass
class LocalWorker:
    """One worker process and its busy file."""

    model: str
    proc: WorkerProcess
    busy_file: Path
    started: float = field(default_factory=time.monotonic)

    @property
    def busy(self) -> bool:
        """True while the worker says it holds jobs (its busy file reads ``1``)."""
        try:
            return self.busy_file.read_text().strip() == "1"
        except OSError:
            return False

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None


class LocalAutoscaler:
    """Runs the scaling policy for each model of the local stack.

    Args:
        models: model ids.
        config: the policy's knobs (``max_workers`` is ``--max-workers``).
        spawn: starts a worker process for a model with a given busy file.
        queue_counts: the model's (visible, in-flight) message counts.
        busy_dir: where busy files go.
        interval: seconds between ticks.
        emit: where count-change lines go (default: print to stdout).
    """

    def __init__(
        self,
        *,
        models: list[str],
        config: ScalingConfig,
        spawn: Spawn,
        queue_counts: QueueCounts,
        busy_dir: Path,
        interval: float = 0.5,
        emit: Callable[[str], None] | None = None,
    ) -> None:
        self.models = models
        self.config = config
        self.spawn = spawn
        self.queue_counts = queue_counts
        self.busy_dir = busy_dir
        self.interval = interval
        self.emit = emit or (lambda line: print(line, flush=True))
        self.workers: dict[str, list[LocalWorker]] = {m: [] for m in models}
        self.draining: list[LocalWorker] = []
        self.last_active: dict[str, float] = {m: time.monotonic() for m in models}
        self.last_scale_out: dict[str, float] = {}
        self.counts: dict[str, int] = {m: 0 for m in models}
        self.scale_in_wanted: dict[str, int] = {m: 0 for m in models}
        self.stop_event = threading.Event()
        self._lock = threading.Lock()
        self._seq = 0
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------ run
    def start(self) -> None:
        """Start ticking in a daemon thread."""
        self.busy_dir.mkdir(parents=True, exist_ok=True)
        self._thread = threading.Thread(target=self._loop, name="autoscaler", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self.stop_event.is_set():
            for model in self.models:
                try:
                    self.tick(model)
                except Exception:
                    if self.stop_event.is_set():
                        return
                    log.exception("autoscaler tick failed for %s", model)
            self.stop_event.wait(self.interval)

    def stop(self, timeout: float = 10.0) -> None:
        """Stop deciding; workers keep running. Waits up to ``timeout`` seconds for the tick in
        progress: no worker is started after this returns, except by a spawn still blocked
        then, whose worker is sent SIGTERM as soon as it starts (see ``_start_worker``)."""
        self.stop_event.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=timeout)

    def processes(self) -> list[WorkerProcess]:
        """Every worker process started and not yet reaped (running and draining)."""
        with self._lock:
            return [w.proc for ws in self.workers.values() for w in ws] + [
                w.proc for w in self.draining
            ]

    # ------------------------------------------------------------------ one decision
    def observe(self, model: str, now: float | None = None) -> Observation:
        """The policy's inputs for ``model`` now (reaps dead workers first)."""
        now = time.monotonic() if now is None else now
        self._reap(model)
        visible, in_flight = self.queue_counts(model)
        workers = self.workers[model]
        busy = sum(1 for w in workers if w.busy)
        if visible + in_flight > 0 or busy > 0:
            self.last_active[model] = now
        return Observation(
            visible=visible,
            in_flight=in_flight,
            running=len(workers),
            busy=busy,
            idle_for=now - self.last_active[model],
            since_scale_out=now - self.last_scale_out.get(model, -math.inf),
        )

    def tick(self, model: str) -> Decision:
        """Observe, decide, and start or stop workers of ``model``."""
        obs = self.observe(model)
        decision = decide(obs, self.config)
        if self.stop_event.is_set():
            return decision
        workers = self.workers[model]
        if decision.desired > len(workers):
            self.last_scale_out[model] = time.monotonic()
            for _ in range(decision.desired - len(workers)):
                self._start_worker(model)
        elif decision.desired < len(workers):
            # Scale in only when two ticks in a row want it: a worker that just took a message
            # writes its busy file a moment later, and the victims are chosen on fresh busy files.
            self.scale_in_wanted[model] += 1
            if self.scale_in_wanted[model] >= SCALE_IN_TICKS:
                self.scale_in_wanted[model] = 0
                for w in pick_scale_in(workers, len(workers) - decision.desired):
                    self._stop_worker(w)
        if decision.desired >= len(workers):
            self.scale_in_wanted[model] = 0
        self._report(model, obs, decision)
        return decision

    def _report(self, model: str, obs: Observation, decision: Decision) -> None:
        count = len(self.workers[model])
        was = self.counts[model]
        if count == was:
            return
        self.counts[model] = count
        self.emit(
            f"asyncinfer local: workers model={model} count={count} was={was} "
            f"desired={decision.desired} backlog={obs.visible + obs.in_flight} "
            f"busy={obs.busy} ({decision.reason})"
        )

    # ------------------------------------------------------------------ processes
    def _start_worker(self, model: str) -> None:
        self._seq += 1
        busy_file = self.busy_dir / f"{model}-{self._seq}.busy"
        busy_file.write_text("0")
        proc = self.spawn(model, busy_file)
        if self.stop_event.is_set():
            # The stack stopped while this spawn waited (a fork server still importing): the
            # stack no longer knows of this worker, so it is stopped here.
            log.info("worker started after stop; stopping it: pid=%s", proc.pid)
            proc.send_signal(signal.SIGTERM)
            return
        with self._lock:
            self.workers[model].append(LocalWorker(model=model, proc=proc, busy_file=busy_file))

    def _stop_worker(self, w: LocalWorker) -> None:
        if w.busy:  # pick_scale_in never returns one; re-checked as close to SIGTERM as can be
            return
        log.info("worker stopping (idle): model=%s pid=%s", w.model, w.proc.pid)
        with self._lock:
            self.workers[w.model].remove(w)
            self.draining.append(w)
        if w.alive:
            w.proc.send_signal(signal.SIGTERM)

    def _reap(self, model: str) -> None:
        with self._lock:
            for w in list(self.workers[model]):
                if not w.alive:
                    log.warning(
                        "worker %s exited with %s; the policy decides on a replacement",
                        w.proc.pid,
                        w.proc.returncode,
                    )
                    self.workers[model].remove(w)
                    w.busy_file.unlink(missing_ok=True)
            for w in list(self.draining):
                if not w.alive:
                    log.info("worker stopped: pid=%s exit=%s", w.proc.pid, w.proc.returncode)
                    self.draining.remove(w)
                    w.busy_file.unlink(missing_ok=True)


def sqs_queue_counts(sqs: Any, queues: Mapping[str, Mapping[str, str]]) -> QueueCounts:
    """A :data:`QueueCounts` summing ``GetQueueAttributes`` over each model's queues
    (``queues``: model -> {priority: url})."""

    def counts(model: str) -> tuple[int, int]:
        visible = in_flight = 0
        for url in queues[model].values():
            a = sqs.get_queue_attributes(
                QueueUrl=url,
                AttributeNames=[
                    "ApproximateNumberOfMessages",
                    "ApproximateNumberOfMessagesNotVisible",
                ],
            )["Attributes"]
            visible += int(a.get("ApproximateNumberOfMessages", 0))
            in_flight += int(a.get("ApproximateNumberOfMessagesNotVisible", 0))
        return visible, in_flight

    return counts
