"""What every client subcommand of ``asyncinfer`` shares: exit codes, :class:`UsageError`, the
consoles, the client from the connection options, JSON output and ``@file`` arguments."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

EXIT_OK = 0
EXIT_JOB_FAILED = 1
EXIT_USAGE = 2
EXIT_COMMAND_FAILED = 3


class UsageError(Exception):
    """Bad arguments that argparse cannot see (exit 2)."""


# ---------------------------------------------------------------------------- helpers
def _consoles() -> tuple[Any, Any]:
    from rich.console import Console

    return Console(soft_wrap=True), Console(stderr=True, soft_wrap=True)


def _client(args: argparse.Namespace) -> Any:
    from asyncinfer.client import Client

    return Client(args.url, args.api_key, timeout=args.http_timeout)


def _print_json(obj: Any) -> None:
    sys.stdout.write(json.dumps(obj, indent=2, ensure_ascii=False, default=str) + "\n")
    sys.stdout.flush()


def _read_arg(value: str) -> str:
    """``@path`` reads a file, ``-`` (or ``@-``) stdin, anything else is the value itself."""
    if value in ("-", "@-"):
        return sys.stdin.read()
    if value.startswith("@"):
        try:
            return Path(value[1:]).read_text(encoding="utf-8")
        except OSError as exc:
            raise UsageError(f"cannot read {value[1:]}: {exc.strerror}") from None
    return value
