"""One deadline per webhook attempt (spec: "no answer in 10 s"), against real slow receivers: a
socket server on 127.0.0.1 in the test that trickles its answer, or reads the request a few bytes
at a time. The sender runs in local mode (loopback allowed) with a short timeout."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from asyncinfer.webhooks.sender import WebhookSender

#: The attempt's deadline in these tests, seconds.
TIMEOUT = 1.5
#: Time allowed beyond the deadline (two shared cores; thread scheduling).
SLACK = 1.5
#: How long a receiver keeps trickling before it gives up: far beyond the deadline, so a
#: per-phase timeout (which every trickled byte resets) would run this long.
TRICKLE_FOR = 8.0


class SlowReceiver:
    """A one-connection-at-a-time HTTP receiver on 127.0.0.1 whose behaviour is ``serve(conn)``."""

    def __init__(self, serve: Callable[[socket.socket], None], *, rcvbuf: int | None = None):
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if rcvbuf:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.port = self.sock.getsockname()[1]
        self.serve = serve
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        self.sock.settimeout(0.2)
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            threading.Thread(target=self._one, args=(conn,), daemon=True).start()

    def _one(self, conn: socket.socket) -> None:
        try:
            self.serve(conn)
        except OSError:
            pass
        finally:
            conn.close()

    def close(self) -> None:
        self.stop.set()
        self.thread.join(2)
        self.sock.close()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hook"


def _read_request(conn: socket.socket) -> bytes:
    """Read the request head and its Content-Length body."""
    conn.settimeout(5)
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        if not chunk:
            return data
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n")[1:]:
        k, _, v = line.partition(b":")
        if k.strip().lower() == b"content-length":
            length = int(v.strip())
    while len(rest) < length:
        chunk = conn.recv(65536)
        if not chunk:
            break
        rest += chunk
    return head


def _trickle(conn: socket.socket, data: bytes, every: float) -> None:
    end = time.monotonic() + TRICKLE_FOR
    for i in range(len(data)):
        if time.monotonic() > end:
            return
        conn.sendall(data[i : i + 1])
        time.sleep(every)


def _timed(fn: Callable[[], Any]) -> tuple[Any, float]:
    t0 = time.monotonic()
    out = fn()
    return out, time.monotonic() - t0


@pytest.fixture
def receivers() -> Iterator[list[SlowReceiver]]:
    made: list[SlowReceiver] = []
    yield made
    for r in made:
        r.close()


def test_a_status_line_trickled_a_byte_at_a_time_is_cut_at_the_deadline(
    receivers: list[SlowReceiver],
) -> None:
    def serve(conn: socket.socket) -> None:
        _read_request(conn)
        _trickle(conn, b"HTTP/1.1 200 OK\r\n" + b"X-Slow: " + b"a" * 200, every=0.1)

    r = SlowReceiver(serve)
    receivers.append(r)
    sender = WebhookSender(local_mode=True, timeout=TIMEOUT)
    result, took = _timed(lambda: sender.send(r.url, b"{}", {}))
    assert result.outcome == "retry" and result.http_status is None, result
    assert "no answer within" in (result.error or "")
    assert took < TIMEOUT + SLACK, took


def test_a_receiver_reading_the_request_slowly_is_cut_at_the_deadline(
    receivers: list[SlowReceiver],
) -> None:
    def serve(conn: socket.socket) -> None:
        conn.settimeout(5)
        end = time.monotonic() + TRICKLE_FOR
        while time.monotonic() < end:  # ~1 MB/s: every send makes progress, none ends it
            if not conn.recv(65536):
                return
            time.sleep(0.05)

    r = SlowReceiver(serve)
    receivers.append(r)
    sender = WebhookSender(local_mode=True, timeout=TIMEOUT)
    body = b"x" * (32 * 1024 * 1024)  # far more than the socket buffers hold
    result, took = _timed(lambda: sender.send(r.url, body, {}))
    assert result.outcome == "retry", result
    assert took < TIMEOUT + SLACK, took


def test_a_status_in_time_counts_though_the_body_still_trickles(
    receivers: list[SlowReceiver],
) -> None:
    def serve(conn: socket.socket) -> None:
        _read_request(conn)
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 500\r\n\r\n")
        _trickle(conn, b"y" * 500, every=0.1)

    r = SlowReceiver(serve)
    receivers.append(r)
    sender = WebhookSender(local_mode=True, timeout=TIMEOUT)
    result, took = _timed(lambda: sender.send(r.url, b"{}", {}))
    assert (result.outcome, result.http_status) == ("delivered", 200), result
    assert result.response.startswith("y")
    assert took < TIMEOUT + SLACK, took


def test_name_resolution_counts_against_the_same_deadline(
    receivers: list[SlowReceiver],
) -> None:
    def serve(conn: socket.socket) -> None:
        _read_request(conn)
        _trickle(conn, b"HTTP/1.1 200 OK\r\n" + b"X: " + b"a" * 200, every=0.1)

    r = SlowReceiver(serve)
    receivers.append(r)

    def slow_dns(host: str, port: int) -> list[Any]:
        time.sleep(1.0)
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.0.1", port))]

    sender = WebhookSender(local_mode=True, timeout=TIMEOUT, resolver=slow_dns)
    result, took = _timed(lambda: sender.send(f"http://slow.test:{r.port}/h", b"{}", {}))
    assert result.outcome == "retry", result
    assert took < TIMEOUT + SLACK, took

    def stuck_dns(host: str, port: int) -> list[Any]:
        time.sleep(TRICKLE_FOR)
        return []

    sender = WebhookSender(local_mode=True, timeout=TIMEOUT, resolver=stuck_dns)
    result, took = _timed(lambda: sender.send("http://stuck.test:9/h", b"{}", {}))
    assert result.outcome == "retry" and "no answer within" in (result.error or ""), result
    assert took < TIMEOUT + SLACK, took


def test_a_deadline_given_by_the_caller_is_kept_when_sooner(
    receivers: list[SlowReceiver],
) -> None:
    def serve(conn: socket.socket) -> None:
        _read_request(conn)
        _trickle(conn, b"HTTP/1.1 200 OK\r\n" + b"X: " + b"a" * 200, every=0.1)

    r = SlowReceiver(serve)
    receivers.append(r)
    sender = WebhookSender(local_mode=True, timeout=10.0)
    result, took = _timed(
        lambda: sender.send(r.url, b"{}", {}, deadline=time.monotonic() + TIMEOUT)
    )
    assert result.outcome == "retry", result
    assert took < TIMEOUT + SLACK, took


def test_a_prompt_receiver_is_delivered_over_the_deadline_transport(
    receivers: list[SlowReceiver],
) -> None:
    seen: list[bytes] = []

    def serve(conn: socket.socket) -> None:
        seen.append(_read_request(conn))
        conn.sendall(b"HTTP/1.1 204 No Content\r\n\r\n")

    r = SlowReceiver(serve)
    receivers.append(r)
    result = WebhookSender(local_mode=True, timeout=TIMEOUT).send(
        r.url + "?a=1", b'{"x":1}', {"webhook-id": "msg_1"}
    )
    assert (result.outcome, result.http_status) == ("delivered", 204), result
    head = seen[0].decode()
    assert head.startswith("POST /hook?a=1 HTTP/1.1\r\n")
    assert f"Host: 127.0.0.1:{r.port}" in head and "webhook-id: msg_1" in head


def test_a_tls_handshake_trickled_a_byte_at_a_time_is_cut_at_the_deadline(
    receivers: list[SlowReceiver],
) -> None:
    def serve(conn: socket.socket) -> None:
        conn.settimeout(5)
        conn.recv(65536)  # the ClientHello
        # A handshake record announcing 16 KB, sent a byte at a time: never complete.
        _trickle(conn, b"\x16\x03\x03\x40\x00" + b"\x02" * 400, every=0.1)

    r = SlowReceiver(serve)
    receivers.append(r)
    sender = WebhookSender(local_mode=True, timeout=TIMEOUT)
    result, took = _timed(lambda: sender.send(f"https://127.0.0.1:{r.port}/h", b"{}", {}))
    assert result.outcome == "retry", result
    assert took < TIMEOUT + SLACK, took
