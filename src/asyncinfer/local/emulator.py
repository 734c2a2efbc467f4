"""The local stack's AWS emulator: a moto server in a process of its own on 127.0.0.1.

``python -m asyncinfer.local.emulator -H 127.0.0.1 -p PORT`` is ``python -m moto.server`` with two
changes to its DynamoDB backend (:func:`patch_dynamodb`) and one to its request parsing
(:func:`patch_put_bodies`); with ``--faults-file`` (tests only) it also answers injected SNS and
S3 faults (:mod:`asyncinfer.local.faults`).

**Item operations one at a time.** moto server answers each request in a thread of its own, and
its DynamoDB backend has no lock: a ``TransactWriteItems`` that is cancelled restores a copy of
the whole table taken before it began, wiping what other requests wrote meanwhile (an
acknowledged PutItem, a job's cancel request), or fails with "dictionary changed size during
iteration" (HTTP 500). DynamoDB isolates both. One re-entrant lock now serialises the backend's
item and transaction operations (:data:`LOCKED`); the emulator was one interpreter anyway.

**Rollback copies of what a call touches.** moto's ``TransactWriteItems`` keeps a deep copy of
each table it touches for its rollback, and took that copy once per *item* of the call: a 64-item
call on a table of 64 jobs copied the table 64 times (about 0.2 s of CPU per call, measured with
moto 5.2.5). Even once per call, the copy grows with the table: with a 2,000-line batch's jobs,
line items and counters in the job table (~6,000 items), every job's start and end transaction
copied all of them, and the emulator shares the workers' cores on the local stack.

:func:`patch_transaction_copies` gives moto, in place of each deep copy of a table, a *snapshot*:
a shallow copy of the table whose item dictionary is a new dictionary holding the same item objects,
except the items the call names (its ``Put`` / ``Update`` / ``Delete`` / ``ConditionCheck`` keys),
which are deep copies. moto takes the snapshots before it applies any item and restores them on
a cancel (``self.tables[name] = snapshot``); an item the call does not name is neither replaced
nor changed by it (the item lock keeps other requests out meanwhile), so the restored table is the
table as it was, as with the whole copy. A table with a stream (none of ours) still gets the whole
copy (its stream records are state too). If moto's code no longer has the shape this relies on
(a module-level ``copy``, a ``Table`` class with ``items``), the patch does nothing.

**Sends without counting the queue.** moto's SQS ``send_message`` (and so each entry of a
``SendMessageBatch``) reads ``queue.attributes`` only for ``ContentBasedDeduplication``, a FIFO
attribute, but that property computes every attribute, the approximate message counts too: a
walk over all the queue's messages with a clock read per message, per message sent. A batch's
2,000 messages in one queue made each send cost ~0.2 s of the emulator's CPU (moto 5.2.5).
:func:`patch_sqs_sends` gives a standard queue's send the attributes without those three counts
(what it reads is the same: a standard queue has no ``ContentBasedDeduplication``); every other
reader, ``GetQueueAttributes`` included, gets them all as before.

**Receives and attribute reads without repeated walks.** moto's ``ReceiveMessage`` checks each
message it hands out against the queue's retention period through ``get_queue_attributes``,
which computes every attribute, the three approximate counts too (a walk over all the queue's
messages with a clock read per message each): with a batch's 2,000 messages queued, that was
most of the emulator's CPU (a profile of the 2,000-line e2e run: ~65%). And one
``GetQueueAttributes`` call for N names computed all attributes about 3N times.
:func:`patch_sqs_reads` reads the retention period from the queue itself and computes the
attributes once per call; what either returns is the same.
"""

from __future__ import annotations

import argparse
import copy
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import IO, Any

from asyncinfer.local import faults, lifeline

_local = threading.local()


class _CopyOncePerCall:
    """Stands in for the ``copy`` module inside ``moto.dynamodb.models``: inside a
    ``TransactWriteItems`` call, ``deepcopy`` of a table returns one snapshot of it per call
    (:func:`_snapshot`: the items the call names copied, the others shared); everything else is
    ``copy``'s own."""

    def __init__(self, table_type: type) -> None:
        self._table_type = table_type

    def __getattr__(self, name: str) -> Any:
        return getattr(copy, name)

    def deepcopy(self, obj: Any, memo: dict[int, Any] | None = None) -> Any:
        copies: dict[int, Any] | None = getattr(_local, "copies", None)
        if copies is None or not isinstance(obj, self._table_type):
            return copy.deepcopy(obj, memo)
        if id(obj) not in copies:
            named: dict[str, set[Any]] = _local.keys
            copies[id(obj)] = _snapshot(obj, named.get(getattr(obj, "name", ""), set()))
        return copies[id(obj)]


def _snapshot(table: Any, hash_keys: set[Any]) -> Any:
    """A rollback copy of moto ``table`` for a call that names ``hash_keys`` (moto
    ``DynamoType`` hash key values): a shallow copy of the table with a new item dictionary, the
    named keys' entries (an item, or a range key's items) deep-copied. A table with a stream, or
    of another shape, is deep-copied whole."""
    items = getattr(table, "items", None)
    if getattr(table, "stream_shard", None) is not None or not isinstance(items, dict):
        return copy.deepcopy(table)
    snap = copy.copy(table)
    snap.items = copy.copy(items)  # the same (default)dict type, the same item objects
    for key in hash_keys:
        if key in items:
            snap.items[key] = copy.deepcopy(items[key])
    return snap


def _named_keys(backend: Any, transact_items: list[dict[str, Any]]) -> dict[str, set[Any]]:
    """``{table name: hash key values}`` the items of a ``TransactWriteItems`` call name (moto
    ``DynamoType``); an item it cannot read is left out (moto then refuses the call before it
    writes anything, or the key does not exist)."""
    from moto.dynamodb.models.dynamo_type import DynamoType

    keys: dict[str, set[Any]] = {}
    for entry in transact_items:
        try:
            op_type, op = next(iter(entry.items()))
            table = backend.tables[op["TableName"]]
            attrs = op["Item"] if op_type == "Put" else op["Key"]
            keys.setdefault(table.name, set()).add(DynamoType(attrs[table.hash_key_attr]))
        except Exception:  # moto validates the call itself
            continue
    return keys


#: The DynamoDB backend's operations that read or write items, serialised by one lock.
LOCKED = (
    "put_item",
    "get_item",
    "query",
    "scan",
    "update_item",
    "delete_item",
    "transact_write_items",
    "transact_get_items",
    "batch_get_item",
    "batch_write_item",
    "execute_statement",
    "execute_transaction",
    "batch_execute_statement",
)
_backend_lock = threading.RLock()


def patch_put_bodies() -> bool:
    """Keep PUT bodies raw in moto server (see the module docstring): werkzeug does not parse
    them as forms, and moto's dispatcher does not read them to guess the service (it read a
    form-typed body as UTF-8 and, when that failed, left the request without its body).
    Returns whether both applied (moto's classes found); idempotent."""
    try:
        from moto.core.request import Request
        from moto.moto_server.werkzeug_app import DomainDispatcherApplication
    except ImportError:
        return False
    read_body = getattr(DomainDispatcherApplication, "_get_body", None)
    if read_body is None or not hasattr(Request, "want_form_data_parsed"):
        return False
    if getattr(Request, "_asyncinfer_raw_puts", False):
        return True
    parsed = Request.want_form_data_parsed

    def want_form_data_parsed(self: Any) -> bool:
        if self.environ.get("REQUEST_METHOD", "").upper() == "PUT":
            return False
        return bool(parsed.__get__(self))

    def get_body(self: Any, environ: dict[str, Any]) -> Any:
        if environ.get("REQUEST_METHOD", "").upper() == "PUT":
            return None  # the service comes from the path (S3) as for any other body
        return read_body(self, environ)

    Request.want_form_data_parsed = property(want_form_data_parsed)  # type: ignore[assignment,method-assign]
    DomainDispatcherApplication._get_body = get_body  # type: ignore[method-assign]
    Request._asyncinfer_raw_puts = True  # type: ignore[attr-defined]
    return True


def patch_sqs_sends() -> bool:
    """Sends to a standard queue without its approximate counts (see the module docstring).
    Returns whether the patch applied (moto's classes found); idempotent."""
    try:
        from moto.sqs import models
    except ImportError:
        return False
    queue, backend = getattr(models, "Queue", None), getattr(models, "SQSBackend", None)
    attributes = getattr(queue, "attributes", None)
    send = getattr(backend, "send_message", None)
    if not isinstance(attributes, property) or attributes.fget is None or send is None:
        return False
    if getattr(send, "_asyncinfer_quick", False):
        return True
    full = attributes.fget
    counts = {a for a in getattr(queue, "BASE_ATTRIBUTES", ()) if a.startswith("Approximate")}

    def quick(self: Any) -> dict[str, Any]:
        cache: dict[int, dict[str, Any]] | None = getattr(_local, "attributes", None)
        if cache is not None:  # inside one GetQueueAttributes call (patch_sqs_reads)
            if id(self) not in cache:
                cache[id(self)] = dict(full(self))
            return dict(cache[id(self)])
        if not getattr(_local, "sending", False) or getattr(self, "fifo_queue", True):
            return dict(full(self))
        out: dict[str, Any] = {}
        for name in self.BASE_ATTRIBUTES:
            if name not in counts:
                value = getattr(self, models.camelcase_to_underscores(name))
                out[name] = str(value).lower() if isinstance(value, bool) else value
        return out

    def send_message(self: Any, *args: Any, **kwargs: Any) -> Any:
        _local.sending = True
        try:
            return send(self, *args, **kwargs)
        finally:
            _local.sending = False

    send_message._asyncinfer_quick = True  # type: ignore[attr-defined]
    queue.attributes = property(quick)  # type: ignore[union-attr]
    backend.send_message = send_message  # type: ignore[union-attr]
    return True


def patch_sqs_reads() -> bool:
    """Receives and attribute reads without walking the queue again and again (see the module
    docstring): the retention check of each received message reads the queue's
    ``MessageRetentionPeriod`` itself, and one ``GetQueueAttributes`` call computes the queue's
    attributes once. Needs :func:`patch_sqs_sends` (applied here); returns whether both applied.
    Idempotent."""
    if not patch_sqs_sends():
        return False
    from moto.sqs import models

    backend = models.SQSBackend
    get_attributes = getattr(backend, "get_queue_attributes", None)
    retained = getattr(backend, "is_message_valid_based_on_retention_period", None)
    if get_attributes is None or retained is None:
        return False
    if getattr(get_attributes, "_asyncinfer_once", False):
        return True

    def get_queue_attributes(self: Any, *args: Any, **kwargs: Any) -> Any:
        _local.attributes = {}
        try:
            return get_attributes(self, *args, **kwargs)
        finally:
            _local.attributes = None

    def is_message_valid_based_on_retention_period(
        self: Any, queue_name: str, message: Any
    ) -> bool:
        period = int(self.get_queue(queue_name).message_retention_period)
        return bool(period + message.sent_timestamp / 1000 > models.unix_time())

    get_queue_attributes._asyncinfer_once = True  # type: ignore[attr-defined]
    backend.get_queue_attributes = get_queue_attributes  # type: ignore[method-assign]
    backend.is_message_valid_based_on_retention_period = (  # type: ignore[method-assign]
        is_message_valid_based_on_retention_period
    )
    return True


def patch_dynamodb() -> bool:
    """Both changes of the module docstring; returns whether both applied. Idempotent."""
    return patch_transaction_copies() and patch_item_lock()


def patch_item_lock() -> bool:
    """Serialise the DynamoDB backend's :data:`LOCKED` operations with one re-entrant lock.
    Returns whether it applied (moto's backend class found); idempotent."""
    try:
        from moto.dynamodb import models
    except ImportError:
        return False
    backend = getattr(models, "DynamoDBBackend", None)
    if backend is None:
        return False
    for name in LOCKED:
        method = getattr(backend, name, None)
        if method is None or getattr(method, "_asyncinfer_locked", False):
            continue
        backend_method: Any = method

        def locked(self: Any, *args: Any, __m: Any = backend_method, **kwargs: Any) -> Any:
            with _backend_lock:
                return __m(self, *args, **kwargs)

        locked._asyncinfer_locked = True  # type: ignore[attr-defined]
        locked.__name__ = name
        setattr(backend, name, locked)
    return True


def patch_transaction_copies() -> bool:
    """Make moto's ``TransactWriteItems`` keep rollback snapshots of what each call names
    instead of whole-table copies (see the module docstring). Returns whether the patch
    applied; idempotent."""
    try:
        from moto.dynamodb import models
        from moto.dynamodb.models.table import Table
    except ImportError:
        return False
    backend = getattr(models, "DynamoDBBackend", None)
    original = getattr(backend, "transact_write_items", None)
    if backend is None or original is None or getattr(models, "copy", None) is not copy:
        return isinstance(getattr(models, "copy", None), _CopyOncePerCall)

    def transact_write_items(self: Any, transact_items: list[dict[str, Any]]) -> Any:
        _local.copies = {}
        _local.keys = _named_keys(self, transact_items)
        try:
            return original(self, transact_items)
        finally:
            _local.copies = None
            _local.keys = {}

    models.copy = _CopyOncePerCall(Table)  # type: ignore[assignment]
    backend.transact_write_items = transact_write_items
    return True


def start_emulator(
    port: int,
    *,
    stderr: IO[bytes] | int = subprocess.DEVNULL,
    faults_file: Path | None = None,
) -> subprocess.Popen[bytes]:
    """Start the emulator on ``127.0.0.1:port`` in a new session (Ctrl-C reaches whoever owns it,
    which stops it in order). Returns at once; the caller waits for it to answer.

    The emulator holds a lifeline to this process (:mod:`asyncinfer.local.lifeline`): if this
    process dies without stopping it, the emulator ends within about a second (through the
    parent-death signal too when started from the main thread, whose end is the process's).

    ``faults_file``: test-only fault injection (:mod:`asyncinfer.local.faults`); off when
    ``None``."""
    hold = ["--lifeline-pid", str(os.getpid())]
    if threading.current_thread() is threading.main_thread():
        hold.append("--lifeline-pdeathsig")
    if faults_file is not None:
        hold += ["--faults-file", str(faults_file)]
    args = [*hold, "-H", "127.0.0.1", "-p", str(port)]
    return subprocess.Popen(
        [sys.executable, "-m", "asyncinfer.local.emulator", *args],
        stdout=subprocess.DEVNULL,
        stderr=stderr,
        start_new_session=True,
    )


def main(argv: list[str] | None = None) -> None:
    """Patch moto (:func:`patch_dynamodb`, :func:`patch_put_bodies`, :func:`patch_sqs_sends`,
    :func:`patch_sqs_reads`;
    with ``--faults-file PATH`` the test-only fault injection of :mod:`asyncinfer.local.faults`),
    then run
    ``moto.server.main`` with the other arguments of ``argv``."""
    from moto import server

    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--faults-file", type=Path, default=None)
    ours, rest = parser.parse_known_args(argv)
    patch_dynamodb()
    patch_put_bodies()
    patch_sqs_reads()  # and patch_sqs_sends
    if ours.faults_file is not None:
        faults.install(ours.faults_file)
    server.main(rest)


def hold_lifeline(argv: list[str]) -> list[str]:
    """Hold a lifeline to ``--lifeline-pid PID`` if ``argv`` has it (SIGTERM ends the emulator
    once that process is gone; ``--lifeline-pdeathsig``: the parent-death signal too, see
    :mod:`asyncinfer.local.lifeline`); returns the other arguments, for moto server."""
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--lifeline-pid", type=int, default=None)
    parser.add_argument("--lifeline-pdeathsig", action="store_true")
    ours, rest = parser.parse_known_args(argv)
    lifeline.hold(
        ours.lifeline_pid, sig=signal.SIGTERM, grace=1.0, pdeathsig=ours.lifeline_pdeathsig
    )
    return rest


if __name__ == "__main__":
    main(hold_lifeline(sys.argv[1:]))
