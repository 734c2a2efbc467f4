"""Webhook URL rules (spec, "Events"): https only, and never an address inside the network.

Refused: loopback (allowed on the local stack only), private (10/8, 172.16/12, 192.168/16),
shared (100.64/10), link-local (169.254/16, the instance metadata address; fe80::/10), unique
local (fc00::/7), multicast, unspecified (0.0.0.0, ::), reserved and documentation ranges, and
IPv4-mapped IPv6 forms of any of them (``::ffff:169.254.169.254``). Numeric host forms that
``inet_aton`` accepts (``2130706433``, ``0x7f000001``, ``0177.0.0.1``, ``127.1``) are read as the
addresses they denote. The rule is Python's ``ipaddress`` ``is_global`` plus the explicit checks.

Checked at submit (:func:`check_url`, names resolved where they resolve) and again at send against
the address actually connected to (:func:`check_address`).
"""

from __future__ import annotations

import ipaddress
import re
import socket
from urllib.parse import urlsplit

from asyncinfer.errors import InvalidRequest

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

_NUMERIC_V4 = re.compile(r"^(0x[0-9a-f]+|[0-9]+)(\.(0x[0-9a-f]+|[0-9]+)){0,3}$", re.I)


class ForbiddenAddress(ValueError):
    """The address (or URL) is not allowed as a webhook target."""


def parse_host(host: str) -> IPAddress | None:
    """The IP address a host literal denotes (any numeric form), or ``None`` for a name. A
    trailing dot (the DNS root) is ignored: ``10.0.0.1.`` is ``10.0.0.1``."""
    h = host.strip("[]").rstrip(".")
    try:
        return ipaddress.ip_address(h)
    except ValueError:
        pass
    if _NUMERIC_V4.match(h):
        try:
            return ipaddress.IPv4Address(socket.inet_aton(h))
        except OSError:
            raise ForbiddenAddress(f"malformed numeric host {host!r}") from None
    return None


def check_address(addr: IPAddress, *, allow_loopback: bool = False) -> None:
    """Raise :class:`ForbiddenAddress` unless ``addr`` is a public unicast address (or loopback
    where ``allow_loopback``)."""
    if isinstance(addr, ipaddress.IPv6Address):
        mapped = addr.ipv4_mapped or addr.sixtofour
        if mapped is not None:
            check_address(mapped, allow_loopback=allow_loopback)
            return
        if addr in ipaddress.ip_network("64:ff9b::/96"):
            check_address(ipaddress.IPv4Address(int(addr) & 0xFFFFFFFF), allow_loopback=False)
            return
    if addr.is_loopback:
        if allow_loopback:
            return
        raise ForbiddenAddress(f"{addr} is a loopback address")
    if addr.is_unspecified or addr.is_multicast or addr.is_link_local or addr.is_private:
        raise ForbiddenAddress(f"{addr} is not a public address")
    if not addr.is_global or addr.is_reserved:
        raise ForbiddenAddress(f"{addr} is not a public address")


def check_url(url: str, *, local_mode: bool, resolve: bool = True) -> None:
    """Check a webhook URL at submit time.

    Args:
        url: the ``webhook.url`` of a request.
        local_mode: on the local stack, http and loopback addresses are allowed too.
        resolve: resolve host names and refuse one that resolves to a forbidden address (a name
            that does not resolve now is accepted; it is checked again at send).

    Raises:
        InvalidRequest: naming the field ``webhook.url``.
    """

    def bad(msg: str) -> InvalidRequest:
        return InvalidRequest(
            f"webhook.url is not allowed: {msg}",
            [{"field": "webhook.url", "message": msg, "type": "url"}],
        )

    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise bad(f"not a valid URL ({exc})") from None
    allowed = ("https", "http") if local_mode else ("https",)
    if parts.scheme not in allowed:
        raise bad("the scheme must be https")
    if parts.username or parts.password:
        raise bad("credentials in the URL are not allowed")
    host = parts.hostname
    if not host:
        raise bad("the URL has no host")
    if any(c.isspace() for c in url) or any(ord(c) < 0x20 for c in url):
        raise bad("the URL has whitespace or control characters")
    try:
        literal = parse_host(host)
        if literal is not None:
            check_address(literal, allow_loopback=local_mode)
            return
        if host.lower().rstrip(".") in ("localhost", "localhost.localdomain") and not local_mode:
            raise ForbiddenAddress("localhost is a loopback address")
        if not resolve:
            return
        try:
            infos = socket.getaddrinfo(host, port or 443, type=socket.SOCK_STREAM)
        except (socket.gaierror, UnicodeError):
            return
        for info in infos:
            check_address(ipaddress.ip_address(info[4][0]), allow_loopback=local_mode)
    except ForbiddenAddress as exc:
        raise bad(str(exc)) from None
