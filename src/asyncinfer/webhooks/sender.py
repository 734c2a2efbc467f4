"""One webhook POST, safe against server-side request forgery.

The rules of the spec ("Events") hold at send time, against the address actually connected to:

1. the URL is checked again (https, or http on the local stack; no credentials; a host);
2. the host is resolved **once** (numeric forms such as ``2130706433`` are read as the addresses
   they denote); if any address it resolves to is forbidden
   (:func:`asyncinfer.webhook_urls.check_address`), nothing is sent;
3. the request goes to that address (the URL's host replaced by the IP), with the original
   ``Host`` header and, for https, the original TLS server name (SNI), against which the
   certificate is verified; so a second resolution (DNS rebinding) cannot redirect it;
4. 10 s timeout, redirects never followed, no proxies from the environment, no connection reuse
   (a pooled connection is keyed by IP, and must not carry another host's TLS session);
5. at most 1 KB of the answer is read and kept.
"""

from __future__ import annotations

import ipaddress
import logging
import socket
import ssl
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Literal

import httpx

from asyncinfer.errors import InvalidRequest
from asyncinfer.webhook_urls import (
    ForbiddenAddress,
    IPAddress,
    check_address,
    check_url,
    parse_host,
)

log = logging.getLogger("asyncinfer.webhooks")

#: No answer within this many seconds is a failed attempt (spec: 10 s).
TIMEOUT_SECONDS = 10.0
#: At most this much of a receiver's answer is kept, bytes.
MAX_RESPONSE_BYTES = 1024
USER_AGENT = "asyncinfer-webhooks/1"

Outcome = Literal["delivered", "retry", "gone", "refused"]
Resolver = Callable[[str, int], list[Any]]


@dataclass
class DeliveryResult:
    """What one attempt came to.

    ``outcome``: ``delivered`` (2xx), ``gone`` (410: stop), ``refused`` (the URL or the address it
    resolves to is forbidden: nothing was sent), ``retry`` (any other status, a timeout, a
    connection or name resolution error).
    """

    outcome: Outcome
    http_status: int | None = None
    response: str = ""
    error: str | None = None
    address: str | None = None


@lru_cache(maxsize=1)
def _ssl_context() -> ssl.SSLContext:
    try:
        import certifi

        return ssl.create_default_context(cafile=certifi.where())
    except ImportError:  # pragma: no cover - httpx depends on certifi
        return ssl.create_default_context()


def resolve_address(
    host: str, port: int, *, allow_loopback: bool, resolver: Resolver | None = None
) -> IPAddress:
    """Resolve ``host`` once and return the address to connect to.

    Raises:
        ForbiddenAddress: the host is, or resolves to (any of its addresses), a forbidden address.
        OSError: the name does not resolve (``socket.gaierror``); worth retrying later.
    """
    literal = parse_host(host)
    if literal is not None:
        addrs: list[IPAddress] = [literal]
    else:
        try:
            infos = (resolver or socket.getaddrinfo)(host, port)
        except UnicodeError as exc:
            raise ForbiddenAddress(f"host {host!r} cannot be encoded: {exc}") from None
        addrs = []
        for info in infos:
            addr = ipaddress.ip_address(str(info[4][0]).split("%", 1)[0])
            if addr not in addrs:
                addrs.append(addr)
        if not addrs:
            raise socket.gaierror(f"{host} resolved to no address")
    for addr in addrs:
        check_address(addr, allow_loopback=allow_loopback)
    return addrs[0]


class WebhookSender:
    """Sends webhook requests under the rules above.

    Args:
        local_mode: the local stack: http and loopback addresses are allowed.
        timeout: seconds without an answer before the attempt fails (10 in production).
        transport: an httpx transport to use instead of the network (tests).
        resolver: ``getaddrinfo``-like ``(host, port) -> infos`` (default ``socket.getaddrinfo``,
            looked up at call time so tests may patch it).
    """

    def __init__(
        self,
        *,
        local_mode: bool = False,
        timeout: float = TIMEOUT_SECONDS,
        transport: httpx.BaseTransport | None = None,
        resolver: Resolver | None = None,
    ) -> None:
        self.local_mode = local_mode
        self.timeout = timeout
        self.transport = transport
        self.resolver = resolver

    def _resolve(self, host: str, port: int) -> list[Any]:
        if self.resolver is not None:
            return self.resolver(host, port)
        return socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)

    def build_request(
        self, url: str, body: bytes, headers: Mapping[str, str]
    ) -> tuple[httpx.Request, str]:
        """The request to send for ``url``, aimed at the checked address; returns it and that
        address. Raises :class:`ForbiddenAddress` or ``OSError`` as :func:`resolve_address`."""
        try:
            check_url(url, local_mode=self.local_mode, resolve=False)
        except InvalidRequest as exc:
            raise ForbiddenAddress(exc.message) from None
        u = httpx.URL(url)
        port = u.port or (443 if u.scheme == "https" else 80)
        addr = resolve_address(u.host, port, allow_loopback=self.local_mode, resolver=self._resolve)
        host = u.raw_host.decode("ascii")
        if ":" in host and not host.startswith("["):
            host = f"[{host}]"
        host_header = host if u.port is None else f"{host}:{u.port}"
        extensions: dict[str, Any] = {
            "timeout": httpx.Timeout(self.timeout).as_dict(),
        }
        if u.scheme == "https":
            extensions["sni_hostname"] = u.raw_host.decode("ascii")
        request = httpx.Request(
            "POST",
            u.copy_with(host=str(addr)),
            content=body,
            headers={
                "Host": host_header,
                "Content-Type": "application/json",
                "User-Agent": USER_AGENT,
                "Accept-Encoding": "identity",
                **headers,
            },
            extensions=extensions,
        )
        return request, str(addr)

    def send(self, url: str, body: bytes, headers: Mapping[str, str]) -> DeliveryResult:
        """POST ``body`` with ``headers`` to ``url``; never raises for network trouble."""
        try:
            request, addr = self.build_request(url, body, headers)
        except ForbiddenAddress as exc:
            return DeliveryResult("refused", error=f"refused: {exc}")
        except OSError as exc:
            return DeliveryResult("retry", error=f"name resolution failed: {exc}")
        transport = self.transport or httpx.HTTPTransport(
            verify=_ssl_context(),
            trust_env=False,
            retries=0,
            limits=httpx.Limits(max_keepalive_connections=0),
        )
        started = time.monotonic()
        try:
            with httpx.Client(
                transport=transport,
                timeout=self.timeout,
                follow_redirects=False,
                trust_env=False,
            ) as client:
                response = client.send(request, stream=True, follow_redirects=False)
                try:
                    kept = bytearray()
                    if response.is_stream_consumed:  # read already (mock transports)
                        kept.extend(response.content[:MAX_RESPONSE_BYTES])
                    else:
                        # Raw bytes (no decompression), at most 1 KB, within the time limit.
                        for chunk in response.iter_raw(MAX_RESPONSE_BYTES):
                            kept.extend(chunk)
                            if len(kept) >= MAX_RESPONSE_BYTES:
                                break
                            if time.monotonic() - started > self.timeout:
                                break
                finally:
                    response.close()
        except httpx.TimeoutException:
            return DeliveryResult(
                "retry", error=f"no answer within {self.timeout:g} s", address=addr
            )
        except httpx.HTTPError as exc:
            return DeliveryResult("retry", error=f"{type(exc).__name__}: {exc}"[:300], address=addr)
        status = response.status_code
        text = bytes(kept[:MAX_RESPONSE_BYTES]).decode("utf-8", errors="replace")
        if 200 <= status < 300:
            outcome: Outcome = "delivered"
        elif status == 410:
            outcome = "gone"
        else:
            outcome = "retry"
        return DeliveryResult(outcome, http_status=status, response=text, address=addr)
