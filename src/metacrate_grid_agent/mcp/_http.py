"""The HTTP client handed to the MCP SDK: one exact URL, no redirects, bounded bodies.

The SDK's streamable-HTTP transport takes an ``httpx2.AsyncClient``; this module builds one
whose transport is wrapped by :class:`_ExactURLTransport`. What each rule rests on:

* Only the configured URL is ever requested: the wrapper refuses, before any byte is sent,
  a request for any other scheme, host, port, path or query (the SDK itself follows a
  same-origin redirect; ``max_redirects=0`` stops that, and the wrapper is the backstop
  for every other way a request could be aimed elsewhere).
* No redirect: the client follows none (``max_redirects=0``), so a 3xx reaches the SDK,
  which fails the message with an error.
* Bounded bodies: every response body is cut off with an error past ``max_response_bytes``
  (counted on the wire, before any decoding); the SDK's own per-event bound on
  server-sent events is set to the same value. The error fails only the request whose
  answer it was; the connection and later calls go on.
* No background stream: the SDK opens a GET stream for server-initiated messages, which
  this client does not use, and reconnects to it as fast as the server's ``retry:`` says
  (``retry: 0`` made a tight loop). A GET without ``Last-Event-ID`` is answered here with
  405, as a server without that stream answers, and never sent; a resumption GET is sent,
  but never sooner than ``MIN_RECONNECT_S`` after the previous one, the wait doubling
  (up to ``_MAX_RECONNECT_S``) while they keep coming.
* No decompression: the request asks for ``identity`` and a response with any other
  ``Content-Encoding`` is refused.
* No proxy and no certificate bundle from the environment (``trust_env=False``); no cookie
  is kept (``Set-Cookie`` headers are dropped before the client sees them).
* Timeouts: connect, write and pool at ``http_connect_timeout_s``; silence on a response
  at the read timeout the toolset derives (see ``McpLimits``). The loop's tool timeout
  bounds each call as a whole.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Mapping
from typing import Final

import anyio
import httpx2

__all__ = ["MIN_RECONNECT_S", "HttpTrace", "exact_url_client"]

_ALLOWED_ENCODINGS: Final = frozenset({"", "identity"})
#: Least wait between two resumption GETs, whatever ``retry:`` the server sent (0 looped).
MIN_RECONNECT_S: Final = 0.25
#: Longest wait the doubling reaches.
_MAX_RECONNECT_S: Final = 8.0
#: A resumption GET this long after the previous one starts the doubling afresh.
_RECONNECT_RESET_S: Final = 30.0


class _TooLargeError(httpx2.StreamError, httpx2.ReadError):
    """A body past ``max_response_bytes``.

    A read error for any caller, and a stream error for the SDK: its JSON response path
    catches that one and fails only the request, where an uncaught read error would end
    the connection and every later call with it.
    """

    def __init__(self, message: str, *, request: httpx2.Request) -> None:
        httpx2.ReadError.__init__(self, message, request=request)


class _CappedStream(httpx2.AsyncByteStream):
    """A response body that raises once more than ``limit`` bytes have arrived."""

    def __init__(self, inner: httpx2.AsyncByteStream, limit: int, request: httpx2.Request) -> None:
        self._inner = inner
        self._limit = limit
        self._request = request

    async def __aiter__(self) -> AsyncIterator[bytes]:
        seen = 0
        async for chunk in self._inner:
            seen += len(chunk)
            if seen > self._limit:
                raise _TooLargeError(
                    f"response body larger than max_response_bytes ({self._limit})",
                    request=self._request,
                )
            yield chunk

    async def aclose(self) -> None:
        await self._inner.aclose()


class HttpTrace:
    """What the client saw that the SDK's errors do not say: the last refusing status."""

    __slots__ = ("refused_status",)

    def __init__(self) -> None:
        self.refused_status: int | None = None


class _ExactURLTransport(httpx2.AsyncBaseTransport):
    """Sends only to one URL; bounds, un-cookies and refuses encoded response bodies."""

    def __init__(
        self, url: httpx2.URL, inner: httpx2.AsyncBaseTransport, limit: int, trace: HttpTrace
    ) -> None:
        self._url = url
        self._inner = inner
        self._limit = limit
        self._trace = trace
        self._last_resume: float | None = None
        self._resume_wait_s = 0.0

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        target = request.url
        if (target.scheme, target.host, target.port, target.raw_path) != (
            self._url.scheme,
            self._url.host,
            self._url.port,
            self._url.raw_path,
        ):
            raise httpx2.UnsupportedProtocol(
                "refused a request to a URL other than the configured MCP server URL",
                request=request,
            )
        if request.method == "GET" and "Last-Event-ID" not in request.headers:
            # The background stream for server-initiated messages, which this client does
            # not use: answered here as a server without one would answer.
            return httpx2.Response(405, request=request)
        if request.method == "GET":
            await self._space_resumption()
        request.headers["Accept-Encoding"] = "identity"
        response = await self._inner.handle_async_request(request)
        # The last answer decides: a refused probe followed by a good handshake is no cause.
        refused = response.status_code >= 300
        self._trace.refused_status = response.status_code if refused else None
        encoding = response.headers.get("Content-Encoding", "").strip().lower()
        if encoding not in _ALLOWED_ENCODINGS:
            await response.aclose()
            raise httpx2.RemoteProtocolError(
                "refused a compressed response body (Content-Encoding is not identity)",
                request=request,
            )
        headers = [
            (name, value)
            for name, value in response.headers.multi_items()
            if name.lower() != "set-cookie"
        ]
        stream = response.stream
        assert isinstance(stream, httpx2.AsyncByteStream)  # noqa: S101 - an async transport's body
        return httpx2.Response(
            response.status_code,
            headers=headers,
            stream=_CappedStream(stream, self._limit, request),
            extensions=response.extensions,
        )

    async def _space_resumption(self) -> None:
        """Wait before a resumption GET: MIN_RECONNECT_S, doubling while they come quickly."""
        now = time.monotonic()
        last = self._last_resume
        if last is None or now - last > _RECONNECT_RESET_S:
            self._resume_wait_s = 0.0
        else:
            self._resume_wait_s = min(
                _MAX_RECONNECT_S, max(MIN_RECONNECT_S, self._resume_wait_s * 2)
            )
            await anyio.sleep(max(0.0, last + self._resume_wait_s - now))
        self._last_resume = time.monotonic()

    async def aclose(self) -> None:
        await self._inner.aclose()


def exact_url_client(
    url: str,
    *,
    headers: Mapping[str, str] | None,
    connect_timeout_s: float,
    read_timeout_s: float,
    max_response_bytes: int,
    trace: HttpTrace | None = None,
) -> httpx2.AsyncClient:
    """An ``httpx2.AsyncClient`` that can reach ``url`` and nothing else (see the module doc)."""
    inner = httpx2.AsyncHTTPTransport(trust_env=False, retries=0)
    return httpx2.AsyncClient(
        headers=dict(headers or {}),
        timeout=httpx2.Timeout(connect_timeout_s, read=read_timeout_s),
        follow_redirects=False,
        max_redirects=0,
        trust_env=False,
        transport=_ExactURLTransport(
            httpx2.URL(url), inner, max_response_bytes, trace or HttpTrace()
        ),
    )
