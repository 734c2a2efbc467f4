"""Batch files: one job request per JSONL line, results to a JSONL file in input order.

Input line (like OpenAI's batch files)::

    {"custom_id": "q1", "model": "echo", "input": {...}, "priority": "low", "metadata": {...}}

Every field but ``custom_id`` is the ``POST /v1/jobs`` body. ``custom_id`` (a string) must be
unique in the file.

Output line, in the order of the input::

    {"custom_id": "q1", "job_id": "job_...", "status": "succeeded", "output": {...},
     "output_url": null, "error": null, "metrics": {...}}

A line the API refused has ``job_id: null``, ``status: "rejected"`` and ``error`` with the API's
``code``, ``message`` and ``details``.

Resuming: each line is submitted with a deterministic idempotency key made from the batch's
identity (the SHA-256 of the file's bytes, or ``batch_id``) and its ``custom_id``. Run the same
file again after an interruption and every line that was submitted gets its existing job back
(the API keeps idempotency keys 24 h); only the others are created. Results are written to
``OUTPUT.partial`` as they complete, and renamed to ``OUTPUT`` once every line is in.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from asyncinfer.client.errors import APIError, ClientError
from asyncinfer.client.models import Job

if TYPE_CHECKING:
    from asyncinfer.client._async import AsyncClient

#: Longest single long-poll while waiting for a batch's jobs, seconds (short enough to see
#: ``running``).
BATCH_POLL_SECONDS = 5.0


class BatchFileError(ClientError, ValueError):
    """The batch file is not valid: a line is not a JSON object, lacks ``custom_id`` or
    ``model``, or repeats a ``custom_id``."""


@dataclass(frozen=True)
class BatchLine:
    """One request of a batch file."""

    index: int
    line_no: int
    custom_id: str
    body: dict[str, Any]
    idempotency_key: str


@dataclass
class BatchSummary:
    """What a batch run did. ``failed`` counts failed, cancelled and expired jobs and refused
    lines; ``pending`` lines whose jobs were not terminal (``wait=False``); ``seconds`` is the
    wall time."""

    total: int
    succeeded: int = 0
    failed: int = 0
    pending: int = 0
    output: Path = field(default_factory=Path)
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        """True when no line failed."""
        return self.failed == 0


def batch_key(identity: str, custom_id: str) -> str:
    """The idempotency key of a line: stable across runs of the same batch."""
    digest = hashlib.sha256(f"{identity}\n{custom_id}".encode()).hexdigest()
    return f"batch-{digest}"


def read_batch(path: str | os.PathLike[str], batch_id: str | None = None) -> list[BatchLine]:
    """Parse and check a batch file. Raises :class:`BatchFileError`, ``OSError``."""
    raw = Path(path).read_bytes()
    identity = batch_id or "sha256:" + hashlib.sha256(raw).hexdigest()
    lines: list[BatchLine] = []
    seen: dict[str, int] = {}
    for n, text in enumerate(raw.decode("utf-8").splitlines(), start=1):
        if not text.strip():
            continue
        try:
            obj = json.loads(text)
        except ValueError as exc:
            raise BatchFileError(f"{path}:{n}: not JSON: {exc}") from None
        if not isinstance(obj, dict):
            raise BatchFileError(f"{path}:{n}: not a JSON object")
        cid = obj.get("custom_id")
        if not isinstance(cid, str) or not cid:
            raise BatchFileError(f"{path}:{n}: custom_id must be a non-empty string")
        if cid in seen:
            raise BatchFileError(f"{path}:{n}: custom_id {cid!r} repeats line {seen[cid]}")
        seen[cid] = n
        if not isinstance(obj.get("model"), str):
            raise BatchFileError(f"{path}:{n}: model must be a string")
        body = {k: v for k, v in obj.items() if k != "custom_id"}
        lines.append(BatchLine(len(lines), n, cid, body, batch_key(identity, cid)))
    return lines


def result_line(custom_id: str, job: Job | None, error: APIError | None = None) -> dict[str, Any]:
    """The output line of one request."""
    if job is None:
        assert error is not None
        return {
            "custom_id": custom_id,
            "job_id": None,
            "status": "rejected",
            "output": None,
            "output_url": None,
            "error": {"code": error.code, "message": error.message, "details": error.details},
            "metrics": None,
        }
    return {
        "custom_id": custom_id,
        "job_id": job.id,
        "status": job.status,
        "output": job.output,
        "output_url": job.output_url,
        "error": job.error.model_dump() if job.error else None,
        "metrics": job.metrics,
    }


class _Tracker:
    """Counts for the progress bar."""

    def __init__(self, total: int, progress: Progress | None) -> None:
        self.total = total
        self.submitted = 0
        self.running: set[int] = set()
        self.done = 0
        self.failed = 0
        self.pending = 0
        self.t0 = time.monotonic()
        self.progress = progress
        self.task = (
            progress.add_task("batch", total=total, stats=self.stats()) if progress else None
        )

    def stats(self) -> str:
        elapsed = max(time.monotonic() - self.t0, 1e-6)
        rate = (self.done + self.failed) / elapsed
        return (
            f"submitted {self.submitted}  running {len(self.running)}  "
            f"[green]done {self.done}[/]  [red]failed {self.failed}[/]  {rate:.1f} jobs/s"
        )

    def update(self) -> None:
        if self.progress is not None and self.task is not None:
            self.progress.update(
                self.task, completed=self.done + self.failed + self.pending, stats=self.stats()
            )


async def run_batch(
    client: AsyncClient,
    path: str | os.PathLike[str],
    output: str | os.PathLike[str],
    *,
    concurrency: int = 8,
    wait: bool = True,
    progress: bool | Console = False,
    batch_id: str | None = None,
    poll: float = BATCH_POLL_SECONDS,
) -> BatchSummary:
    """Submit every line of the JSONL batch file ``path`` and write one result line per input
    line to ``output``, in input order.

    Args:
        concurrency: lines in flight at once (each is submitted, then waited for).
        wait: wait for each job to be terminal (``False``: write the submitted jobs).
        progress: show a rich progress bar on stderr (or on the given console).
        batch_id: the batch's identity for idempotency keys (default: the file's SHA-256), so a
            rerun of the same file finds the jobs it already made.
        poll: longest single long-poll while waiting, seconds.

    Raises:
        BatchFileError: the file is not a valid batch file (nothing is submitted).
        APIConnectionError, APIError: the API could not be reached, or refused a call other than
            a line's submit (e.g. 403); a rerun resumes.
    """
    if concurrency < 1:
        raise ValueError("concurrency must be at least 1")
    lines = read_batch(path, batch_id)
    out = Path(output)
    partial = out.with_name(out.name + ".partial")
    results: list[dict[str, Any] | None] = [None] * len(lines)
    bar: Progress | None = None
    if progress is not False:
        console = progress if isinstance(progress, Console) else Console(stderr=True)
        bar = Progress(
            TextColumn("[bold]batch"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[stats]}"),
            TimeElapsedColumn(),
            console=console,
        )
    tracker = _Tracker(len(lines), bar)
    queue: asyncio.Queue[BatchLine] = asyncio.Queue()
    for line in lines:
        queue.put_nowait(line)

    with partial.open("w", encoding="utf-8") as fh:
        next_write = 0

        def record(line: BatchLine, res: dict[str, Any]) -> None:
            nonlocal next_write
            results[line.index] = res
            while next_write < len(results) and results[next_write] is not None:
                fh.write(json.dumps(results[next_write], ensure_ascii=False) + "\n")
                next_write += 1
            fh.flush()

        def seen(line: BatchLine, job: Job) -> None:
            if job.status == "running":
                tracker.running.add(line.index)
            tracker.update()

        async def one(line: BatchLine) -> None:
            try:
                job = await client.submit(idempotency_key=line.idempotency_key, **line.body)
            except APIError as exc:
                if exc.status in (401, 403):
                    raise
                tracker.failed += 1
                record(line, result_line(line.custom_id, None, exc))
                return
            tracker.submitted += 1
            seen(line, job)
            if wait and not job.is_terminal:
                job = await client.wait(job.id, None, poll=poll, on_update=lambda j: seen(line, j))
            tracker.running.discard(line.index)
            if job.succeeded:
                tracker.done += 1
            elif job.is_terminal:
                tracker.failed += 1
            else:
                tracker.pending += 1
            record(line, result_line(line.custom_id, job))
            tracker.update()

        async def worker() -> None:
            while True:
                try:
                    line = queue.get_nowait()
                except asyncio.QueueEmpty:
                    return
                await one(line)

        if bar is not None:
            bar.start()
        try:
            async with asyncio.TaskGroup() as tg:
                for _ in range(min(concurrency, len(lines)) or 0):
                    tg.create_task(worker())
        except BaseExceptionGroup as group:
            # Surface the first real error (not the group) to callers.
            raise group.exceptions[0] from None
        finally:
            tracker.update()
            if bar is not None:
                bar.stop()
    os.replace(partial, out)
    return BatchSummary(
        total=len(lines),
        succeeded=tracker.done,
        failed=tracker.failed,
        pending=tracker.pending,
        output=out,
        seconds=time.monotonic() - tracker.t0,
    )
