"""Server-side batches for ``asyncinfer batch --server``: the file goes to the service's
OpenAI-compatible surface (spec openai.md) and the service runs it. Upload (``POST
/openai/v1/files``, multipart, ``purpose=batch``), create (``POST /openai/v1/batches``), wait with
a progress bar of ``request_counts``, download the output and error files.

The input is an OpenAI batch file (``{"custom_id", "method": "POST", "url", "body"}`` per
line); its endpoint is the first line's ``url`` unless given. Only ``httpx`` is used (the
``openai`` package is not a dependency of this client).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from asyncinfer.client.batch import BatchFileError
from asyncinfer.client.errors import ClientError

TERMINAL = ("completed", "failed", "expired", "cancelled")


class ServerBatchError(ClientError):
    """The OpenAI surface answered an error (``status``, OpenAI's ``error`` object)."""

    def __init__(self, status: int, error: dict[str, Any]) -> None:
        super().__init__(f"HTTP {status}: {error.get('message', error)}")
        self.status, self.error = status, error


@dataclass
class ServerBatchResult:
    """The ended batch (OpenAI's Batch object) and where its files were written."""

    batch: dict[str, Any]
    output: Path | None
    errors: Path | None
    seconds: float

    @property
    def ok(self) -> bool:
        """The batch completed and no line failed."""
        counts = self.batch.get("request_counts") or {}
        return self.batch.get("status") == "completed" and not counts.get("failed")


def endpoint_of(path: Path) -> str:
    """The ``url`` of the file's first request. Raises :class:`BatchFileError`."""
    with path.open("rb") as f:
        for raw in f:
            if raw.strip():
                try:
                    url = json.loads(raw).get("url")
                except (ValueError, AttributeError):
                    raise BatchFileError(f"{path}: line 1 is not a JSON object") from None
                if not isinstance(url, str):
                    raise BatchFileError(f"{path}: the first request has no url")
                return url
    raise BatchFileError(f"{path}: the file has no requests")


class ServerBatches:
    """Calls of the ``/openai/v1`` surface with one API key (``x-api-key``).

    Args:
        base_url: the API's URL (as for :class:`asyncinfer.client.Client`, without ``/v1``).
        api_key: the API key.
        http: an ``httpx.Client`` (tests pass one with a mock transport).
    """

    def __init__(
        self,
        base_url: str,
        api_key: str,
        *,
        timeout: float = 60.0,
        http: httpx.Client | None = None,
    ) -> None:
        root = base_url.rstrip("/").removesuffix("/v1")
        self.http = http or httpx.Client(timeout=timeout)
        self.base = f"{root}/openai/v1"
        self.headers = {"x-api-key": api_key, "Authorization": f"Bearer {api_key}"}

    def _call(self, method: str, path: str, **kw: Any) -> httpx.Response:
        resp = self.http.request(method, self.base + path, headers=self.headers, **kw)
        if resp.status_code >= 400:
            try:
                err = resp.json().get("error") or {}
            except ValueError:
                err = {"message": resp.text[:500]}
            raise ServerBatchError(resp.status_code, err)
        return resp

    def upload(self, path: Path) -> str:
        """Upload a batch file; returns its file id."""
        with path.open("rb") as f:
            resp = self._call(
                "POST", "/files", files={"file": (path.name, f)}, data={"purpose": "batch"}
            )
        return str(resp.json()["id"])

    def create(self, file_id: str, endpoint: str, window: str, **extra: Any) -> dict[str, Any]:
        """Create a batch; returns the Batch object."""
        body = {"input_file_id": file_id, "endpoint": endpoint, "completion_window": window}
        out: dict[str, Any] = self._call("POST", "/batches", json={**body, **extra}).json()
        return out

    def get(self, batch_id: str) -> dict[str, Any]:
        """The Batch object."""
        out: dict[str, Any] = self._call("GET", f"/batches/{batch_id}").json()
        return out

    def content(self, file_id: str) -> bytes:
        """A file's bytes (a redirect to the storage is followed)."""
        return self._call("GET", f"/files/{file_id}/content", follow_redirects=True).content

    def run(
        self,
        path: Path,
        output: Path,
        *,
        errors: Path | None = None,
        endpoint: str | None = None,
        window: str = "24h",
        priority: str | None = None,
        progress: bool = True,
        poll: float = 2.0,
        timeout: float | None = None,
    ) -> ServerBatchResult:
        """Upload ``path``, run it as a batch, wait, and write the output file to ``output``
        and the error file to ``errors`` (default ``<output>.errors.jsonl``).

        Raises:
            ServerBatchError: the service refused a call.
            TimeoutError: ``timeout`` seconds passed before the batch ended.
        """
        started = time.monotonic()
        extra = {"priority": priority} if priority else {}
        batch = self.create(self.upload(path), endpoint or endpoint_of(path), window, **extra)
        batch = self._wait(batch, progress=progress, poll=poll, timeout=timeout)
        out_path = err_path = None
        if batch.get("output_file_id"):
            output.write_bytes(self.content(batch["output_file_id"]))
            out_path = output
        if batch.get("error_file_id"):
            err_path = errors or output.with_name(output.name + ".errors.jsonl")
            err_path.write_bytes(self.content(batch["error_file_id"]))
        return ServerBatchResult(batch, out_path, err_path, time.monotonic() - started)

    def _wait(
        self, batch: dict[str, Any], *, progress: bool, poll: float, timeout: float | None
    ) -> dict[str, Any]:
        deadline = None if timeout is None else time.monotonic() + timeout
        bar = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[failed]} failed"),
            TimeElapsedColumn(),
            console=Console(stderr=True),
            disable=not progress,
        )
        with bar:
            task = bar.add_task(batch["id"], total=None, failed=0)
            while batch["status"] not in TERMINAL:
                if deadline is not None and time.monotonic() >= deadline:
                    raise TimeoutError(f"batch {batch['id']} still {batch['status']}")
                time.sleep(poll)
                batch = self.get(batch["id"])
                counts = batch.get("request_counts") or {}
                done = int(counts.get("completed", 0)) + int(counts.get("failed", 0))
                bar.update(
                    task,
                    description=f"{batch['id']} {batch['status']}",
                    total=counts.get("total") or None,
                    completed=done,
                    failed=counts.get("failed", 0),
                )
        return batch
