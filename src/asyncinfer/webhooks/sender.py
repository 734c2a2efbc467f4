"""One webhook POST, safe against server-side request forgery.

The rules of the spec ("Events") hold at send time, against the address actually connected to:

1. the URL is parsed and checked again by the parser the submit-time check uses
   (:func:`asyncinfer.webhooks.urls.parse_url`); the request is built from its parts, never from
   the text, so the two cannot read a URL differently;
2. the host is resolved **once** (numeric forms such as ``2130706433`` are read as the addresses
   they denote); if any address it resolves to is forbidden
   (:func:`asyncinfer.webhooks.urls.check_address`), nothing is sent;
3. the request goes to that address (the URL's host replaced by the IP), with the original
   ``Host`` header and, for https, the original TLS server name (SNI), against which the
   certificate is verified; so a second resolution (DNS rebinding) cannot redirect it;
4. **one deadline** of 10 s for the whole attempt (resolution, connect, TLS, sending the request,
   receiving the status and headers: :mod:`.deadline`), not one per phase, so a receiver that
   trickles bytes is cut at 10 s; a status that arrived in time counts even if the body is
   still trickling then. Redirects never followed, no proxies from the environment, no
   connection reuse (a pooled connection is keyed by IP, and must not carry another host's TLS
   session);
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

from asyncinfer.webhooks.deadline import DeadlineTransport
from asyncinfer.webhooks.urls import (
    ForbiddenAddress,
    IPAddress,
    WebhookUrl,
    check_address,
    parse_host,
    parse_url,
    resolve_within,
)

log = logging.getLogger("asyncinfer.webhooks")

#: An attempt not over within this many seconds, all phases together, failed (spec: 10 s).
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
    connection or name resolution error). ``timed_out``: the attempt ran into its deadline.
    """

    outcome: Outcome
    http_status: int | None = None
    response: str = ""
    error: str | None = None
    address: str | None = None
    timed_out: bool = False


@lru_cache(maxsize=1)
def _ssl_context() -> ssl.SSLContext:
    try:
        import certifi

        return ssl.create_default_context(cafile=certifi.where())
    except ImportError:  # pragma: no cover - httpx depends on certifi
        return ssl.create_default_context()


def resolve_address(
    host: str,
    port: int,
    *,
    allow_loopback: bool,
    resolver: Resolver | None = None,
    deadline: float | None = None,
) -> IPAddress:
    """Resolve ``host`` once and return the address to connect to.

    Args:
        deadline: ``time.monotonic()`` seconds by which the name must be resolved.

    Raises:
        ForbiddenAddress: the host is, or resolves to (any of its addresses), a forbidden address.
        OSError: the name does not resolve (``socket.gaierror``) or not by the deadline
            (``TimeoutError``); worth retrying later.
    """
    literal = parse_host(host)
    if literal is not None:
        addrs: list[IPAddress] = [literal]
    else:
        resolve = resolver or socket.getaddrinfo
        try:
            if deadline is None:
                infos = resolve(host, port)
            else:
                infos = resolve_within(resolve, host, port, deadline)
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
        timeout: seconds one attempt may take, all phases together (10 in production).
        transport: an httpx transport to use instead of the network (tests); the deadline then
            bounds only what this class itself waits for (resolution, reading the answer).
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
        self, url: str, body: bytes, headers: Mapping[str, str], *, deadline: float | None = None
    ) -> tuple[httpx.Request, str]:
        """The request to send for ``url``, aimed at the checked address; returns it and that
        address. Raises :class:`ForbiddenAddress` or ``OSError`` as :func:`resolve_address`."""
        u: WebhookUrl = parse_url(url, local_mode=self.local_mode)
        addr = resolve_address(
            u.host,
            u.port,
            allow_loopback=self.local_mode,
            resolver=self._resolve,
            deadline=deadline,
        )
        left = self.timeout if deadline is None else max(0.001, deadline - time.monotonic())
        extensions: dict[str, Any] = {"timeout": httpx.Timeout(left).as_dict()}
        if u.scheme == "https":
            extensions["sni_hostname"] = u.host
        target = httpx.URL(
            scheme=u.scheme,
            host=str(addr),
            port=u.port if u.explicit_port else None,
            raw_path=u.target.encode("ascii"),
        )
        request = httpx.Request(
            "POST",
            target,
            content=body,
            headers={
                "Host": u.host_header,
                "Content-Type": "application/json",
                "User-Agent": USER_AGENT,
                "Accept-Encoding": "identity",
                **headers,
            },
            extensions=extensions,
        )
        return request, str(addr)

    def send(
        self,
        url: str,
        body: bytes,
        headers: Mapping[str, str],
        *,
        deadline: float | None = None,
    ) -> DeliveryResult:
        """POST ``body`` with ``headers`` to ``url``; never raises for network trouble.

        Args:
            deadline: ``time.monotonic()`` seconds by which the attempt must be over, when that
                is sooner than ``timeout`` from now (the dispatcher's share of its Lambda's time).
        """
        started = time.monotonic()
        end = started + self.timeout if deadline is None else min(started + self.timeout, deadline)
        try:
            request, addr = self.build_request(url, body, headers, deadline=end)
        except ForbiddenAddress as exc:
            return DeliveryResult("refused", error=f"refused: {exc}")
        except TimeoutError:
            return DeliveryResult(
                "retry", error=f"no answer within {end - started:.3g} s", timed_out=True
            )
        except OSError as exc:
            return DeliveryResult("retry", error=f"name resolution failed: {exc}")
        transport = self.transport or DeadlineTransport(end, _ssl_context())
        try:
            with httpx.Client(
                transport=transport,
                follow_redirects=False,
                trust_env=False,
            ) as client:
                response = client.send(request, stream=True, follow_redirects=False)
                try:
                    kept = _read_some(response, end)
                finally:
                    response.close()
        except httpx.TimeoutException:
            return DeliveryResult(
                "retry",
                error=f"no answer within {end - started:.3g} s",
                address=addr,
                timed_out=True,
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


def _read_some(response: httpx.Response, deadline: float) -> bytearray:
    """At most 1 KB of the answer's body, raw (no decompression), read until the deadline. The
    status has arrived and decides the outcome; the body is kept only to show it, so an error
    or the deadline while reading it just ends the reading."""
    kept = bytearray()
    if response.is_stream_consumed:  # read already (mock transports)
        kept.extend(response.content[:MAX_RESPONSE_BYTES])
        return kept
    try:
        for chunk in response.iter_raw():  # as they arrive: a timeout loses none
            kept.extend(chunk)
            if len(kept) >= MAX_RESPONSE_BYTES or time.monotonic() >= deadline:
                break
    except httpx.HTTPError:
        pass
    return kept
