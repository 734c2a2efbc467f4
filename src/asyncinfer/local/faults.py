"""Test-only fault injection for the local stack's emulator (off by default).

A chaos test makes the emulator's SNS and S3 fail for a while, as AWS does in an outage, to check
that no event is lost and no job is stuck or run twice. The control is a JSON file, the
*faults file*; the emulator reads it only when started with ``--faults-file PATH``, which the
local stack passes (``<state-dir>/emulator-faults.json``) only when the setting
``local_emulator_faults`` is on (``ASYNCINFER_EMULATOR_FAULTS=1``). Without that flag, or
while the file is absent, nothing changes.

The file's shape::

    {"sns": {"until": 1764583200.0, "status": 500},
     "s3": {"until": 1764583200.0, "status": 503}}

``until`` is a Unix time in seconds (``time.time()``); ``status`` (default 500 for SNS, 503 for
S3) is the HTTP status answered until then; each injected fault is logged on stderr, a line
starting :data:`INJECTED` (``moto.log`` on the local stack). While a window is open:

- SNS ``Publish`` and ``PublishBatch`` answer ``status`` with an ``InternalError`` (SNS's query
  protocol error document); other SNS actions are untouched.
- S3 ``GET``, ``HEAD`` and ``PUT`` requests (GetObject, HeadObject, PutObject, UploadPart...)
  answer ``status`` with ``SlowDown`` (S3's error document); ``POST`` (browser uploads, multipart
  creation) and ``DELETE`` are untouched.

The service is the one named in the request's SigV4 credential scope (``Authorization`` header
or a presigned URL's ``X-Amz-Credential``), as AWS routes it. botocore retries 5xx answers (3 to
5 attempts by its retry mode), so a window of a few seconds is needed to reach the code.
Use :func:`write_faults` from tests.
"""

from __future__ import annotations

import io
import json
import os
import re
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

#: How each injected fault is logged on the emulator's stderr (the local stack's ``moto.log``).
INJECTED = "asyncinfer.local.faults: injected"
#: The faults file's name in the local stack's state directory.
FAULTS_FILE = "emulator-faults.json"

_SCOPE = re.compile(r"Credential=[^/]+/\d{8}/[^/]+/([a-z0-9-]+)/aws4_request")
_QUERY_SCOPE = re.compile(
    r"X-Amz-Credential=[^&]*?(?:/|%2F)\d{8}(?:/|%2F)[^/%]+(?:/|%2F)([a-z0-9-]+)"
)
_DEFAULT_STATUS = {"sns": 500, "s3": 503}
_S3_METHODS = {"GET", "HEAD", "PUT"}
_SNS_ACTIONS = {"Publish", "PublishBatch"}


def write_faults(
    path: Path, windows: dict[str, float], status: dict[str, int] | None = None
) -> None:
    """Open a fault window per service: ``windows`` maps ``"sns"``/``"s3"`` to seconds from now.
    Written atomically; an empty ``windows`` closes every window."""
    now = time.time()
    doc = {
        svc: {"until": now + secs, "status": (status or {}).get(svc, _DEFAULT_STATUS[svc])}
        for svc, secs in windows.items()
    }
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(doc))
    os.replace(tmp, path)


class FaultInjector:
    """WSGI middleware around moto server's application answering faults of the faults file.

    ``app`` is a WSGI callable; ``path`` the faults file (re-read when it changes)."""

    def __init__(self, app: Callable[..., Iterable[bytes]], path: Path) -> None:
        self.app = app
        self.path = path
        self._stamp: tuple[int, int, int] | None = None
        self._doc: dict[str, Any] = {}

    def _windows(self) -> dict[str, Any]:
        try:
            st = self.path.stat()
        except OSError:
            self._stamp, self._doc = None, {}
            return {}
        stamp = (st.st_ino, st.st_mtime_ns, st.st_size)  # write_faults replaces the file
        if stamp != self._stamp:
            try:
                doc = json.loads(self.path.read_text())
                self._doc = doc if isinstance(doc, dict) else {}
            except (OSError, ValueError):
                self._doc = {}
            self._stamp = stamp
        return self._doc

    def fault_for(self, environ: dict[str, Any]) -> tuple[str, int] | None:
        """``(service, status)`` if this request is to fail now, else ``None``. May replace
        ``wsgi.input`` with a buffered copy (an SNS request's body is read for its action)."""
        windows = self._windows()
        if not windows:
            return None
        service = request_service(environ)
        window = windows.get(service or "")
        if not isinstance(window, dict) or float(window.get("until", 0)) <= time.time():
            return None
        status = int(window.get("status", _DEFAULT_STATUS.get(service or "", 500)))
        method = environ.get("REQUEST_METHOD", "").upper()
        if service == "s3":
            return (service, status) if method in _S3_METHODS else None
        if service == "sns":
            action = _sns_action(environ)
            return (service, status) if action in _SNS_ACTIONS else None
        return None

    def __call__(self, environ: dict[str, Any], start_response: Any) -> Iterable[bytes]:
        fault = self.fault_for(environ)
        if fault is None:
            return self.app(environ, start_response)
        service, status = fault
        method, path = environ.get("REQUEST_METHOD", ""), environ.get("PATH_INFO", "")
        print(f"{INJECTED} {status} {service} {method} {path}", file=sys.stderr, flush=True)
        if service == "s3":
            body = (
                b'<?xml version="1.0" encoding="UTF-8"?><Error><Code>SlowDown</Code>'
                b"<Message>injected fault (asyncinfer.local.faults)</Message></Error>"
            )
        else:
            body = (
                b'<ErrorResponse xmlns="http://sns.amazonaws.com/doc/2010-03-31/"><Error>'
                b"<Type>Receiver</Type><Code>InternalError</Code>"
                b"<Message>injected fault (asyncinfer.local.faults)</Message></Error>"
                b"<RequestId>injected</RequestId></ErrorResponse>"
            )
        start_response(
            f"{status} Injected Fault",
            [("Content-Type", "application/xml"), ("Content-Length", str(len(body)))],
        )
        return [body]


def request_service(environ: dict[str, Any]) -> str | None:
    """The service named in the request's SigV4 credential scope, or ``None``."""
    m = _SCOPE.search(environ.get("HTTP_AUTHORIZATION", ""))
    if m:
        return m.group(1)
    m = _QUERY_SCOPE.search(environ.get("QUERY_STRING", ""))
    return m.group(1) if m else None


def _sns_action(environ: dict[str, Any]) -> str:
    query = parse_qs(environ.get("QUERY_STRING", ""))
    if "Action" in query:
        return query["Action"][0]
    try:
        length = int(environ.get("CONTENT_LENGTH") or 0)
    except ValueError:
        length = 0
    body = environ["wsgi.input"].read(length) if length > 0 else b""
    environ["wsgi.input"] = io.BytesIO(body)
    form = parse_qs(body.decode("utf-8", "replace"))
    return form.get("Action", [""])[0]


def install(path: Path) -> bool:
    """Wrap moto server's application (``DomainDispatcherApplication.__call__``) with a
    :class:`FaultInjector` reading ``path``. Returns whether it applied; idempotent."""
    try:
        from moto.moto_server.werkzeug_app import DomainDispatcherApplication
    except ImportError:
        return False
    if getattr(DomainDispatcherApplication, "_asyncinfer_faults", None) is not None:
        return True
    original = DomainDispatcherApplication.__call__
    injectors: dict[int, FaultInjector] = {}

    def call(self: Any, environ: dict[str, Any], start_response: Any) -> Any:
        injector = injectors.get(id(self))
        if injector is None:
            injector = injectors[id(self)] = FaultInjector(lambda e, s: original(self, e, s), path)
        return injector(environ, start_response)

    DomainDispatcherApplication.__call__ = call  # type: ignore[method-assign]
    DomainDispatcherApplication._asyncinfer_faults = path  # type: ignore[attr-defined]
    return True
