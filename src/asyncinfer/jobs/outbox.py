"""The events outbox (issue 14, behaviour 6): an event whose publish fails is not lost.

Every transition (:mod:`asyncinfer.jobs.transitions`) writes the key of its event into the job
record's ``outbox`` (a string set, :data:`~asyncinfer.jobs.record.OUTBOX_FIELD`) in the same
conditional write, with ``outbox_mark`` / ``outbox_since`` (the sparse GSI ``outbox-index``), and
the submit writes the ``job.queued`` key with the record. Once SNS took the event, the publisher
(:class:`~asyncinfer.jobs.events.EventPublisher`) removes its key: one UpdateItem that removes the
whole outbox when the key is the only one pending (the usual case), else one that deletes the key
from the set. A publish that failed, or a writer that died before it published, leaves the key;
the sweeper (:func:`republish_due`) finds records whose oldest pending event is older than
``Settings.outbox_grace_seconds``, publishes each pending event again and removes its key.

Delivery is at least once: an event may be published twice (a publish that succeeded before a
crash, a slow publisher overtaken by the sweeper). A republished event is rendered from the record
as it is then, with the status of the event's type (a ``job.queued`` republished after the job
started says ``queued``); webhook receivers dedupe on ``webhook-id``. A republished non-terminal
event may arrive after a later event of the same job.

Two exceptions for ``job.started`` (:func:`disposition`): while its attempt runs under a live
lease the event is its worker's (the worker publishes it and the attempt's terminal write clears
the key), so the sweeper leaves it; and once its attempt was handed back (the job is ``queued``
again, or a later attempt started) it is dropped, not republished: the ``job.queued`` of the
hand-back says that attempt is over, and a ``job.started`` after it would say the opposite.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from botocore.exceptions import ClientError

from asyncinfer.jobs.record import (
    LEASE_FIELD,
    OUTBOX_FIELD,
    OUTBOX_INDEX,
    OUTBOX_MARK,
    OUTBOX_MARK_FIELD,
    OUTBOX_SINCE_FIELD,
    JobRecord,
    event_type_of,
    status_of_event,
)

if TYPE_CHECKING:
    from asyncinfer.jobs.events import EventPublisher
    from asyncinfer.jobs.store import JobStore

log = logging.getLogger("asyncinfer.outbox")

#: The expression attribute names of a record's outbox fields (its pending keys, the sparse
#: index's mark, the time the oldest key was added).
OUTBOX_NAMES = {"#ob": OUTBOX_FIELD, "#obm": OUTBOX_MARK_FIELD, "#obs": OUTBOX_SINCE_FIELD}


def pending_keys(record: JobRecord, event_type: str | None = None) -> list[str]:
    """The outbox keys of ``record`` (all, or those of ``event_type``)."""
    keys = record.get(OUTBOX_FIELD) or ()
    return sorted(k for k in keys if event_type is None or event_type_of(k) == event_type)


def clear(store: JobStore, job_id: str, keys: Iterable[str]) -> None:
    """Remove ``keys`` (events now published) from the outbox of ``job_id``. Never raises: a key
    left behind only means the sweeper publishes its event once more."""
    keys = sorted(set(keys))
    if not keys:
        return
    values: dict[str, Any] = {f":k{n}": {"S": k} for n, k in enumerate(keys)}
    has_all = " AND ".join(f"contains(#ob, :k{n})" for n in range(len(keys)))
    try:
        try:
            # The usual case: these are the only pending events; the record leaves the index.
            store.ddb.update_item(
                TableName=store.table,
                Key={"job_id": {"S": job_id}},
                UpdateExpression="REMOVE #ob, #obm, #obs",
                ConditionExpression=f"size(#ob) = :n AND {has_all}",
                ExpressionAttributeNames=OUTBOX_NAMES,
                ExpressionAttributeValues={**values, ":n": {"N": str(len(keys))}},
            )
            return
        except ClientError as exc:
            if exc.response["Error"]["Code"] != "ConditionalCheckFailedException":
                raise
        # Other events pending (or these cleared already): take out only these.
        store.ddb.update_item(
            TableName=store.table,
            Key={"job_id": {"S": job_id}},
            UpdateExpression="DELETE #ob :ks",
            ConditionExpression="attribute_exists(#ob)",
            ExpressionAttributeNames={"#ob": OUTBOX_FIELD},
            ExpressionAttributeValues={":ks": {"SS": keys}},
        )
    except ClientError as exc:
        if exc.response["Error"]["Code"] != "ConditionalCheckFailedException":
            log.warning("outbox of %s not cleared (%s): republished later", job_id, exc)
    except Exception as exc:  # an AWS fault: the sweeper publishes it again, no harm
        log.warning("outbox of %s not cleared (%s): republished later", job_id, exc)


def due(store: JobStore, before_epoch: int, limit: int = 100) -> list[str]:
    """Ids of up to ``limit`` records whose oldest pending event was written before
    ``before_epoch`` (epoch seconds): the ``outbox-index`` GSI, eventually consistent."""
    resp = store.ddb.query(
        TableName=store.table,
        IndexName=OUTBOX_INDEX,
        KeyConditionExpression="#obm = :m AND #obs < :before",
        ExpressionAttributeNames={"#obm": OUTBOX_MARK_FIELD, "#obs": OUTBOX_SINCE_FIELD},
        ExpressionAttributeValues={":m": {"S": OUTBOX_MARK}, ":before": {"N": str(before_epoch)}},
        Limit=limit,
    )
    return [item["job_id"]["S"] for item in resp.get("Items", [])]


def as_of(record: JobRecord, key: str) -> JobRecord:
    """``record`` as the event of ``key`` shows it: its status set to the event's."""
    return {**record, "status": status_of_event(event_type_of(key))}


def disposition(record: JobRecord, key: str, now: float) -> str:
    """What the sweeper does with one pending outbox ``key`` of ``record`` at ``now`` (epoch
    seconds): ``"publish"``, ``"leave"`` (a ``job.started`` of the attempt that runs now, under a
    live lease: its worker's) or ``"drop"`` (a ``job.started`` of an attempt handed back since)."""
    kind, _, attempt = key.partition("#")
    if kind != "job.started":
        return "publish"
    attempts = int(record.get("attempts") or 0)
    status = record.get("status")
    # ``#n``: a start that did not know its count (the worker's); it is the latest attempt's.
    if status == "queued" or (attempt.isdigit() and attempts > int(attempt)):
        return "drop"
    if status == "running" and float(record.get(LEASE_FIELD) or 0) > now:
        return "leave"
    return "publish"


def republish_due(
    store: JobStore,
    events: EventPublisher,
    grace_seconds: float,
    *,
    limit: int = 500,
    budget_seconds: float = 20.0,
) -> int:
    """Publish again the pending events of records whose oldest one is older than
    ``grace_seconds`` (seconds), oldest first, and clear them; at most ``limit`` events and
    ``budget_seconds`` of work per call. Returns how many events were published. A publish that
    fails leaves its key for the next sweep and ends this one (SNS is likely down for every
    event).

    Records whose outbox was emptied by a write that could not know it was the last (a worker's
    terminal write clears its ``job.started`` but leaves the index keys) are only taken out of
    the index here: one UpdateItem each, off the job's path, not counted in ``limit``."""
    published = 0
    seen: set[str] = set()
    deadline = time.monotonic() + budget_seconds
    while published < limit and time.monotonic() < deadline:
        before = int(time.time() - grace_seconds)
        ids = [j for j in due(store, before, 100) if j not in seen]
        if not ids:
            break
        seen.update(ids)
        for job_id in ids:
            record = store.get(job_id)
            if record is None:
                continue
            keys = pending_keys(record)
            if not keys:  # cleared by the key-only path: the record leaves the index now
                _unmark(store, job_id)
                continue
            for key in keys:
                what = disposition(record, key, time.time())
                if what == "leave":
                    continue
                if what == "drop":
                    clear(store, job_id, [key])
                    continue
                try:
                    events.publish(as_of(record, key), keys=[key])
                except Exception:
                    log.exception("pending %s of %s not published; next sweep", key, job_id)
                    return published
                published += 1
    if published:
        log.info("republished %d pending job events", published)
    return published


def _unmark(store: JobStore, job_id: str) -> None:
    """Take a record with no pending events out of the outbox index."""
    try:
        store.ddb.update_item(
            TableName=store.table,
            Key={"job_id": {"S": job_id}},
            UpdateExpression="REMOVE #obm, #obs",
            ConditionExpression="attribute_not_exists(#ob)",
            ExpressionAttributeNames=OUTBOX_NAMES,
        )
    except ClientError as exc:
        if exc.response["Error"]["Code"] != "ConditionalCheckFailedException":
            raise
