"""The generation engine's scheduler alone (no model, no torch): admission by slots and by the
padded token budget, stop conditions from the runner's tokens, aborts, and what an
out-of-memory error does (preempt the newest row; fail only a row that fails alone)."""

from __future__ import annotations

import pytest

from asyncinfer.core.errors import InvalidInput, JobCancelled, OutOfMemory
from asyncinfer.models.engine.request import Request, RequestStatus
from asyncinfer.models.engine.scheduler import Scheduler

EOS = 0


def req(name: str, prompt: int = 4, new: int = 4) -> Request:
    return Request(request_id=name, prompt_ids=[7] * prompt, max_new_tokens=new)


def sched(**kw: int) -> Scheduler:
    return Scheduler(
        max_num_seqs=kw.get("slots", 4), token_budget=kw.get("budget", 1000), eos_ids={EOS}
    )


def test_admits_in_order_within_slots_and_the_padded_budget() -> None:
    s = sched(slots=3, budget=30)
    for r in (req("a"), req("b"), req("c", prompt=6), req("d")):
        s.add_request(r)
    out = s.schedule()
    # a, b: 2 x 8 = 16; with c: 3 x 10 = 30 <= 30; d: no slot left.
    assert [r.request_id for r in out.prefill] == ["a", "b", "c"]
    assert out.decode == [] and [r.request_id for r in s.waiting] == ["d"]
    assert all(r.status is RequestStatus.RUNNING for r in out.prefill)
    nxt = s.schedule()
    assert [r.request_id for r in nxt.decode] == ["a", "b", "c"] and nxt.prefill == []
    with pytest.raises(InvalidInput, match="token budget of 30"):
        s.add_request(req("huge", prompt=20, new=20))


def test_tokens_end_requests_on_eos_and_length_and_free_their_slots() -> None:
    s = sched(slots=2)
    a, b, c = req("a", new=2), req("b", new=5), req("c")
    for r in (a, b, c):
        s.add_request(r)
    out = s.schedule()
    assert s.update_from_output(out, [(a, 5), (b, 6)]) == []
    out = s.schedule()
    done = s.update_from_output(out, [(a, 5), (b, EOS)])
    assert done == [a, b]
    assert (a.status, a.stop_reason) == (RequestStatus.FINISHED_LENGTH_CAPPED, "length")
    assert (b.status, b.stop_reason) == (RequestStatus.FINISHED_STOPPED, "eos")
    out = s.schedule()
    assert out.removed == [a, b] and out.prefill == [c]


def test_stop_check_and_abort() -> None:
    s = Scheduler(
        max_num_seqs=4, token_budget=100, eos_ids={EOS}, stop_check=lambda r: 9 in r.generated
    )
    a, b, c = req("a"), req("b"), req("c")
    for r in (a, b, c):
        s.add_request(r)
    out = s.schedule()
    cancel = JobCancelled("job was cancelled")
    s.finish_requests([b], RequestStatus.FINISHED_ABORTED, cancel)
    assert s.update_from_output(out, [(a, 9), (b, 3), (c, 3)]) == [a]
    assert a.stop_reason == "stop" and b.generated == [] and b.error is cancel
    assert {id(r) for r in s.schedule().removed} == {id(b), id(a)}


def test_out_of_memory_in_a_step_preempts_the_newest_row() -> None:
    s = sched(slots=3)
    a, b, c = req("a"), req("b"), req("c")
    for r in (a, b, c):
        s.add_request(r)
    first = s.schedule()
    s.update_from_output(first, [(a, 5), (b, 5), (c, 5)])
    late = req("late")
    s.add_request(late)
    out = s.schedule()
    assert out.prefill == []  # no slot
    assert s.update_from_output(out, [], error=MemoryError("simulated")) == []
    assert c.status is RequestStatus.PREEMPTED and c.generated == [5] and c.preemptions == 1
    assert list(s.waiting) == [c, late] and s.running == [a, b]
    # Until the batch empties, it may not grow back to the size that failed: 2 x 8 = 16.
    assert s.oom_ceiling == 16
    out = s.schedule()
    assert out.removed == [c] and out.prefill == []
    s.update_from_output(out, [(a, EOS), (b, 6)])
    out = s.schedule()
    assert out.prefill == [c]  # 2 x 8 fits the ceiling again; c prefills its tokens too
    assert c.all_token_ids == [7, 7, 7, 7, 5]


def test_out_of_memory_of_one_row_alone_fails_it() -> None:
    s = sched()
    a = req("a")
    s.add_request(a)
    s.update_from_output(s.schedule(), [(a, 5)])
    done = s.update_from_output(s.schedule(), [], error=MemoryError("simulated"))
    assert done == [a] and a.status is RequestStatus.FINISHED_ERROR
    assert isinstance(a.error, OutOfMemory)
    assert s.oom_ceiling is None and not s.has_unfinished_requests()


def test_out_of_memory_in_a_prefill_waits_beside_running_rows() -> None:
    s = sched()
    a, b, c = req("a"), req("b"), req("c")
    s.add_request(a)
    s.update_from_output(s.schedule(), [(a, 5)])
    s.add_request(b)
    s.add_request(c)
    out = s.schedule()
    assert out.prefill == [b, c]
    err = RuntimeError("DefaultCPUAllocator: can't allocate memory")
    assert s.update_from_output(out, [(a, 6)], error=err, failed=b, not_run=[c]) == []
    assert list(s.waiting) == [b, c] and s.running == [a]
    assert b.status is RequestStatus.PREEMPTED and c.status is RequestStatus.WAITING
    # Alone, a prefill that runs out of memory fails; another error fails only that request.
    s2 = sched()
    d, e = req("d"), req("e")
    s2.add_request(d)
    s2.add_request(e)
    out = s2.schedule()
    bug = ValueError("bad")
    assert s2.update_from_output(out, [], error=bug, failed=d, not_run=[e]) == [d]
    assert d.error is bug and list(s2.waiting) == [e]
