"""Batch lines whose text the stores cannot hold (breaker15): a lone UTF-16 surrogate escape
(``"\\ud800"``: JSON's grammar has it, UTF-8 cannot encode it) and a ``custom_id`` of 512
characters that is more UTF-8 than the line job's 2 KB of ``metadata``. Each passed the file's
validation and then made every run of the expander raise, so the batch never ended (it sat in
``validating`` or ``in_progress`` until its window); now they are line errors of a ``failed``
batch, and a line whose job request is refused after validation is counted ``failed``; moto
in-process, the expander and the counter through their Lambda handlers."""

from __future__ import annotations

import json
from typing import Any

import pytest

from asyncinfer.aws import clients
from asyncinfer.core.settings import Settings
from asyncinfer.openai_api import validation
from asyncinfer.openai_api.files import FileStore
from asyncinfer.openai_api.validation import CHAT, MAX_CUSTOM_ID, validate_file
from tests.conftest import ApiCaller
from tests.unit.batch_helpers import (
    chat_line,
    echo_ok,
    finish,
    line_jobs,
    run_batch_queue,
    run_events,
    upload,
)

TENANT = "tenant-a"
DEPLOYED = ["echo"]


def _raw(cid: str, content: str = "hi") -> bytes:
    """A chat line written by hand, so that ``cid`` / ``content`` may hold JSON escapes."""
    return (
        b'{"custom_id": "' + cid.encode() + b'", "method": "POST", "url": "/v1/chat/completions", '
        b'"body": {"model": "echo", "messages": [{"role": "user", "content": "'
        + content.encode()
        + b'"}]}}'
    )


@pytest.mark.parametrize(
    ("raw", "param"),
    [
        (_raw("\\ud800"), "custom_id"),
        (_raw("a\\udfffb"), "custom_id"),
        (_raw("ok", "x\\uDC00"), "body"),
        (_raw("ok", "\\ud83d"), "body"),  # the first half of a pair, alone
        # UTF-16 (json.loads detects it): the escape is not there to see as bytes
        (_raw("\\ud800").decode().encode("utf-16-le"), "custom_id"),
        (json.dumps(chat_line("ok")).encode("utf-16-le"), None),
    ],
)
def test_a_lone_surrogate_is_a_line_error(raw: bytes, param: str | None) -> None:
    lines, errors = validate_file(raw, CHAT, DEPLOYED)
    if param is None:  # valid UTF-16 JSON text, no lone surrogate: it passes
        assert [ln.custom_id for ln in lines] == ["ok"] and errors == []
        return
    assert lines == []
    assert [(e["line"], e["param"], e["code"]) for e in errors] == [(1, param, "invalid_json")]


def test_a_surrogate_pair_and_text_that_looks_like_an_escape_pass() -> None:
    raw = _raw("\\ud83d\\ude00", "\\\\ud800 \\ud83d\\ude00")  # an emoji; a backslash, then text
    lines, errors = validate_file(raw, CHAT, DEPLOYED)
    assert errors == []
    assert lines[0].custom_id == "\U0001f600"
    assert lines[0].input["messages"][0]["content"] == "\\ud800 \U0001f600"


def test_a_custom_id_is_bounded_in_utf8_bytes_as_the_job_metadata_is() -> None:
    emoji = "\U0001f600" * MAX_CUSTOM_ID  # 512 characters, 2,048 bytes
    cjk = "\u4e2d" * MAX_CUSTOM_ID  # 512 characters, 1,536 bytes
    data = b"\n".join(json.dumps(chat_line(c)).encode() for c in (emoji, cjk))
    lines, errors = validate_file(data, CHAT, DEPLOYED)
    assert [(e["line"], e["param"]) for e in errors] == [(1, "custom_id")]
    assert [ln.custom_id for ln in lines] == [cjk]


def _create(api: ApiCaller, settings: Settings, lines: list[Any]) -> str:
    fid = upload(settings, TENANT, lines)
    status, out, _ = api(
        "POST", "/openai/v1/batches", {"input_file_id": fid, "endpoint": "/v1/chat/completions"}
    )
    assert status == 200, out
    return str(out["id"])


def _batch(api: ApiCaller, batch_id: str) -> dict[str, Any]:
    status, out, _ = api("GET", f"/openai/v1/batches/{batch_id}")
    assert status == 200, out
    return dict(out)


def test_a_file_with_a_lone_surrogate_fails_never_stays_validating(
    api: ApiCaller, settings: Settings
) -> None:
    batch_id = _create(api, settings, [chat_line("a"), _raw("\\ud800"), _raw("c", "\\udc00")])
    run_batch_queue(settings)
    batch = _batch(api, batch_id)
    assert batch["status"] == "failed", batch
    assert [(e["line"], e["param"]) for e in batch["errors"]["data"]] == [
        (2, "custom_id"),
        (3, "body"),
    ]
    assert line_jobs(settings, TENANT) == []


def test_a_custom_id_over_the_metadata_bytes_fails_the_file(
    api: ApiCaller, settings: Settings
) -> None:
    batch_id = _create(api, settings, [chat_line("\U0001f600" * 500), chat_line("b")])
    run_batch_queue(settings)
    batch = _batch(api, batch_id)
    assert batch["status"] == "failed", batch
    assert [(e["line"], e["param"]) for e in batch["errors"]["data"]] == [(1, "custom_id")]


def test_a_line_whose_job_request_is_refused_is_counted_failed_not_retried_forever(
    api: ApiCaller, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A rule of the job request that the file's validation does not check (here: the
    metadata bytes, the validation's bound lifted) refuses that line's job: the line is
    counted ``failed`` with the reason; the other lines run and the batch ends."""
    monkeypatch.setattr(validation, "MAX_CUSTOM_ID_BYTES", 10_000)
    big = "\U0001f600" * 500
    batch_id = _create(api, settings, [chat_line("a"), chat_line(big)])
    run_batch_queue(settings)
    jobs = line_jobs(settings, TENANT)
    assert [json.loads(j["metadata"])["custom_id"] for j in jobs] == ["a"]
    for rec in jobs:
        finish(settings, rec, echo_ok)
    run_events(settings)
    batch = _batch(api, batch_id)
    assert batch["status"] == "completed", batch
    counts = batch["request_counts"]
    assert (counts["total"], counts["completed"], counts["failed"]) == (2, 1, 1)
    files = FileStore(clients.client("s3", settings), settings.bucket)
    (err,) = [json.loads(x) for x in files.read(TENANT, batch["error_file_id"]).splitlines()]
    assert err["custom_id"] == big and err["error"]["code"] == "invalid_request"
    assert "metadata" in err["error"]["message"]
