"""One deadline for a whole webhook attempt: name resolution, connect, TLS handshake, sending the
request and receiving the answer together (spec, "Events": "no answer in 10 s").

httpx's timeouts are per operation (each ``recv`` may wait the read timeout again), so a receiver
that trickles one byte a second, or reads the request a byte a second, would hold an attempt for
ever. Here every socket operation gets the time left until one deadline (``time.monotonic()``
seconds) and nothing more:

* :class:`DeadlineBackend`, an ``httpcore`` network backend wrapping ``httpcore.SyncBackend``:
  ``connect_tcp`` and ``start_tls`` get the time left (CPython bounds a whole TLS handshake, read
  or write by one timeout); writes are sent a piece at a time, each ``send`` with the time left;
* :class:`DeadlineTransport`, an ``httpx`` transport over an ``httpcore`` connection pool using
  that backend (no keep-alive, no retries, HTTP/1.1);
* name resolution within the deadline: :func:`asyncinfer.webhooks.urls.resolve_within`.

Errors are httpx's: :class:`httpx.TimeoutException` once the deadline has passed.
"""

from __future__ import annotations

import ssl
import time
from collections.abc import Iterable, Iterator
from typing import Any

import httpcore
import httpx

#: Largest piece handed to one ``send`` call, bytes.
WRITE_CHUNK_BYTES = 16 * 1024


def time_left(deadline: float) -> float:
    """Seconds until ``deadline`` (monotonic); raises ``TimeoutError`` when it has passed."""
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError("the attempt's deadline has passed")
    return left


class DeadlineStream(httpcore.NetworkStream):
    """A network stream whose every operation ends by the deadline."""

    def __init__(self, inner: httpcore.NetworkStream, deadline: float) -> None:
        self._inner = inner
        self._deadline = deadline

    def _left(self, timeout_cls: type[Exception]) -> float:
        try:
            return time_left(self._deadline)
        except TimeoutError as exc:
            raise timeout_cls(str(exc)) from None

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        """One ``recv`` of at most ``max_bytes``, waiting at most the time left."""
        return self._inner.read(max_bytes, timeout=self._left(httpcore.ReadTimeout))

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        """Send ``buffer``; every ``send`` waits at most the time left, so a receiver reading
        slowly cannot stretch the write past the deadline."""
        sock = self._inner.get_extra_info("socket")
        if sock is None:  # pragma: no cover - httpcore's sync streams always have one
            self._inner.write(buffer, timeout=self._left(httpcore.WriteTimeout))
            return
        view = memoryview(buffer)
        try:
            while view:
                sock.settimeout(self._left(httpcore.WriteTimeout))
                sent = sock.send(view[:WRITE_CHUNK_BYTES])
                view = view[sent:]
        except TimeoutError as exc:  # socket.timeout is TimeoutError since Python 3.10
            raise httpcore.WriteTimeout(str(exc)) from None
        except OSError as exc:
            raise httpcore.WriteError(str(exc)) from None

    def close(self) -> None:
        """Close the connection."""
        self._inner.close()

    def start_tls(
        self,
        ssl_context: ssl.SSLContext,
        server_hostname: str | None = None,
        timeout: float | None = None,
    ) -> httpcore.NetworkStream:
        """The TLS handshake, within the time left."""
        left = self._left(httpcore.ConnectTimeout)
        return DeadlineStream(
            self._inner.start_tls(ssl_context, server_hostname, left), self._deadline
        )

    def get_extra_info(self, info: str) -> Any:
        """As the wrapped stream."""
        return self._inner.get_extra_info(info)


class DeadlineBackend(httpcore.NetworkBackend):
    """``httpcore.SyncBackend`` with every operation bounded by ``deadline`` (monotonic s)."""

    def __init__(self, deadline: float) -> None:
        self._inner = httpcore.SyncBackend()
        self.deadline = deadline

    def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.NetworkStream:
        """Connect within the time left."""
        try:
            left = time_left(self.deadline)
        except TimeoutError as exc:
            raise httpcore.ConnectTimeout(str(exc)) from None
        stream = self._inner.connect_tcp(host, port, left, local_address, socket_options)
        return DeadlineStream(stream, self.deadline)

    def connect_unix_socket(
        self, path: str, timeout: float | None = None, socket_options: Iterable[Any] | None = None
    ) -> httpcore.NetworkStream:  # pragma: no cover - webhooks never use unix sockets
        raise httpcore.UnsupportedProtocol("webhooks are sent over TCP only")

    def sleep(self, seconds: float) -> None:  # pragma: no cover - no retries are configured
        time.sleep(seconds)


class _ResponseStream(httpx.SyncByteStream):
    def __init__(self, stream: Iterable[bytes], request: httpx.Request) -> None:
        self._stream = stream
        self._request = request

    def __iter__(self) -> Iterator[bytes]:
        try:
            yield from self._stream
        except httpcore.TimeoutException as exc:
            raise httpx.ReadTimeout(str(exc), request=self._request) from exc
        except httpcore.NetworkError as exc:
            raise httpx.ReadError(str(exc), request=self._request) from exc
        except httpcore.ProtocolError as exc:
            raise httpx.RemoteProtocolError(str(exc), request=self._request) from exc

    def close(self) -> None:
        close = getattr(self._stream, "close", None)
        if close is not None:
            close()


def _httpx_error(exc: Exception, request: httpx.Request) -> httpx.TransportError:
    """The httpx exception of the same name as an httpcore one (httpx mirrors them)."""
    cls = getattr(httpx, type(exc).__name__, None)
    if isinstance(cls, type) and issubclass(cls, httpx.TransportError):
        return cls(str(exc), request=request)
    if isinstance(exc, httpcore.TimeoutException):
        return httpx.TimeoutException(str(exc), request=request)
    return httpx.TransportError(str(exc), request=request)


class DeadlineTransport(httpx.BaseTransport):
    """An httpx transport for one request whose network operations all end by ``deadline``.

    Args:
        deadline: ``time.monotonic()`` seconds by which the attempt is over.
        ssl_context: verifies the receiver's certificate (against the request's ``sni_hostname``
            extension, the URL's host name).
    """

    def __init__(self, deadline: float, ssl_context: ssl.SSLContext) -> None:
        self._pool = httpcore.ConnectionPool(
            ssl_context=ssl_context,
            max_connections=1,
            max_keepalive_connections=0,
            retries=0,
            http1=True,
            http2=False,
            network_backend=DeadlineBackend(deadline),
        )

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        """Send ``request``; raises httpx transport errors (timeouts included)."""
        assert isinstance(request.stream, httpx.SyncByteStream)
        req = httpcore.Request(
            method=request.method,
            url=httpcore.URL(
                scheme=request.url.raw_scheme,
                host=request.url.raw_host,
                port=request.url.port,
                target=request.url.raw_path,
            ),
            headers=request.headers.raw,
            content=request.stream,
            extensions=request.extensions,
        )
        try:
            resp = self._pool.handle_request(req)
        except httpcore.TimeoutException as exc:
            raise _httpx_error(exc, request) from exc
        except (httpcore.NetworkError, httpcore.ProtocolError, httpcore.UnsupportedProtocol) as exc:
            raise _httpx_error(exc, request) from exc
        assert isinstance(resp.stream, Iterable)
        return httpx.Response(
            status_code=resp.status,
            headers=resp.headers,
            stream=_ResponseStream(resp.stream, request),
            extensions=resp.extensions,
        )

    def close(self) -> None:
        """Close the pool (and its connection)."""
        self._pool.close()
