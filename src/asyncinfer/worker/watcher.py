"""The watcher thread: heartbeats (visibility extensions of every held message), progress
writes and cancel checks of running jobs, and the writes and deletes that wait too long for the
handler to come back.

Every heartbeat interval it extends the visibility timeout of every held message
(ChangeMessageVisibilityBatch), so a job that runs longer than the visibility timeout is never
delivered twice, and a held message not yet started stays hidden too. Every
:data:`CANCEL_POLL_SECONDS` it writes the progress of the running jobs (``progress_tokens`` and
the partial output, all jobs in one TransactWriteItems call, each conditional on no cancel
request: a refused write is the cancel signal; a job with no new progress since the last round,
a slow step, has its last count written again as its check) and reads the cancel requests of the
running jobs that have written no progress yet (BatchGetItem). A job that started less than
:data:`CHECK_AFTER_SECONDS` ago is left out of both, so a shorter job costs neither; a cancel
request is still seen at most ``CHECK_AFTER_SECONDS + CANCEL_POLL_SECONDS`` (3 s) after it was
made, and the job stops at its next step.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from asyncinfer.aws.payloads import dumps
from asyncinfer.core import lifecycle
from asyncinfer.jobs.store import JobStore
from asyncinfer.worker.held import SQS_BATCH, HeldMessages, by_queue
from asyncinfer.worker.inflight import Held
from asyncinfer.worker.journal import Journal

log = logging.getLogger("asyncinfer.worker")

#: How often running jobs write progress and are checked for cancel requests, seconds.
CANCEL_POLL_SECONDS = 2.0
#: A job is left out of progress writes and cancel reads until it has run this long, seconds.
CHECK_AFTER_SECONDS = 1.0
#: Terminal records wait for the next take to share its write; the watcher writes those that
#: waited this long (a handler that does not come back for more work), seconds.
PENDING_FLUSH_SECONDS = 1.0


class Watcher:
    """Heartbeat, progress and cancels of one worker's held messages.

    Args:
        store: the job table (progress writes, cancel reads).
        held: the held messages.
        journal: the pending terminal writes (flushed when they waited too long).
        heartbeat_interval: seconds between two visibility extensions.
        visibility_timeout_seconds: what each extension sets, seconds from now.
    """

    def __init__(
        self,
        store: JobStore,
        held: HeldMessages,
        journal: Journal,
        *,
        heartbeat_interval: float,
        visibility_timeout_seconds: float,
    ) -> None:
        self.store = store
        self.held = held
        self.journal = journal
        self.heartbeat_interval = heartbeat_interval
        self.visibility_timeout_seconds = visibility_timeout_seconds

    def start(self) -> threading.Thread:
        """Run :meth:`loop` in a daemon thread (it ends with the process)."""
        t = threading.Thread(target=self.loop, name="watcher", daemon=True)
        t.start()
        return t

    def loop(self) -> None:
        """Heartbeat every ``heartbeat_interval``; :meth:`watch_once` every round."""
        next_beat = time.monotonic() + self.heartbeat_interval
        while True:
            time.sleep(min(CANCEL_POLL_SECONDS, self.heartbeat_interval))
            try:
                if time.monotonic() >= next_beat:
                    next_beat = time.monotonic() + self.heartbeat_interval
                    self.heartbeat()
                self.watch_once()
            except Exception:
                log.exception("heartbeat failed")

    def heartbeat(self) -> None:
        """Extend the visibility timeout of every held message, started or not
        (ChangeMessageVisibilityBatch, queue by queue, 10 a call), and renew the lease of every
        running job (:meth:`renew_leases`). Each call and the renewal are isolated: one queue's
        SQS fault (logged) neither skips the other queues nor the lease renewals, which keep the
        jobs this worker runs from being taken back. Raises nothing."""
        held = self.held.inflight.snapshot()
        for url, group in by_queue(held).items():
            for i in range(0, len(group), SQS_BATCH):
                chunk = group[i : i + SQS_BATCH]
                try:
                    self.held.change_visibility(chunk, self.visibility_timeout_seconds)
                except Exception:
                    log.exception(
                        "heartbeat: visibility of %d messages of %s not extended", len(chunk), url
                    )
        try:
            self.renew_leases(held)
        except Exception:
            log.exception("heartbeat: leases of %d messages' jobs not renewed", len(held))

    def renew_leases(self, held: list[Held]) -> None:
        """Move on the lease of the running jobs among ``held`` (:meth:`JobStore.renew_leases`,
        :mod:`asyncinfer.jobs.leases`). A refused renewal means the job is no longer this worker's
        (the sweeper took it back after its lease lapsed): it is stopped like a cancelled one,
        and its refused terminal write releases its message (:meth:`Journal._finished`)."""
        running = [h for h in held if h.job_id and h.attempts is not None and not h.finished]
        if not running:
            return
        with self.journal.lock:
            refused = self.store.renew_leases([(h.job_id or "", h.attempts or 0) for h in running])
        for h in running:
            if h.job_id in refused:
                h.cancel_event.set()

    def watch_once(self) -> None:
        """One watcher round besides the heartbeat: write the terminal records that waited too
        long for a take, delete the messages whose deletion is due, then write the progress of
        the running jobs that ran at least :data:`CHECK_AFTER_SECONDS`, and read the cancel
        requests of those that wrote none."""
        if self.journal.pending and self.journal.pending_age() >= PENDING_FLUSH_SECONDS:
            self.journal.flush()
        elif self.journal.retrying:
            self.journal.publish()  # events kept by a failed publish (their messages wait)
        self.held.flush_deletes_due()  # a handler busy with one long batch takes nothing meanwhile
        since = time.monotonic() - CHECK_AFTER_SECONDS
        running = [
            h
            for h in self.held.inflight.snapshot()
            if h.attempts is not None and not h.finished and h.started <= since
        ]
        with self.journal.lock:
            reported = self._flush_progress(running)
        # Jobs that wrote progress learnt of a cancel from that write's condition; only the
        # others need a read.
        self._poll_cancels([h for h in running if h.job_id not in reported])

    def _poll_cancels(self, running: list[Held]) -> None:
        if not running:
            return
        records = self.store.get_many(
            [h.job_id for h in running if h.job_id], attributes=("cancel_requested", "status")
        )
        for h in running:
            rec = records.get(h.job_id or "")
            if rec and rec.get("cancel_requested"):
                h.cancel_event.set()

    def _flush_progress(self, running: list[Held]) -> set[str]:
        """Write the progress that handlers reported since the last flush, all jobs in one
        TransactWriteItems call, each conditional on the job still running at its attempt and
        not asked to cancel. A job that reported before but not since (a slow step) has its
        last count written again: the write is its cancel check, in the same call. A job whose
        write is refused gets its cancel event set (it was cancelled, or it is no longer this
        worker's). Returns the ids written or refused: the others need a cancel read."""
        updates = []
        by_id: dict[str, Held] = {}
        for h in running:
            if not h.job_id or h.attempts is None:
                continue
            progress, h.progress = h.progress, None
            fields: dict[str, Any]
            if progress is not None:
                tokens, partial = progress
                fields = {"progress_tokens": tokens}
                if partial:
                    fields["output"] = dumps(partial).decode()
                h.written_tokens = tokens
            elif h.written_tokens is not None:
                fields = {"progress_tokens": h.written_tokens}
            else:
                continue
            updates.append((h.job_id, h.attempts, fields))
            by_id[h.job_id] = h
        if not updates:
            return set()
        refused = self.store.update_fields_many(
            updates, status=lifecycle.RUNNING, unless="cancel_requested"
        )
        for job_id in refused:
            by_id[job_id].cancel_event.set()
        return set(by_id)
