"""Webhook URL rules (spec, "Events"): https only, and never an address inside the network.

One parser, :func:`parse_url`, is used by the submit-time check (:func:`check_url`, in the API)
and by the sender (:mod:`asyncinfer.webhooks.sender`), which builds its request from the parsed
parts and never re-parses the text; so a URL the two would read differently cannot exist. It is
strict: no whitespace, control characters or backslashes anywhere (browsers read ``\\`` as ``/``),
no credentials, no percent-encoded or bracketed-zone hosts, a port of digits only; non-ASCII host
names are IDNA-encoded (refused where IDNA 2003 and 2008 would disagree, as ``ß``), paths and
queries percent-encoded.

Ports (see docs/webhooks.md): the scheme's default, 443, or 1024..65535. Other well-known ports
(1..1023) belong to other protocols (SSH, SMTP, DNS, ...) and no webhook receiver listens there;
refusing them keeps the sender from being aimed at those services. The local stack allows any
port (a receiver on the laptop listens where it likes).

Addresses: refused unless globally reachable. The rule is the IANA IPv4 and IPv6 Special-Purpose
Address Registries (RFC 6890 and later), entries marked "Globally Reachable: False" (or N/A, or
deprecated), listed in :data:`NOT_GLOBAL` with their sources, plus multicast, deprecated
site-local IPv6 (fec0::/10) and the deprecated 6to4 relay anycast (192.88.99.0/24), plus
whatever Python's ``ipaddress`` ``is_global`` refuses (a safety net only: its lists change
between Python versions and miss several of these). Addresses embedding an IPv4 address
(IPv4-mapped ``::ffff:a.b.c.d``, 6to4 ``2002:AABB:CCDD::/48``, NAT64 ``64:ff9b::a.b.c.d``) are
judged by the IPv4 address they carry. Numeric host forms that ``inet_aton`` accepts
(``2130706433``, ``0x7f000001``, ``0177.0.0.1``, ``127.1``) are read as the addresses they denote.
Loopback is allowed on the local stack only.

Checked at submit (:func:`check_url`, names resolved where they resolve) and again at send against
the address actually connected to (:func:`check_address`).
"""

from __future__ import annotations

import ipaddress
import re
import socket
import threading
import time
import unicodedata
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, urlsplit

from asyncinfer.core.errors import InvalidRequest

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

#: How long the submit-time check waits for a name to resolve, seconds; a name not resolved by
#: then is accepted, as one that does not resolve (it is checked again at send).
SUBMIT_RESOLVE_SECONDS = 2.0
#: Longest webhook URL, characters (the queue message limit in :mod:`asyncinfer.jobs.messages`).
MAX_URL_CHARS = 2048
#: Ports below this are refused, 443 excepted (outside the local stack).
FIRST_UNPRIVILEGED_PORT = 1024
DEFAULT_PORTS = {"https": 443, "http": 80}

_NUMERIC_V4 = re.compile(r"^(0x[0-9a-f]*|[0-9]+)(\.(0x[0-9a-f]*|[0-9]+)){0,3}$", re.I)
_LABEL = re.compile(r"^(?!-)[a-z0-9_-]{1,63}(?<!-)$")
_NUMBER_LABEL = re.compile(r"^(0x[0-9a-f]*|[0-9]+)$", re.I)
_BRACKETED = re.compile(r"^\[([0-9a-fA-F:.]+)\](?::([0-9]*))?$")
_PLAIN = re.compile(r"^([^:\[\]]+)(?::([0-9]*))?$")
#: RFC 3986 ``pchar`` and ``/`` (path) and also ``?`` (query) stay as they are; ``%`` too, so an
#: already percent-encoded URL is sent as written.
_PATH_SAFE = "/%:@!$&'()*+,;=-._~"
_QUERY_SAFE = _PATH_SAFE + "?"


def _nets(*cidrs: str) -> tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...]:
    return tuple(ipaddress.ip_network(c) for c in cidrs)


#: Blocks whose addresses are not globally reachable: the IANA Special-Purpose Address Registries
#: (iana.org/assignments/iana-ipv4-special-registry and iana-ipv6-special-registry), entries
#: "Globally Reachable: False" or N/A, plus multicast and deprecated ranges. Blocks that the
#: registries mark not reachable as a whole are refused whole, the few anycast service addresses
#: inside them (192.0.0.9, 2001:1::1, ...) included: no webhook receiver lives there.
NOT_GLOBAL = _nets(
    "0.0.0.0/8",  # "this network", RFC 791
    "10.0.0.0/8",  # private use, RFC 1918
    "100.64.0.0/10",  # shared address space (carrier-grade NAT), RFC 6598
    "127.0.0.0/8",  # loopback, RFC 1122
    "169.254.0.0/16",  # link local (the instance metadata service), RFC 3927
    "172.16.0.0/12",  # private use, RFC 1918
    "192.0.0.0/24",  # IETF protocol assignments, RFC 6890 (DS-Lite, NAT64 discovery, ...)
    "192.0.2.0/24",  # documentation TEST-NET-1, RFC 5737
    "192.88.99.0/24",  # 6to4 relay anycast, deprecated by RFC 7526
    "192.168.0.0/16",  # private use, RFC 1918
    "198.18.0.0/15",  # benchmarking, RFC 2544
    "198.51.100.0/24",  # documentation TEST-NET-2, RFC 5737
    "203.0.113.0/24",  # documentation TEST-NET-3, RFC 5737
    "224.0.0.0/4",  # multicast, RFC 5771
    "240.0.0.0/4",  # reserved, RFC 1112 (255.255.255.255, limited broadcast, RFC 919, inside)
    "::/8",  # unspecified, loopback, IPv4-compatible (deprecated) and translated, RFC 4291
    "64:ff9b:1::/48",  # local-use IPv4/IPv6 translation, RFC 8215
    "100::/64",  # discard-only, RFC 6666
    "100:0:0:1::/64",  # dummy IPv6 prefix, RFC 9780
    "2001::/23",  # IETF protocol assignments: Teredo, benchmarking, ORCHID, ..., RFC 2928
    "2001:db8::/32",  # documentation, RFC 3849
    "3fff::/20",  # documentation, RFC 9637
    "5f00::/16",  # segment routing SIDs, RFC 9602
    "fc00::/7",  # unique local, RFC 4193
    "fe80::/10",  # link local, RFC 4291
    "fec0::/10",  # site local, deprecated by RFC 3879
    "ff00::/8",  # multicast, RFC 4291
)
#: Names that are loopback by definition (RFC 6761: ``localhost`` and every ``*.localhost``).
_LOOPBACK_NAMES = ("localhost", "localhost.localdomain")
_V4_MAPPED = ipaddress.IPv6Network("::ffff:0:0/96")
_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")  # RFC 6052: the IPv4 address is the last 32 bits


class ForbiddenAddress(ValueError):
    """The address (or URL) is not allowed as a webhook target."""


@dataclass(frozen=True)
class WebhookUrl:
    """A webhook URL as the sender uses it.

    Attributes:
        scheme: ``https`` (``http`` on the local stack).
        host: ASCII, lower case: a DNS name (IDNA-encoded) or an IP address without brackets.
        port: the port connected to (the scheme's default when the URL names none).
        explicit_port: whether the URL names the port (it then goes into the ``Host`` header).
        target: the request target, ``/path?query``, ASCII (percent-encoded); no fragment.
        address: the IP address when the host is one (any numeric form), else ``None``.
    """

    scheme: str
    host: str
    port: int
    explicit_port: bool
    target: str
    address: IPAddress | None

    @property
    def host_header(self) -> str:
        """The ``Host`` header: the host (IPv6 in brackets) and the port when the URL names it."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}" if self.explicit_port else host


def parse_host(host: str) -> IPAddress | None:
    """The IP address a host literal denotes (any numeric form), or ``None`` for a name. A
    trailing dot (the DNS root) is ignored: ``10.0.0.1.`` is ``10.0.0.1``.

    Raises:
        ForbiddenAddress: a numeric form ``inet_aton`` does not accept (``1.2.3.256``), or a name
            whose last label is a number (read by browsers as a malformed IPv4 address).
    """
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
    if _NUMBER_LABEL.match(h.rsplit(".", 1)[-1]):
        raise ForbiddenAddress(f"host {host!r} ends in a number but is not an IPv4 address")
    return None


def _embedded_v4(addr: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv4-mapped, 6to4 or NAT64 (well-known prefix) address carries."""
    if addr in _V4_MAPPED:
        return addr.ipv4_mapped
    if addr.sixtofour is not None:
        return addr.sixtofour
    if addr in _NAT64:
        return ipaddress.IPv4Address(int(addr) & 0xFFFFFFFF)
    return None


def check_address(addr: IPAddress, *, allow_loopback: bool = False) -> None:
    """Raise :class:`ForbiddenAddress` unless ``addr`` is globally reachable (or loopback where
    ``allow_loopback``; an address translated by NAT64 is never taken as loopback)."""
    if isinstance(addr, ipaddress.IPv6Address):
        embedded = _embedded_v4(addr)
        if embedded is not None:
            check_address(embedded, allow_loopback=allow_loopback and addr in _V4_MAPPED)
            return
    if addr.is_loopback:
        if allow_loopback:
            return
        raise ForbiddenAddress(f"{addr} is a loopback address")
    for net in NOT_GLOBAL:
        if addr.version == net.version and addr in net:
            raise ForbiddenAddress(f"{addr} is not a public address (special-purpose {net})")
    if not addr.is_global or addr.is_reserved or addr.is_multicast:
        raise ForbiddenAddress(f"{addr} is not a public address")


def _encode_host(name: str) -> str:
    """A host name as sent: lower case ASCII (IDNA for non-ASCII), every label LDH."""
    name = unicodedata.normalize("NFC", name.lower())
    if not name.isascii():
        try:
            encoded = name.encode("idna").decode("ascii")
            back = encoded.encode("ascii").decode("idna")
        except UnicodeError as exc:
            raise ForbiddenAddress(f"host {name!r} is not a valid name: {exc}") from None
        if back != name:
            # IDNA 2003 (Python's codec) maps some characters away ("ß" to "ss", full-width
            # letters and dots to ASCII) where IDNA 2008 and browsers keep them: the name would
            # mean another host to the sender than to the user.
            raise ForbiddenAddress(
                f"host {name!r} is ambiguous between IDNA versions; give it as {encoded!r} "
                "if that is the host meant, or in its xn-- form"
            )
        name = encoded
    labels = name.rstrip(".").split(".")
    if len(name) > 253 or not all(_LABEL.match(lb) for lb in labels):
        raise ForbiddenAddress(f"host {name!r} is not a valid name")
    return name


def parse_url(url: str, *, local_mode: bool) -> WebhookUrl:
    """Parse and check the form of a webhook URL (not the addresses a name resolves to).

    Args:
        url: the ``webhook.url``.
        local_mode: the local stack, where ``http`` and any port are allowed too.

    Raises:
        ForbiddenAddress: the URL is malformed, ambiguous, or breaks a rule above.
    """
    if not isinstance(url, str) or not url:
        raise ForbiddenAddress("the URL is empty")
    if len(url) > MAX_URL_CHARS:
        raise ForbiddenAddress(f"the URL is longer than {MAX_URL_CHARS} characters")
    if any(c.isspace() or ord(c) < 0x20 or ord(c) == 0x7F for c in url):
        raise ForbiddenAddress("the URL has whitespace or control characters")
    if "\\" in url:
        raise ForbiddenAddress("the URL has a backslash")
    try:
        parts = urlsplit(url)
    except ValueError as exc:
        raise ForbiddenAddress(f"not a valid URL ({exc})") from None
    scheme = parts.scheme.lower()
    if scheme not in (("https", "http") if local_mode else ("https",)):
        raise ForbiddenAddress("the scheme must be https")
    netloc = parts.netloc
    if "@" in netloc:
        raise ForbiddenAddress("credentials in the URL are not allowed")
    if not netloc:
        raise ForbiddenAddress("the URL has no host")
    if "%" in netloc:
        raise ForbiddenAddress("percent-encoded hosts (and IPv6 zone ids) are not allowed")
    m = _BRACKETED.match(netloc) or _PLAIN.match(netloc)
    if m is None:
        raise ForbiddenAddress(f"the URL's host and port {netloc!r} are not valid")
    raw_host, raw_port = m.group(1), m.group(2)
    if netloc.startswith("["):
        try:
            literal: IPAddress | None = ipaddress.IPv6Address(raw_host)
        except ValueError:
            raise ForbiddenAddress(f"{raw_host!r} is not an IPv6 address") from None
    else:
        literal = parse_host(raw_host)
    host = str(literal) if literal is not None else _encode_host(raw_host)
    if not host.rstrip("."):
        raise ForbiddenAddress("the URL has no host")
    explicit = bool(raw_port)
    port = int(raw_port) if raw_port else DEFAULT_PORTS[scheme]
    _check_port(scheme, port, local_mode=local_mode)
    path = quote(parts.path or "/", safe=_PATH_SAFE)
    if not path.startswith("/"):
        path = "/" + path
    target = path + ("?" + quote(parts.query, safe=_QUERY_SAFE) if parts.query else "")
    return WebhookUrl(scheme, host, port, explicit, target, literal)


def _check_port(scheme: str, port: int, *, local_mode: bool) -> None:
    if not 1 <= port <= 65535:
        raise ForbiddenAddress(f"port {port} is not a valid port")
    if port == 443 or local_mode:
        return
    if port < FIRST_UNPRIVILEGED_PORT:
        raise ForbiddenAddress(
            f"port {port} is not allowed (443 or {FIRST_UNPRIVILEGED_PORT}..65535; see "
            "docs/webhooks.md, 'Ports')"
        )


def check_url(url: str, *, local_mode: bool, resolve: bool = True) -> WebhookUrl:
    """Check a webhook URL at submit time; returns it parsed.

    Args:
        url: the ``webhook.url`` of a request.
        local_mode: on the local stack, http and loopback addresses are allowed too.
        resolve: resolve host names and refuse one that resolves to a forbidden address (a name
            that does not resolve now is accepted; it is checked again at send).

    Raises:
        InvalidRequest: naming the field ``webhook.url``.
    """
    try:
        parsed = parse_url(url, local_mode=local_mode)
        if parsed.address is not None:
            check_address(parsed.address, allow_loopback=local_mode)
            return parsed
        name = parsed.host.rstrip(".")
        if not local_mode and (name in _LOOPBACK_NAMES or name.endswith(".localhost")):
            raise ForbiddenAddress(f"{name} is a loopback address")
        if not resolve:
            return parsed
        try:
            infos = resolve_within(
                _getaddrinfo, parsed.host, parsed.port, time.monotonic() + SUBMIT_RESOLVE_SECONDS
            )
        except (OSError, UnicodeError):  # TimeoutError included
            return parsed
        for info in infos:
            addr = ipaddress.ip_address(str(info[4][0]).split("%", 1)[0])
            check_address(addr, allow_loopback=local_mode)
        return parsed
    except ForbiddenAddress as exc:
        msg = str(exc)
        raise InvalidRequest(
            f"webhook.url is not allowed: {msg}",
            [{"field": "webhook.url", "message": msg, "type": "url"}],
        ) from None


def _getaddrinfo(host: str, port: int) -> list[Any]:
    return socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)


#: ``getaddrinfo``-like: ``(host, port) -> [(family, type, proto, canonname, sockaddr), ...]``.
Resolver = Callable[[str, int], list[Any]]


def resolve_within(resolver: Resolver, host: str, port: int, deadline: float) -> list[Any]:
    """``resolver(host, port)`` (``getaddrinfo``-like), given up at ``deadline``.

    ``getaddrinfo`` has no timeout of its own, so it runs in a daemon thread; one that is still
    waiting at the deadline is left to finish on its own.

    Raises:
        TimeoutError: the name was not resolved by the deadline.
        OSError, UnicodeError: as the resolver.
    """
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["infos"] = resolver(host, port)
        except BaseException as exc:  # handed to the caller
            box["error"] = exc

    t = threading.Thread(target=run, name="webhook-resolve", daemon=True)
    t.start()
    t.join(max(0.0, deadline - time.monotonic()))
    if t.is_alive():
        raise TimeoutError(f"{host} was not resolved before the attempt's deadline")
    if "error" in box:
        raise box["error"]
    infos: list[Any] = box["infos"]
    return infos
