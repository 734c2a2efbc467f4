"""The tests' network guard (tests/netguard/sitecustomize.py): only loopback is reachable, and no
name but localhost is looked up. No test here sends a packet to another address: the guard
refuses before the socket call, and the checks of the rule itself are pure."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest

from tests.netguard import sitecustomize as netguard


@pytest.mark.parametrize(
    "host", ["127.0.0.1", "127.8.9.10", "::1", "[::1]", "localhost", "::ffff:127.0.0.1"]
)
def test_loopback_is_allowed(host: str) -> None:
    assert netguard.is_loopback(host)
    assert netguard.allowed((host, 80))


@pytest.mark.parametrize(
    "host",
    ["10.255.255.53", "192.0.2.1", "8.8.8.8", "::ffff:10.0.0.1", "2001:db8::1", "example.com"],
)
def test_other_addresses_are_refused(host: str) -> None:
    assert not netguard.allowed((host, 80))


def test_unix_sockets_are_allowed() -> None:
    assert netguard.allowed("/tmp/x.sock")


def test_the_guard_is_on_in_this_process() -> None:
    with pytest.raises(socket.gaierror):
        socket.getaddrinfo("example.com", 443)
    assert socket.getaddrinfo("127.0.0.1", 80)  # numeric: no lookup
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        with pytest.raises(PermissionError, match="netguard"):
            s.connect(("192.0.2.1", 9))  # TEST-NET-1: refused before any packet
    finally:
        s.close()


def test_the_guard_is_on_in_python_subprocesses() -> None:
    """Subprocesses inherit PYTHONPATH with the guard's folder first (tests/conftest.py)."""
    code = (
        "import socket\n"
        "try:\n"
        "    socket.getaddrinfo('example.com', 443)\n"
        "except socket.gaierror as e:\n"
        "    print('refused', e)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=dict(os.environ)
    )
    assert out.stdout.startswith("refused"), out
