"""The client subcommands of ``asyncinfer``: ``submit``, ``get``, ``wait``, ``cancel``, ``ls``,
``batch``, ``models``, ``webhook-secret``, ``verify-webhook``.

Human output (rich) by default, ``--json`` for scripts. Exit codes: 0 ok; 1 the job failed, was
cancelled or expired (or some batch line did; or a webhook failed verification); 2 usage error
(bad arguments, no URL or key configured, an invalid batch file); 3 the command failed (an HTTP
error, the API unreachable, ``wait`` timed out).

The job commands are here, ``batch`` in :mod:`asyncinfer.client._cli_batch`, the webhook ones in
:mod:`asyncinfer.client._cli_webhooks`, what they share in :mod:`asyncinfer.client._cli_common`;
the argument parsers of all of them in :func:`add_commands`.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from typing import Any

from asyncinfer.client._cli_batch import cmd_batch
from asyncinfer.client._cli_common import (
    EXIT_COMMAND_FAILED,
    EXIT_JOB_FAILED,
    EXIT_OK,
    EXIT_USAGE,
    UsageError,
    _client,
    _consoles,
    _print_json,
    _read_arg,
)
from asyncinfer.client._cli_webhooks import cmd_verify_webhook, cmd_webhook_secret

__all__ = [
    "EXIT_COMMAND_FAILED",
    "EXIT_JOB_FAILED",
    "EXIT_OK",
    "EXIT_USAGE",
    "UsageError",
    "add_commands",
    "cmd_batch",
    "cmd_cancel",
    "cmd_get",
    "cmd_ls",
    "cmd_models",
    "cmd_submit",
    "cmd_verify_webhook",
    "cmd_wait",
    "cmd_webhook_secret",
]


# ---------------------------------------------------------------------------- helpers
def _job_json(job: Any) -> Any:
    return job.model_dump(mode="json")


def _exit_for(job: Any) -> int:
    return EXIT_JOB_FAILED if job.status in ("failed", "cancelled", "expired") else EXIT_OK


def _render_output(out: Any, output_url: str | None, console: Any) -> None:
    if isinstance(out, dict) and isinstance(out.get("text"), str):
        console.print(out["text"], markup=False, highlight=False)
    elif out is not None:
        console.print_json(json.dumps(out, default=str))
    elif output_url:
        console.print(f"output: {output_url}", markup=False)


def _render_job(job: Any, console: Any, err: Any) -> None:
    from rich.table import Table

    colour = {"succeeded": "green", "failed": "red", "expired": "red", "cancelled": "yellow"}
    t = Table.grid(padding=(0, 2))
    t.add_column(style="bold")
    t.add_column()
    t.add_row("id", job.id)
    t.add_row("status", f"[{colour.get(job.status, 'cyan')}]{job.status}[/]")
    t.add_row("model", job.model)
    t.add_row("attempts", str(job.attempts))
    for name in ("created_at", "started_at", "completed_at"):
        value = getattr(job, name)
        if value is not None:
            t.add_row(name.replace("_at", ""), value.isoformat())
    if job.metrics:
        t.add_row(
            "metrics",
            "  ".join(f"{k}={v:.3f}" for k, v in job.metrics.items() if v is not None),
        )
    if job.progress:
        t.add_row("progress", json.dumps(job.progress))
    if job.metadata:
        t.add_row("metadata", json.dumps(job.metadata))
    if job.error is not None:
        t.add_row("error", f"[red]{job.error.code}[/]: {job.error.message}")
    console.print(t)
    if job.output is not None or job.output_url:
        console.rule("output", style="dim")
        _render_output(job.output, job.output_url, console)


def _wait_with_spinner(client: Any, job_id: str, timeout: float | None, err: Any) -> Any:
    with err.status(f"waiting for {job_id}") as status:

        def update(job: Any) -> None:
            status.update(f"waiting for {job.id} ({job.status}, attempt {job.attempts})")

        return client.wait(job_id, timeout, on_update=update)


# ---------------------------------------------------------------------------- commands
def cmd_submit(args: argparse.Namespace) -> int:
    out, err = _consoles()
    if (args.input is None) == (args.input_url is None):
        raise UsageError("give exactly one of --input or --input-url")
    inp: Any = None
    if args.input is not None:
        text = _read_arg(args.input)
        try:
            inp = json.loads(text)
        except ValueError as exc:
            raise UsageError(f"--input is not valid JSON: {exc}") from None
    metadata: dict[str, str] | None = None
    if args.metadata:
        metadata = {}
        for item in args.metadata:
            k, sep, v = item.partition("=")
            if not sep or not k:
                raise UsageError(f"--metadata wants KEY=VALUE, got {item!r}")
            metadata[k] = v
    webhook: dict[str, Any] | None = None
    if args.webhook:
        webhook = {"url": args.webhook}
        if args.webhook_events:
            webhook["events"] = [e.strip() for e in args.webhook_events.split(",") if e.strip()]
    with _client(args) as client:
        input_url = args.input_url
        if args.upload and inp is not None:
            input_url, inp = client.upload(json.dumps(inp).encode()), None
        job = client.submit(
            args.model,
            inp,
            input_url=input_url,
            priority=args.priority,
            ttl_seconds=args.ttl,
            timeout_seconds=args.run_timeout,
            webhook=webhook,
            metadata=metadata,
            idempotency_key=args.idempotency_key,
        )
        if not args.wait:
            if args.json:
                _print_json(_job_json(job))
            else:
                out.print(job.id, markup=False, highlight=False)
            return EXIT_OK
        err.print(f"submitted {job.id}", markup=False, highlight=False)
        job = _wait_with_spinner(client, job.id, args.wait_timeout, err)
    if args.json:
        _print_json(_job_json(job))
    elif job.succeeded:
        _render_output(job.output, job.output_url, out)
    else:
        _render_job(job, err, err)
    return _exit_for(job)


def cmd_get(args: argparse.Namespace) -> int:
    out, err = _consoles()
    with _client(args) as client:
        job = client.get(args.job_id)
    if args.json:
        _print_json(_job_json(job))
    else:
        _render_job(job, out, err)
    return _exit_for(job)


def cmd_wait(args: argparse.Namespace) -> int:
    out, err = _consoles()
    with _client(args) as client:
        if args.json:
            job = client.wait(args.job_id, args.timeout)
        else:
            job = _wait_with_spinner(client, args.job_id, args.timeout, err)
    if args.json:
        _print_json(_job_json(job))
    else:
        _render_job(job, out, err)
    return _exit_for(job)


def cmd_cancel(args: argparse.Namespace) -> int:
    out, _ = _consoles()
    with _client(args) as client:
        job = client.cancel(args.job_id)
    if args.json:
        _print_json(_job_json(job))
    elif job.status == "cancelled":
        out.print(f"{job.id} cancelled", markup=False, highlight=False)
    else:
        out.print(
            f"{job.id} is {job.status}: the worker stops it at its next step",
            markup=False,
            highlight=False,
        )
    return EXIT_OK


def cmd_ls(args: argparse.Namespace) -> int:
    out, _ = _consoles()
    with _client(args) as client:
        jobs = list(
            client.list(
                status=args.status,
                model=args.model,
                page_size=min(100, max(1, args.limit or 100)),
                limit=args.limit or None,
            )
        )
    if args.json:
        _print_json([_job_json(j) for j in jobs])
        return EXIT_OK
    from rich.table import Table

    t = Table(box=None)
    t.add_column("id", no_wrap=True, min_width=30)
    for name in ("status", "model", "created"):
        t.add_column(name, no_wrap=True)
    for j in jobs:
        t.add_row(
            j.id,
            j.status,
            j.model,
            j.created_at.strftime("%Y-%m-%d %H:%M:%S") if j.created_at else "",
        )
    out.print(t)
    return EXIT_OK


def cmd_models(args: argparse.Namespace) -> int:
    out, _ = _consoles()
    with _client(args) as client:
        models = client.models()
    if args.json:
        _print_json([m.model_dump(mode="json") for m in models])
        return EXIT_OK
    from rich.table import Table

    t = Table("id", "task", "max batch", box=None)
    for m in models:
        t.add_row(m.id, m.task or "", str(m.max_batch_size or ""))
    out.print(t)
    return EXIT_OK


# ---------------------------------------------------------------------------- wiring
def _run(fn: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    def wrapped(args: argparse.Namespace) -> int:
        from asyncinfer.client import (
            APIConnectionError,
            APIError,
            BatchFileError,
            ConfigurationError,
            WaitTimeout,
        )

        def fail(code: int, kind: str, msg: str, extra: dict[str, Any] | None = None) -> int:
            if getattr(args, "json", False):
                doc = {"error": {"kind": kind, "message": msg, **(extra or {})}}
                sys.stderr.write(json.dumps(doc) + "\n")
            else:
                sys.stderr.write(f"asyncinfer {args.command}: {msg}\n")
            return code

        try:
            return fn(args)
        except (UsageError, ConfigurationError, BatchFileError) as exc:
            return fail(EXIT_USAGE, "usage", str(exc))
        except APIError as exc:
            return fail(
                EXIT_COMMAND_FAILED,
                "api",
                str(exc),
                {"code": exc.code, "status": exc.status, "details": exc.details},
            )
        except (APIConnectionError, WaitTimeout) as exc:
            return fail(EXIT_COMMAND_FAILED, type(exc).__name__, str(exc))
        except OSError as exc:
            return fail(EXIT_COMMAND_FAILED, "os", str(exc))
        except KeyboardInterrupt:
            return fail(130, "interrupted", "interrupted")

    return wrapped


def add_commands(sub: Any) -> None:
    """Add the client subcommands to the ``asyncinfer`` parser's subparsers."""
    common = argparse.ArgumentParser(add_help=False)
    g = common.add_argument_group("connection")
    g.add_argument("--url", default=None, help="API URL (ASYNCINFER_URL, or local.json)")
    g.add_argument("--api-key", default=None, help="API key (ASYNCINFER_API_KEY, or local.json)")
    g.add_argument(
        "--http-timeout", type=float, default=30.0, metavar="S", help="per request, seconds (30)"
    )
    common.add_argument("--json", action="store_true", help="machine-readable output")

    def add(name: str, fn: Callable[[argparse.Namespace], int], help: str) -> Any:
        p = sub.add_parser(name, parents=[common], help=help, description=help)
        p.set_defaults(func=_run(fn))
        return p

    p = add("submit", cmd_submit, "submit a job; print its id (or, with --wait, its output)")
    p.add_argument("model", help="model id (see: asyncinfer models)")
    p.add_argument("--input", "-i", help="input JSON, @FILE, or - for stdin")
    p.add_argument("--input-url", help="s3:// input instead of --input")
    p.add_argument("--upload", action="store_true", help="upload --input, submit its input_url")
    p.add_argument("--priority", choices=["high", "normal", "low"])
    p.add_argument("--ttl", type=int, metavar="S", help="seconds queued before it expires")
    p.add_argument("--run-timeout", type=int, metavar="S", help="max seconds per attempt")
    p.add_argument("--webhook", metavar="URL", help="POST signed events to URL")
    p.add_argument("--webhook-events", metavar="A,B", help="event types (default: terminal)")
    p.add_argument("--metadata", action="append", metavar="K=V", help="repeatable")
    p.add_argument("--idempotency-key", help="default: a new uuid4")
    p.add_argument("--wait", action="store_true", help="wait for the job and print its output")
    p.add_argument("--wait-timeout", type=float, metavar="S", help="with --wait: give up after S")

    p = add("get", cmd_get, "show a job")
    p.add_argument("job_id")

    p = add("wait", cmd_wait, "wait until a job is finished, then show it")
    p.add_argument("job_id")
    p.add_argument("--timeout", type=float, metavar="S", help="give up after S seconds (exit 3)")

    p = add("cancel", cmd_cancel, "cancel a job")
    p.add_argument("job_id")

    p = add("ls", cmd_ls, "list your jobs, newest first")
    p.add_argument("--status", help="only this status")
    p.add_argument("--model", help="only this model")
    p.add_argument("--limit", type=int, default=20, help="at most N jobs (20; 0: all)")

    p = add("batch", cmd_batch, "run a JSONL batch file (resumable: rerun the same command)")
    p.add_argument("file", help="JSONL: one {custom_id, model, input, ...} per line")
    p.add_argument("-o", "--output", required=True, help="results JSONL, in input order")
    p.add_argument("--concurrency", type=int, default=8, help="lines in flight (8)")
    p.add_argument("--no-wait", action="store_true", help="only submit; do not wait")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--batch-id", help="identity for idempotency keys (default: file SHA-256)")
    s = p.add_argument_group("server-side mode (an OpenAI batch file, run by the service)")
    s.add_argument(
        "--server",
        action="store_true",
        help="upload FILE (OpenAI batch lines) to /openai/v1, run it there, download the results",
    )
    s.add_argument("--endpoint", help="the batch's endpoint (default: the first line's url)")
    s.add_argument("--completion-window", default="24h", help="24h, or Nm / Nh (1m..72h)")
    s.add_argument("--priority", choices=["high", "normal", "low"], help="default low")
    s.add_argument("--errors", metavar="FILE", help="error file (default: OUTPUT.errors.jsonl)")

    add("models", cmd_models, "list the deployed models")
    p = add("webhook-secret", cmd_webhook_secret, "print your webhook signing secret (whsec_...)")
    p.add_argument("--rotate", action="store_true", help="make a new one (old valid 24 h)")

    p = add("verify-webhook", cmd_verify_webhook, "verify a webhook request (exit 0 valid, 1 not)")
    p.add_argument("request", nargs="?", help="a raw HTTP request file (headers, blank, body)")
    p.add_argument("--secret", help="whsec_ secret (ASYNCINFER_WEBHOOK_SECRET; else the API)")
    p.add_argument("-H", "--header", action="append", metavar="'NAME: VALUE'")
    p.add_argument("--headers", metavar="FILE", help="JSON object or 'Name: value' lines")
    p.add_argument("--body", metavar="FILE", help="the raw body (- for stdin)")
    p.add_argument(
        "--no-timestamp-check", action="store_true", help="accept old timestamps (recordings)"
    )
