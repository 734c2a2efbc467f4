"""``asyncinfer webhook-secret`` (print or rotate the signing secret) and
``asyncinfer verify-webhook`` (check a recorded webhook request against it)."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from asyncinfer.client._cli_common import (
    EXIT_JOB_FAILED,
    EXIT_OK,
    UsageError,
    _client,
    _consoles,
    _print_json,
    _read_arg,
)


def cmd_webhook_secret(args: argparse.Namespace) -> int:
    out, _ = _consoles()
    with _client(args) as client:
        secret = client.rotate_webhook_secret() if args.rotate else client.webhook_secret()
    if args.json:
        _print_json(secret.model_dump(mode="json"))
    else:
        out.print(secret.secret, markup=False, highlight=False)
        if secret.previous_secret:
            until = secret.previous_expires_at.isoformat() if secret.previous_expires_at else "?"
            err = _consoles()[1]
            err.print(
                f"previous secret (valid until {until}): {secret.previous_secret}",
                markup=False,
                highlight=False,
            )
    return EXIT_OK


def _parse_header_lines(text: str) -> dict[str, str]:
    headers: dict[str, str] = {}
    for line in text.splitlines():
        if not line.strip():
            continue
        name, sep, value = line.partition(":")
        if not sep:
            raise UsageError(f"not a header line: {line!r}")
        headers[name.strip().lower()] = value.strip()
    return headers


def _parse_headers_file(text: str) -> dict[str, str]:
    stripped = text.strip()
    if stripped.startswith("{"):
        try:
            obj = json.loads(stripped)
        except ValueError as exc:
            raise UsageError(f"headers file is not valid JSON: {exc}") from None
        return {str(k).lower(): str(v) for k, v in obj.items()}
    return _parse_header_lines(text)


def _split_request(raw: bytes) -> tuple[dict[str, str], bytes]:
    """A raw HTTP request (optional request line, headers, blank line, body)."""
    for sep in (b"\r\n\r\n", b"\n\n"):
        if sep in raw:
            head, body = raw.split(sep, 1)
            break
    else:
        raise UsageError("the request file has no blank line between headers and body")
    lines = head.decode("utf-8", "replace").splitlines()
    if lines and ":" not in lines[0].split(" ", 1)[0] and " " in lines[0]:
        lines = lines[1:]  # "POST /hook HTTP/1.1"
    return _parse_header_lines("\n".join(lines)), body


def cmd_verify_webhook(args: argparse.Namespace) -> int:
    from asyncinfer.client import WebhookVerificationError, verify_webhook

    out, err = _consoles()
    headers: dict[str, str] = {}
    body: bytes | None = None
    if args.request:
        raw = sys.stdin.buffer.read() if args.request == "-" else Path(args.request).read_bytes()
        headers, body = _split_request(raw)
    if args.headers:
        headers.update(_parse_headers_file(_read_arg("@" + args.headers)))
    for h in args.header or []:
        headers.update(_parse_header_lines(h))
    if args.body is not None:
        body = sys.stdin.buffer.read() if args.body == "-" else Path(args.body).read_bytes()
    if body is None:
        raise UsageError("give the body: --body FILE (or -), or a request file")
    secret: Any = args.secret or os.environ.get("ASYNCINFER_WEBHOOK_SECRET")
    if not secret:
        with _client(args) as client:
            secret = client.webhook_secret()  # the current and (after a rotation) previous one
    try:
        event = verify_webhook(secret, headers, body, check_timestamp=not args.no_timestamp_check)
    except WebhookVerificationError as exc:
        if args.json:
            _print_json({"valid": False, "reason": str(exc)})
        else:
            err.print(f"invalid: {exc}", markup=False, highlight=False)
        return EXIT_JOB_FAILED
    if args.json:
        _print_json({"valid": True, "type": event.type, "job_id": event.data.id})
    else:
        out.print(f"valid: {event.type} {event.data.id} ({event.data.status})", markup=False)
    return EXIT_OK
