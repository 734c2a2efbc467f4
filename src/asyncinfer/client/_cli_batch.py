"""``asyncinfer batch``: a JSONL batch file run by the client (one job per line, resumable), or
with ``--server`` an OpenAI batch file run by the service (spec openai.md: upload, create, wait
with a progress bar of ``request_counts``, download the output and error files)."""

from __future__ import annotations

import argparse

from asyncinfer.client._cli_common import (
    EXIT_COMMAND_FAILED,
    EXIT_JOB_FAILED,
    EXIT_OK,
    _client,
    _consoles,
    _print_json,
)


def cmd_batch(args: argparse.Namespace) -> int:
    from asyncinfer.client import read_batch

    if args.server:
        return _server_batch(args)
    out, _ = _consoles()
    read_batch(args.file, args.batch_id)  # check the file before anything is sent
    with _client(args) as client:
        summary = client.submit_batch(
            args.file,
            args.output,
            concurrency=args.concurrency,
            wait=not args.no_wait,
            progress=not args.no_progress and not args.json,
            batch_id=args.batch_id,
        )
    doc = {
        "total": summary.total,
        "succeeded": summary.succeeded,
        "failed": summary.failed,
        "pending": summary.pending,
        "output": str(summary.output),
        "seconds": round(summary.seconds, 3),
    }
    if args.json:
        _print_json(doc)
    else:
        out.print(
            f"{summary.total} lines: {summary.succeeded} succeeded, {summary.failed} failed"
            + (f", {summary.pending} not finished" if summary.pending else "")
            + f" -> {summary.output} ({summary.seconds:.1f} s)",
            markup=False,
            highlight=False,
        )
    return EXIT_OK if summary.ok else EXIT_JOB_FAILED


def _server_batch(args: argparse.Namespace) -> int:
    """``batch --server``: the service runs an OpenAI batch file (spec openai.md)."""
    from pathlib import Path

    from asyncinfer.client._protocol import resolve_config
    from asyncinfer.client.server_batch import ServerBatchError, ServerBatches

    out, err = _consoles()
    cfg = resolve_config(args.url, args.api_key, timeout=args.http_timeout)
    runner = ServerBatches(cfg.base_url, cfg.api_key, timeout=max(60.0, args.http_timeout))
    try:
        result = runner.run(
            Path(args.file),
            Path(args.output),
            errors=Path(args.errors) if args.errors else None,
            endpoint=args.endpoint,
            window=args.completion_window,
            priority=args.priority,
            progress=not args.no_progress and not args.json,
        )
    except ServerBatchError as exc:
        err.print(f"asyncinfer batch: {exc}", markup=False, highlight=False)
        return EXIT_COMMAND_FAILED
    except TimeoutError as exc:
        err.print(f"asyncinfer batch: {exc}", markup=False, highlight=False)
        return EXIT_COMMAND_FAILED
    batch = result.batch
    counts = batch.get("request_counts") or {}
    doc = {
        "batch_id": batch["id"],
        "status": batch["status"],
        "request_counts": counts,
        "errors": batch.get("errors"),
        "output": str(result.output) if result.output else None,
        "error_file": str(result.errors) if result.errors else None,
        "seconds": round(result.seconds, 3),
    }
    if args.json:
        _print_json(doc)
    else:
        out.print(
            f"{batch['id']} {batch['status']}: {counts.get('completed', 0)} of "
            f"{counts.get('total', 0)} completed, {counts.get('failed', 0)} failed"
            + (f" -> {result.output}" if result.output else "")
            + (f", errors -> {result.errors}" if result.errors else ""),
            markup=False,
            highlight=False,
        )
        for e in ((batch.get("errors") or {}).get("data") or [])[:20]:
            err.print(f"  line {e.get('line')}: {e.get('message')}", markup=False)
    return EXIT_OK if result.ok else EXIT_JOB_FAILED
