"""Lease takeover: a running job whose lease lapsed has no live worker, and is taken back.

A running job holds a lease: ``lease_expires_epoch`` (epoch seconds), set by its ``queued ->
running`` transition and moved on by its worker's heartbeat (:meth:`JobStore.renew_leases`); a
SageMaker job's lease is moved past the longest its endpoint may hold the request once the bridge
has invoked it. A lease that lapsed means the holder is gone (a worker killed, a bridge that died
before it invoked the endpoint, a completion notification that never came). The job is then taken
back in one conditional write, by the rules a worker applies to a lost attempt:

* ``running -> cancelled`` when a cancel was requested (the client asked; running it again would
  only be cancelled at its first step);
* ``running -> failed`` with ``max_attempts`` when ``attempts`` reached ``max_receive_count``
  (the attempts SQS would give its message before the dead-letter queue);
* else ``running -> queued`` at the same attempt, so that the next start is attempt + 1 (the
  spec's "running --> queued (worker lost ...; attempts + 1)").

Each write is conditional on ``running``, on the attempt, and on the lease still lapsed
(:attr:`Transition.lease_lapsed_before`): a worker whose heartbeat renewed it meanwhile keeps its
job, and a worker's late terminal write after the takeover is refused (its condition is
``running`` at its attempt). Either the worker or the takeover wins, never both.

A job taken back after its TTL passed is not ``expired``: ``expired`` is only for jobs that never
started (:meth:`JobStore.expire` requires ``attempts`` 0).
"""

from __future__ import annotations

from asyncinfer.core import lifecycle
from asyncinfer.core.errors import TransitionRefused
from asyncinfer.core.settings_needs import TakeoverConfig
from asyncinfer.jobs.record import LEASE_FIELD, JobRecord
from asyncinfer.jobs.store import JobStore
from asyncinfer.jobs.transitions import takeover

__all__ = ["lease_lapsed", "take_back", "takeover"]


def lease_lapsed(record: JobRecord, now_epoch: int) -> bool:
    """Whether ``record`` is a running job whose lease lapsed before ``now_epoch`` (epoch
    seconds). A running record without a lease (written before leases existed) counts as
    lapsed: nobody renews it."""
    if record.get("status") != lifecycle.RUNNING:
        return False
    lease = record.get(LEASE_FIELD)
    return lease is None or int(lease) < now_epoch


def take_back(
    store: JobStore, record: JobRecord, now_epoch: int, settings: TakeoverConfig
) -> JobRecord | None:
    """Apply :func:`takeover` to ``record`` if its lease lapsed before ``now_epoch``. Returns
    the record after the write (the caller publishes its event), or ``None`` when there was
    nothing to take back: the job is not running, its lease is live, or it moved on meanwhile
    (a renewal, a finish, another takeover: the conditional write was refused)."""
    if not lease_lapsed(record, now_epoch):
        return None
    try:
        return store.apply(takeover(record, now_epoch, settings.max_receive_count))
    except TransitionRefused:
        return None
