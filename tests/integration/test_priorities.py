"""Priority classes: high jobs overtake a low backlog, and low jobs still get a share."""

from __future__ import annotations

import time
from collections.abc import Callable

from tests.integration.conftest import Env, WorkerThread


def test_high_overtakes_low_backlog_and_low_still_finishes(
    make_env: Callable[..., Env],
) -> None:
    env = make_env()
    low = [env.submit("echo", {"n": i}, priority="low") for i in range(10)]
    high = [env.submit("echo", {"n": i}, priority="high") for i in range(6)]
    env.events()  # drop the queued events
    with WorkerThread(env.settings, max_batch_size=1):
        for job_id in low + high:
            env.wait_for(job_id, {"succeeded"}, timeout=60)
        time.sleep(0.5)
    started = [e["data"]["id"] for e in env.events() if e["type"] == "job.started"]
    assert sorted(started) == sorted(low + high)
    high_positions = [started.index(j) for j in high]
    low_positions = [started.index(j) for j in low]
    # Submitted after ten low jobs, the high ones all start within the first nine admissions...
    assert max(high_positions) < 9, started
    # ...while the reserved share lets at least one low job start before the last high one.
    assert min(low_positions) < max(high_positions), started
