"""The local stack's event-log lines reach stdout whole (workers write to the same stdout)."""

from __future__ import annotations

import pytest

from asyncinfer.local.stack import emit_line


class Recorder:
    def __init__(self) -> None:
        self.writes: list[str] = []
        self.flushes = 0

    def write(self, text: str) -> int:
        self.writes.append(text)
        return len(text)

    def flush(self) -> None:
        self.flushes += 1


def test_an_event_line_is_one_write_with_its_newline(monkeypatch: pytest.MonkeyPatch) -> None:
    out = Recorder()
    monkeypatch.setattr("sys.stdout", out)
    emit_line("2026-12-01T10:00:00.000Z job.started    job_1 model=echo attempts=1")
    assert out.writes == ["2026-12-01T10:00:00.000Z job.started    job_1 model=echo attempts=1\n"]
    assert out.flushes == 1
