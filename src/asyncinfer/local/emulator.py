"""The local stack's AWS emulator: a moto server in a process of its own on 127.0.0.1.

``python -m asyncinfer.local.emulator -H 127.0.0.1 -p PORT`` is ``python -m moto.server`` with one
change, for speed only. moto's ``TransactWriteItems`` keeps a deep copy of each table it touches
for its rollback, but takes that copy once per *item* of the call, not once per table: a 64-item
call on a table of 64 jobs copies the table 64 times (about 0.2 s of CPU per call, measured with
moto 5.2.5), and the worker's progress writes are such calls, every second. On the local stack
the emulator shares the workers' cores, so that time came out of decoding.

:func:`patch_transaction_copies` makes the copies of one table within one call the same copy.
moto takes all of them before it applies any item, so they are equal: the rollback restores the
same state as before, and nothing else about the emulator changes. If moto's code no longer has
the shape this relies on (a module-level ``copy`` and a ``Table`` class), the patch does nothing.
"""

from __future__ import annotations

import copy
import subprocess
import sys
import threading
from typing import IO, Any

_local = threading.local()


class _CopyOncePerCall:
    """Stands in for the ``copy`` module inside ``moto.dynamodb.models``: inside a
    ``TransactWriteItems`` call, ``deepcopy`` of a table already copied in that call returns the
    first copy; everything else is ``copy``'s own."""

    def __init__(self, table_type: type) -> None:
        self._table_type = table_type

    def __getattr__(self, name: str) -> Any:
        return getattr(copy, name)

    def deepcopy(self, obj: Any, memo: dict[int, Any] | None = None) -> Any:
        copies: dict[int, Any] | None = getattr(_local, "copies", None)
        if copies is None or not isinstance(obj, self._table_type):
            return copy.deepcopy(obj, memo)
        if id(obj) not in copies:
            copies[id(obj)] = copy.deepcopy(obj, memo)
        return copies[id(obj)]


def patch_transaction_copies() -> bool:
    """Make moto's ``TransactWriteItems`` copy each table once per call (see the module
    docstring). Returns whether the patch applied; idempotent."""
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
        try:
            return original(self, transact_items)
        finally:
            _local.copies = None

    models.copy = _CopyOncePerCall(Table)  # type: ignore[assignment]
    backend.transact_write_items = transact_write_items
    return True


def start_emulator(
    port: int, *, stderr: IO[bytes] | int = subprocess.DEVNULL
) -> subprocess.Popen[bytes]:
    """Start the emulator on ``127.0.0.1:port`` in a new session (Ctrl-C reaches whoever owns it,
    which stops it in order). Returns at once; the caller waits for it to answer."""
    return subprocess.Popen(
        [sys.executable, "-m", "asyncinfer.local.emulator", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=stderr,
        start_new_session=True,
    )


def main(argv: list[str] | None = None) -> None:
    """Patch moto, then run ``moto.server.main`` with ``argv``."""
    from moto import server

    patch_transaction_copies()
    server.main(argv)


if __name__ == "__main__":
    main(sys.argv[1:])
