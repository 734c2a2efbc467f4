"""A batch's lines turned into jobs a group at a time (the batch expander's part that writes;
:mod:`.expansion` runs it on each chunk's groups side by side).

For a group (at most :data:`~.expansion.GROUP_LINES` lines, a TransactWriteItems' worth):

1. the group's line items that exist are read (:mod:`.batch_lines`: one BatchGetItem);
2. every line's job is checked and built (:meth:`JobService.prepare`: model deployed, input
   valid, size limits, an input over the inline limit given its S3 copy) with its **derived
   id** (:func:`line_job_id`: the batch id and ``custom_id``), before anything is written; a
   line the service refuses (:class:`ApiError`) is counted ``failed`` with the API's error,
   as before (one whose item a run that died wrote with a job id it never made has that id
   taken off), and so is one whose job request breaks a rule the file's validation did not
   check (it made every run of the chunk raise, and the batch never ended);
3. the items of lines not there yet are written, each with its job id (BatchWriteItem, 25 a
   call), before the jobs exist, so that the counter knows a line when its job's event comes;
   an item that is there (a re-run) is never written again, so its ``error_code`` or the
   ``done`` of earlier versions stay and nothing is counted twice; there is no
   ``set_line_job`` round trip any more;
4. the jobs are submitted in bulk (:class:`~asyncinfer.jobs.bulk.BulkSubmitter`: records,
   messages, ``job.queued``, confirms, a few requests per hundred lines): a re-run finds the
   jobs it made by their ids and makes only the missing ones.

In-flight batches of earlier versions (which submitted each line with the idempotency key
:func:`idempotency_key` and then noted its random job id on the line item): a line whose item
names a job keeps that job (nothing is made); a line whose item exists without a job (such a
version died between the item and its note, or a refusal not yet counted) is submitted as
those versions did (:meth:`LineJobs.submit_line`), so its key returns the job made then.

Per line this is about 0.3 AWS requests amortised instead of 9 (``bench/batch_expansion.py``).
"""

from __future__ import annotations

import hashlib
from typing import Any

from pydantic import ValidationError

from asyncinfer.core import topology
from asyncinfer.core.errors import ApiError, Conflict, InternalError, InvalidRequest
from asyncinfer.core.ids import derived_job_id
from asyncinfer.functions.api.schemas import JobRequest
from asyncinfer.jobs.bulk import BulkSubmitter
from asyncinfer.jobs.service import JobService, Prepared
from asyncinfer.models.registry import validation_details
from asyncinfer.openai_api.batch_store import BatchStore


def idempotency_key(batch_id: str, custom_id: str) -> str:
    """The ``Idempotency-Key`` of a line's job as earlier versions submitted it (api.md:
    1..255 characters); now only for lines such a version began (:meth:`LineJobs.submit_line`)."""
    return f"{batch_id}:{hashlib.sha256(custom_id.encode()).hexdigest()[:40]}"


def line_job_id(record: dict[str, Any], custom_id: str) -> str:
    """The job id of the line ``custom_id`` of the batch ``record``: derived from the batch id
    and the custom id (:func:`~asyncinfer.core.ids.derived_job_id`), with the batch's
    ``created_at`` as its ULID time, so every run of the line's chunk names the same job."""
    seed = f"{record['job_id']}\n{custom_id}"
    return derived_job_id(seed, int(record["created_at"]) * 1000)


def line_submit_lease(submit_lease_seconds: int) -> int:
    """How long a line's new job may wait unconfirmed before the expiry sweeper ends it,
    seconds: the batch queue's visibility timeout (AWS: six times the expander's timeout, 30
    min; a chunk whose run failed part way, its messages not all sent or the invocation killed,
    is run again only when its message comes back after that) plus ``submit_lease_seconds``
    (the plain submit's lease, for the re-run's own work)."""
    queue = topology.QUEUES["batches"]
    wait = max(queue.visibility_timeout_seconds or 0, queue.local_visibility_timeout_seconds or 0)
    return wait + submit_lease_seconds


def _request(
    model: str, data: Any, priority: str, ttl: int, batch_id: str, custom_id: str
) -> JobRequest:
    """The job request of a line.

    Raises:
        InvalidRequest: the request breaks a rule of :class:`JobRequest` that the file's
            validation did not check (the line is refused and counted, rather than the group
            raising on every run of its chunk, which left the batch never ending).
    """
    try:
        return JobRequest(
            model=model,
            input=data,
            priority=priority,  # type: ignore[arg-type]
            ttl_seconds=ttl,
            metadata={"batch_id": batch_id, "custom_id": custom_id},
        )
    except ValidationError as exc:
        details = validation_details(exc)
        first = details[0] if details else {"field": "", "message": str(exc)}
        raise InvalidRequest(
            f"the line's job request is invalid: {first['field']}: {first['message']}", details
        ) from None


class LineJobs:
    """Makes the jobs of a batch's lines in ``store`` through ``jobs`` (see the module
    docstring)."""

    def __init__(self, store: BatchStore, jobs: JobService) -> None:
        self.store = store
        self.jobs = jobs
        self.bulk = BulkSubmitter(
            jobs, lease_seconds=line_submit_lease(jobs.settings.submit_lease_seconds)
        )

    def submit_group(
        self,
        record: dict[str, Any],
        priority: str,
        ttl: int,
        ttl_epoch: int,
        group: list[tuple[int, list[Any]]],
    ) -> list[str]:
        """The bulk expansion of a group of lines (see the module docstring): check every
        line's job, write the line items not there yet (with their derived job ids), count the
        refused lines, then submit the jobs in bulk (:class:`BulkSubmitter`). Lines an earlier
        version of the expander began (an item without ``line_job``) go through
        :meth:`submit_line` as they did; lines whose item names another job keep it."""
        batch_id, tenant = record["job_id"], record["owner"]
        items = self.store.line_items.get(batch_id, [entry[1] for _, entry in group])
        made: list[str] = []
        jobs: list[Prepared] = []
        new_items: list[tuple[str, int, int, str | None]] = []
        refused: list[tuple[str, ApiError, str | None]] = []
        legacy: list[list[Any]] = []
        for idx, entry in group:
            number, custom_id, model, data = entry
            job_id = line_job_id(record, custom_id)
            item = items.get(custom_id)
            if item is not None and item.get("line_job") != job_id:
                if item.get("line_job"):  # made by an earlier version: its job stays
                    made.append(str(item["line_job"]))
                elif not item.get("error_code"):  # begun by an earlier version (or refused)
                    legacy.append(entry)
                continue  # an error_code: refused and counted already
            try:
                req = _request(model, data, priority, ttl, batch_id, custom_id)
                jobs.append(self.jobs.prepare(tenant, req, job_id))
            except ApiError as exc:  # refused now (e.g. the model is no longer deployed)
                if item is None:
                    new_items.append((custom_id, idx, number, None))
                elif self.jobs.store.get(job_id) is not None:  # made before the refusal
                    made.append(job_id)
                    continue
                refused.append((custom_id, exc, None if item is None else job_id))
                continue
            if item is None:
                new_items.append((custom_id, idx, number, job_id))
        # The items exist before their jobs can end (the counter needs them).
        self.store.line_items.put(batch_id, new_items, ttl=ttl_epoch)
        for custom_id, err, unmade in refused:
            error = {"code": err.code, "message": err.message}
            self.store.count_refused(record, custom_id, error, unmade=unmade)
        for entry in legacy:
            result = self.submit_line(record, priority, ttl, entry)
            if isinstance(result, BaseException):
                raise result
            if result is not None:
                made.append(result)
        self.bulk.submit(jobs)
        return made + [p.record["job_id"] for p in jobs]

    def submit_line(
        self, record: dict[str, Any], priority: str, ttl: int, entry: list[Any]
    ) -> str | BaseException | None:
        """Submit one line's job and note it on the line; returns the job id, ``None`` where
        the service refused the line now (counted failed with the API's error), or the
        exception that must make the chunk run again."""
        _number, custom_id, model, data = entry
        batch_id, tenant = record["job_id"], record["owner"]
        try:
            req = _request(model, data, priority, ttl, batch_id, custom_id)
            job, _ = self.jobs.submit(
                tenant, req, idempotency_key=idempotency_key(batch_id, custom_id)
            )
        except (InternalError, Conflict) as exc:
            # Conflict: another run holds this line's key right now (a duplicate message).
            return exc
        except ApiError as exc:  # refused now (e.g. the model is no longer deployed)
            self.store.count_refused(record, custom_id, {"code": exc.code, "message": exc.message})
            return None
        except Exception as exc:  # an AWS error: retried with the chunk
            return exc
        self.store.set_line_job(batch_id, custom_id, job["id"])
        return str(job["id"])
