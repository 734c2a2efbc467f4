"""Batched job writes: several jobs' transitions in TransactWriteItems calls, the lease and
progress writes of running jobs, and the record puts and confirms of the bulk submit
(:mod:`asyncinfer.jobs.bulk`) (:class:`BatchWriter`, a base of
:class:`~asyncinfer.jobs.store.JobStore`). Each item keeps the condition it has alone
(:mod:`asyncinfer.jobs.transitions`)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

from botocore.exceptions import ClientError

from asyncinfer.core import lifecycle
from asyncinfer.core.chunks import chunked
from asyncinfer.core.errors import TransitionRefused
from asyncinfer.jobs.record import (
    LEASE_FIELD,
    JobRecord,
    _ser,
    _to_ddb,
    record_from_item,
    refused_record,
    to_item,
)
from asyncinfer.jobs.update import Transition, TransitionOutcome, _refused, _update_params
from asyncinfer.jobs.writer import TransitionWriter

T = TypeVar("T")


class BatchWriter(TransitionWriter):
    """The batched writes of job records (see the module docstring)."""

    def renew_leases(
        self, leases: Iterable[tuple[str, int]], *, seconds: float | None = None
    ) -> set[str]:
        """Move the lease of each running ``(job_id, attempts)`` to ``seconds`` from now
        (default ``Settings.lease_interval``), each write conditional on the job still
        ``running`` at that attempt (:meth:`update_fields_many`: one TransactWriteItems call per
        100 jobs, an UpdateItem for one). Returns the ids refused: jobs that finished, or that
        the sweeper took back because their lease lapsed (no longer the caller's)."""
        until = self.lease_until(seconds)
        updates = [(job_id, attempts, {LEASE_FIELD: until}) for job_id, attempts in leases]
        if not updates:
            return set()
        return self.update_fields_many(updates, status=lifecycle.RUNNING)

    # ------------------------------------------------------------------ transitions
    def transition_many(self, transitions: list[Transition]) -> list[TransitionOutcome]:
        """Apply several transitions of distinct jobs with TransactWriteItems, each still
        conditional on its own status (and attempt) as in :meth:`transition`.

        DynamoDB's limits (API Reference, "TransactWriteItems",
        https://docs.aws.amazon.com/amazondynamodb/latest/APIReference/API_TransactWriteItems.html):
        at most 100 actions per call, their items at most 4 MB in all, and no item targeted by
        more than one action of a call. Calls are cut at 100 transitions and at
        :data:`TRANSACT_BUDGET_BYTES` of estimated item size; a job id given twice is a
        ``ValueError`` (as is a transition the lifecycle does not allow). botocore gives each
        call a ``ClientRequestToken`` (an idempotency token), so its own retries of a call that
        did commit do not apply it twice.

        A transaction is all or nothing: when DynamoDB cancels one, the transitions it names as
        ``ConditionalCheckFailed`` are refused (``CancellationReasons``, with the current
        item through ``ReturnValuesOnConditionCheckFailure=ALL_OLD``) and the others are sent
        again in the next call; after :data:`TRANSACT_ROUNDS` calls, or when the cancellation
        names no reasons, or the call fails otherwise, each remaining transition is written
        alone with :meth:`transition`.

        Returns, in the order given, one outcome per transition: ``None`` when it was applied
        (the record is then ``t.applied_to(record before)``: TransactWriteItems returns no
        item), the :class:`TransitionRefused` when it was refused, or the exception that kept
        it from being written (an AWS fault: it may or may not have been applied).

        A start (``-> running``) written here should carry its lease in ``set_fields``
        (:data:`LEASE_FIELD`: :meth:`lease_until`), so that ``t.applied_to`` shows it; one written
        alone by :meth:`apply` gets one anyway. A start without a lease is not in the
        running-lease index, so the sweeper could not take it back.
        """
        seen: set[str] = set()
        for t in transitions:
            t.check()
            if t.job_id in seen:
                raise ValueError(f"{t.job_id} twice in one transaction")
            seen.add(t.job_id)
        out: list[TransitionOutcome] = [None] * len(transitions)
        for chunk in _transaction_chunks(list(enumerate(transitions)), self._sizes(transitions)):
            todo = chunk
            for _ in range(TRANSACT_ROUNDS):
                if len(todo) == 1:
                    break
                try:
                    todo = self._transact(todo, out)
                except Exception:  # an AWS fault: write them one by one
                    break
                if not todo:
                    break
            for n, t in todo:
                try:
                    self.apply(t)
                except TransitionRefused as exc:
                    # A call that failed may have committed before its answer was lost: a
                    # refusal by a record that already shows this very write is no refusal.
                    out[n] = None if t.shows_applied(refused_record(exc)) else exc
                except Exception as exc:  # the caller decides per job
                    out[n] = exc
        return out

    def _sizes(self, transitions: list[Transition]) -> list[int]:
        return [
            ITEM_BASE_BYTES + len(json.dumps(_update_params(t), default=str)) for t in transitions
        ]

    def _transact(
        self, todo: list[tuple[int, Transition]], out: list[TransitionOutcome]
    ) -> list[tuple[int, Transition]]:
        """One TransactWriteItems call: fills ``out`` for what was decided, returns what must be
        sent again."""
        items = [
            {
                "Update": {
                    "TableName": self.table,
                    **_update_params(t),
                    "ReturnValuesOnConditionCheckFailure": "ALL_OLD",
                }
            }
            for _, t in todo
        ]
        again = []
        for (n, t), r in zip(todo, self._send_transaction(items), strict=False):
            if r.get("Code") == "ConditionalCheckFailed":
                old = r.get("Item")
                out[n] = _refused(t, record_from_item(old) if old else None)
            else:  # "None" (not the cause), TransactionConflict, throttling: send it again
                again.append((n, t))
        return again

    def _send_transaction(self, items: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """One TransactWriteItems call with ``items``. Returns ``[]`` when it committed, else
        DynamoDB's cancellation reasons, one per item in order (``Code``:
        ``ConditionalCheckFailed``, with the item as ``Item`` when ``ALL_OLD`` was asked;
        ``None`` for an item that did not cause the cancellation; ``TransactionConflict``, ...).
        Raises the ``ClientError`` of any other failure, and of a cancellation that does not give
        a reason per item."""
        try:
            self.ddb.transact_write_items(TransactItems=items)
        except ClientError as exc:
            if exc.response["Error"]["Code"] != "TransactionCanceledException":
                raise
            reasons: list[dict[str, Any]] = exc.response.get("CancellationReasons") or []  # type: ignore[assignment]
            if len(reasons) != len(items):
                raise
            return reasons
        return []

    def update_fields_many(
        self,
        updates: list[tuple[str, int, dict[str, Any]]],
        *,
        status: str,
        unless: str | None = None,
    ) -> set[str]:
        """Set fields on several jobs that are still in ``status`` at their attempt (and, with
        ``unless``, do not have that attribute), in one TransactWriteItems call per 100 jobs.
        ``updates`` holds ``(job_id, attempts, fields)``.

        A transaction is all or nothing: when some conditions fail, the others are written again
        in a second transaction. A lone update is an UpdateItem (the same one request, at half
        the write units). Returns the ids whose condition failed.
        """
        refused: set[str] = set()
        sizes = [ITEM_BASE_BYTES + len(json.dumps(fields, default=str)) for _, _, fields in updates]
        for chunk in _transaction_chunks(updates, sizes):
            for _ in range(2):
                if len(chunk) == 1:  # the same one request, at half the write units
                    job_id, attempts, fields = chunk[0]
                    if not self._update_one(job_id, status, attempts, fields, unless):
                        refused.add(job_id)
                    break
                failed = self._transact_updates(chunk, status=status, unless=unless)
                refused |= failed
                chunk = [u for u in chunk if u[0] not in failed]
                if not failed or not chunk:
                    break
        return refused

    def _transact_updates(
        self, chunk: list[tuple[str, int, dict[str, Any]]], *, status: str, unless: str | None
    ) -> set[str]:
        items = []
        for job_id, attempts, fields in chunk:
            names = {"#status": "status"}
            values: dict[str, Any] = {":s": {"S": status}, ":att": {"N": str(attempts)}}
            sets = []
            for n, (k, v) in enumerate(fields.items()):
                names[f"#k{n}"] = k
                values[f":v{n}"] = _ser.serialize(_to_ddb(v))
                sets.append(f"#k{n} = :v{n}")
            cond = "#status = :s AND attempts = :att"
            if unless:
                names["#unless"] = unless
                cond += " AND attribute_not_exists(#unless)"
            items.append(
                {
                    "Update": {
                        "TableName": self.table,
                        "Key": {"job_id": {"S": job_id}},
                        "UpdateExpression": "SET " + ", ".join(sets),
                        "ConditionExpression": cond,
                        "ExpressionAttributeNames": names,
                        "ExpressionAttributeValues": values,
                    }
                }
            )
        try:
            reasons = self._send_transaction(items)
        except ClientError as exc:
            if exc.response["Error"]["Code"] != "TransactionCanceledException":
                raise
            return {  # cancelled without a reason per item: each alone
                job_id
                for job_id, attempts, fields in chunk
                if not self._update_one(job_id, status, attempts, fields, unless)
            }
        return {
            job_id
            for (job_id, _, _), r in zip(chunk, reasons, strict=False)
            if r.get("Code") == "ConditionalCheckFailed"
        }

    def _update_one(
        self, job_id: str, status: str, attempts: int, fields: dict[str, Any], unless: str | None
    ) -> bool:
        return self.update_fields(
            job_id, status=status, attempts=attempts, set_fields=fields, unless=unless
        )

    # ------------------------------------------------------------------ bulk submit
    def create_many(self, records: list[JobRecord]) -> set[str]:
        """Put new job records (each conditional on ``attribute_not_exists(job_id)``, as
        :meth:`create`) in TransactWriteItems calls of up to 100 puts (and
        :data:`TRANSACT_BUDGET_BYTES`); returns the ids that were not put because a record
        with that id exists (or may: see below). A transaction is all or nothing: one cancelled
        because some exist (``CancellationReasons``) is sent again without them
        (:meth:`_transact_rounds`); what is left after that, or after a call that failed
        otherwise (its answer lost), is put one by one (PutItem), and a record such a call did
        commit then shows as existing, which the caller reads back.

        Raises:
            ClientError: a put failed otherwise (the caller runs the submit again).
        """
        existing: set[str] = set()
        sizes = [len(json.dumps(r, default=str)) + 512 for r in records]
        for chunk in _transaction_chunks(records, sizes):
            refused, left = self._transact_rounds(
                chunk,
                lambda r: {
                    "Put": {
                        "TableName": self.table,
                        "Item": to_item(r),
                        "ConditionExpression": "attribute_not_exists(job_id)",
                    }
                },
            )
            existing.update(r["job_id"] for r in refused)
            for r in left:  # one by one: which exist
                try:
                    self.create(r)  # type: ignore[attr-defined]
                except ClientError as exc:
                    if exc.response["Error"]["Code"] != "ConditionalCheckFailedException":
                        raise
                    existing.add(r["job_id"])
        return existing

    def confirm_many(self, confirms: list[tuple[str, int, str | None]]) -> None:
        """End the submit of several jobs once their messages are sent, as
        :meth:`confirm_submitted` does for one, in TransactWriteItems calls of up to 100
        updates. Each of ``confirms`` is ``(job_id, expires_epoch, published)``: with
        ``published`` (the outbox key of its ``job.queued``, published already) the same write
        removes the outbox, on the condition that this key is its only pending event (as
        :func:`asyncinfer.jobs.outbox.clear` does first). The updates a transaction's
        cancellation names as refused (a worker started the job and added its ``job.started``
        key) are written alone, :meth:`confirm_submitted` then
        :func:`~asyncinfer.jobs.outbox.clear` (which takes out only ``job.queued``); the others
        are sent again in a transaction (:meth:`_transact_rounds`).

        Raises:
            ClientError: a confirm failed (the caller runs the submit again).
        """
        from asyncinfer.jobs import outbox

        for chunk in _transaction_chunks(confirms, [256] * len(confirms)):
            refused, left = self._transact_rounds(chunk, lambda c: self._confirm_item(*c))
            for job_id, expires_epoch, key in refused + left:
                self.confirm_submitted(job_id, expires_epoch)  # type: ignore[attr-defined]
                if key is not None:
                    outbox.clear(self, job_id, [key])  # type: ignore[arg-type]

    def _transact_rounds(
        self, chunk: list[T], build: Callable[[T], dict[str, Any]]
    ) -> tuple[list[T], list[T]]:
        """Write ``chunk`` (one TransactWriteItems call's worth; ``build`` makes an entry's
        action) all together: a cancelled call is sent again without the entries it names as
        ``ConditionalCheckFailed``, up to :data:`TRANSACT_ROUNDS` calls. Returns ``(refused,
        left)``: the entries refused, and those not written (a lone entry, a call that failed
        otherwise, rounds spent), which the caller writes alone."""
        refused: list[T] = []
        todo = chunk
        for _ in range(TRANSACT_ROUNDS):
            if len(todo) <= 1:
                break
            try:
                reasons = self._send_transaction([build(e) for e in todo])
            except ClientError:
                break
            if not reasons:
                return refused, []
            refused += [e for e, r in zip(todo, reasons, strict=True) if _failed(r)]
            todo = [e for e, r in zip(todo, reasons, strict=True) if not _failed(r)]
        return refused, todo

    def _confirm_item(self, job_id: str, expires_epoch: int, key: str | None) -> dict[str, Any]:
        update: dict[str, Any] = {
            "TableName": self.table,
            "Key": {"job_id": {"S": job_id}},
            "UpdateExpression": "SET expires_epoch = :e REMOVE submitting_until",
            "ConditionExpression": "attribute_exists(job_id)",
            "ExpressionAttributeValues": {":e": {"N": str(expires_epoch)}},
        }
        if key is not None:
            update["UpdateExpression"] += ", #ob, #obm, #obs"
            update["ConditionExpression"] += " AND size(#ob) = :one AND contains(#ob, :k)"
            from asyncinfer.jobs.outbox import OUTBOX_NAMES  # outbox imports this module

            update["ExpressionAttributeNames"] = dict(OUTBOX_NAMES)
            update["ExpressionAttributeValues"].update({":one": {"N": "1"}, ":k": {"S": key}})
        return {"Update": update}


#: TransactWriteItems: at most 100 actions a call (DynamoDB API Reference, "TransactWriteItems").
TRANSACT_MAX_ITEMS = 100
#: ... and their items at most 4 MB in all (same page); calls are cut well below, at this many
#: bytes of estimated item size.
TRANSACT_BUDGET_BYTES = 3 * 1024 * 1024
#: Estimated size of a job record apart from what a write sets: ids, times, ``metadata`` (at
#: most 2 KB), ``webhook`` (a URL of at most 2 KB) and the rest.
ITEM_BASE_BYTES = 6 * 1024
#: Calls :meth:`JobStore.transition_many` makes before it writes what is left one by one.
TRANSACT_ROUNDS = 3


def _failed(reason: dict[str, Any]) -> bool:
    """Whether a cancellation reason names its action's condition as failed."""
    return reason.get("Code") == "ConditionalCheckFailed"


def _transaction_chunks(items: list[T], sizes: list[int]) -> list[list[T]]:
    """``items`` cut into TransactWriteItems calls (:data:`TRANSACT_MAX_ITEMS`,
    :data:`TRANSACT_BUDGET_BYTES`)."""
    return chunked(items, sizes, max_items=TRANSACT_MAX_ITEMS, max_bytes=TRANSACT_BUDGET_BYTES)
