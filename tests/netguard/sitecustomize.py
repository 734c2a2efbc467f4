"""Test-only network guard: a test, a local stack it starts, or any process they spawn may send
traffic only to loopback addresses (127.0.0.0/8, ::1) and Unix sockets.

``tests/conftest.py`` puts this folder first on ``PYTHONPATH``, so Python imports this module at
start-up in the test process and in every Python subprocess (the local stack, its emulator, fork
server and workers). It replaces, process-wide:

* ``socket.getaddrinfo``: names other than ``localhost`` (and numeric addresses) are refused
  with ``socket.gaierror`` instead of being sent to the machine's DNS resolver;
* ``socket.socket.connect`` / ``connect_ex`` and ``sendto``: a destination that is not loopback
  raises ``PermissionError`` before a packet leaves.

Code under test that must refuse an address before dialling still does so itself (the webhook
rules); this guard only makes a mistake in a test, a generated request (schemathesis) or a
library fail loudly rather than reach another host. ``ASYNCINFER_NETGUARD=0`` turns it off.
"""

from __future__ import annotations

import ipaddress
import os
import socket
from typing import Any

_real_getaddrinfo = socket.getaddrinfo
_real_connect = socket.socket.connect
_real_connect_ex = socket.socket.connect_ex
_real_sendto = socket.socket.sendto
_LOCAL_NAMES = {"localhost", "localhost.localdomain", "ip6-localhost", "ip6-loopback"}


def is_loopback(host: Any) -> bool:
    """Whether ``host`` (a numeric address string, or a name) is loopback: 127.0.0.0/8, ::1,
    an IPv4-mapped loopback, or one of the names /etc/hosts gives loopback."""
    if isinstance(host, bytes):
        host = host.decode("ascii", "replace")
    if not isinstance(host, str):
        return False
    name = host.strip("[]").split("%", 1)[0].lower().rstrip(".")
    if name in _LOCAL_NAMES:
        return True
    try:
        addr = ipaddress.ip_address(name)
    except ValueError:
        return False
    mapped = getattr(addr, "ipv4_mapped", None)
    return bool(addr.is_loopback or (mapped is not None and mapped.is_loopback))


def _is_numeric(host: str) -> bool:
    try:
        ipaddress.ip_address(host.strip("[]").split("%", 1)[0])
    except ValueError:
        return False
    return True


def allowed(address: Any) -> bool:
    """Whether a ``connect``/``sendto`` destination may be dialled: loopback (v4 or v6 tuple)
    or anything that is not an IP address tuple (Unix sockets, netlink)."""
    if isinstance(address, tuple) and address and isinstance(address[0], str | bytes):
        return is_loopback(address[0])
    return True


def _guarded_getaddrinfo(host: Any, port: Any, *args: Any, **kwargs: Any) -> Any:
    if host is None or is_loopback(host):
        return _real_getaddrinfo(host, port, *args, **kwargs)
    text = host.decode("ascii", "replace") if isinstance(host, bytes) else str(host)
    if _is_numeric(text):
        return _real_getaddrinfo(host, port, *args, **kwargs)  # no lookup; connect decides
    raise socket.gaierror(socket.EAI_NONAME, f"netguard: no name resolution in tests ({text!r})")


def _refuse(address: Any) -> None:
    raise PermissionError(f"netguard: tests may only reach loopback addresses, not {address!r}")


def _guarded_connect(self: socket.socket, address: Any) -> None:
    if not allowed(address):
        _refuse(address)
    return _real_connect(self, address)


def _guarded_connect_ex(self: socket.socket, address: Any) -> int:
    if not allowed(address):
        _refuse(address)
    return _real_connect_ex(self, address)


def _guarded_sendto(self: socket.socket, data: Any, *args: Any) -> int:
    address = args[-1] if args else None
    if not allowed(address):
        _refuse(address)
    return _real_sendto(self, data, *args)


def install() -> None:
    """Replace the socket functions above for this process (idempotent)."""
    socket.getaddrinfo = _guarded_getaddrinfo
    socket.socket.connect = _guarded_connect  # type: ignore[method-assign]
    socket.socket.connect_ex = _guarded_connect_ex  # type: ignore[method-assign]
    socket.socket.sendto = _guarded_sendto  # type: ignore[method-assign,assignment]


if os.environ.get("ASYNCINFER_NETGUARD", "1") != "0":
    install()
