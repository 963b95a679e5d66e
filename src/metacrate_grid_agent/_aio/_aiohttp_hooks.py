"""Every use of aiohttp's and asyncio's private parts, behind one version gate.

The client needs two things aiohttp does not offer publicly; both live here, and
:func:`checked` gates both: on an aiohttp version they were not checked against, neither
is installed, the client keeps aiohttp's own behaviour, and a test fails loudly.

**A response head cut off partway** (:func:`watch`). A connection lost after some bytes of
the response head arrived means the endpoint received the request and may have acted on it:
that is a protocol error, never retried. A connection lost before any response byte is a
transport failure the retry policy may retry. aiohttp's public errors lose the difference: a
reset is ``ClientOSError`` whether or not bytes came first, and a clean close is
``ServerDisconnectedError`` whose ``message`` holds the partial head only when the parser
can make a message of it (always with the C parser; with the pure-Python one only for some
cuts, e.g. not inside the status line or a header name). So the connector's private protocol
factory (``connector._factory``) is made to build :class:`_WatchedHandler`, aiohttp's own
response protocol with three observations added, and nothing else changed: bytes received
since the request's response parameters were set, whether that response's final head was
parsed, and, when the connection is lost in between, the error aiohttp raises is replaced by
:class:`HeadCutOffError`. It watches decrypted bytes (under TLS a session ticket is not a
response byte) and is reset per request on a pooled connection. Elsewhere the loss stays
retryable.

**Smaller socket reads while a body is read** (:func:`limit_read_size`): asyncio's selector
transport reads ``max_size`` bytes at a time (256 KiB), an undocumented attribute; setting
it lower bounds how far an endless body gets past the cap. Elsewhere reads keep asyncio's
size.
"""

from __future__ import annotations

import contextlib
import functools
from typing import Any, Final

import aiohttp
from aiohttp.client_proto import ResponseHandler
from aiohttp.http import RawResponseMessage
from aiohttp.streams import StreamReader

__all__ = ["HeadCutOffError", "checked", "limit_read_size", "watch"]

#: aiohttp versions (major, minor) these hooks were checked against (its ResponseHandler,
#: its connector's protocol factory): the floor the project declares, up to the next major.
SUPPORTED: Final = ((3, 11), (4, 0))


class HeadCutOffError(aiohttp.ClientConnectionError):
    """The connection was lost after ``received`` bytes of the response head arrived."""

    def __init__(self, received: int, lost: BaseException) -> None:
        super().__init__(f"connection lost after {received} bytes of the response head")
        self.received = received
        self.lost_as = type(lost).__name__


class _WatchedHandler(ResponseHandler):
    """aiohttp's response protocol, noting whether a lost connection cut a head short."""

    _head_bytes: int = 0
    _head_done: bool = True
    _cutting: bool = False

    def set_response_params(self, *args: Any, **kwargs: Any) -> None:
        """A new request: nothing of its response has arrived yet."""
        self._head_bytes = 0
        self._head_done = False
        super().set_response_params(*args, **kwargs)  # drains bytes that came early

    def data_received(self, data: bytes) -> None:
        """Count the bytes that arrive before the response's head is whole."""
        if not self._head_done:
            self._head_bytes += len(data)
        super().data_received(data)

    def feed_data(self, data: tuple[RawResponseMessage, StreamReader], size: int = 0) -> None:
        """A parsed head: the final one (not 1xx, as aiohttp's reader skips those) ends it."""
        code = data[0].code
        if not 100 <= code <= 199 or code == 101:
            self._head_done = True
        super().feed_data(data, size)

    def connection_lost(self, exc: BaseException | None) -> None:
        """While aiohttp reports the loss, say whether it cut a head short."""
        self._cutting = not self._head_done and self._head_bytes > 0
        try:
            super().connection_lost(exc)
        finally:
            self._cutting = False

    def set_exception(self, exc: BaseException, *args: Any, **kwargs: Any) -> None:
        """Replace the loss aiohttp reports for a head cut short by :class:`HeadCutOffError`."""
        if self._cutting and isinstance(
            exc, aiohttp.ServerDisconnectedError | aiohttp.ClientOSError
        ):
            exc = HeadCutOffError(self._head_bytes, exc)
        super().set_exception(exc, *args, **kwargs)


@functools.cache
def _checked(version: str) -> bool:
    parts = version.split(".")
    try:
        found = int(parts[0]), int(parts[1])
    except (IndexError, ValueError):
        return False
    return SUPPORTED[0] <= found < SUPPORTED[1]


def checked() -> bool:
    """Whether this aiohttp is one the hooks were checked against (the one gate of both).

    Read at each use, not once at import, so that a test can present another version.
    """
    return _checked(aiohttp.__version__)


def watch(connector: aiohttp.TCPConnector) -> bool:
    """Make ``connector`` build :class:`_WatchedHandler`; False (nothing changed) when this
    aiohttp is not one the hook was checked against, or builds its protocol another way."""
    factory = getattr(connector, "_factory", None)
    if (
        not checked()
        or not isinstance(factory, functools.partial)
        or factory.func is not ResponseHandler
    ):
        return False
    handler: type[ResponseHandler] = _WatchedHandler
    # The one hook into aiohttp's connector, behind the version gate above.
    connector._factory = functools.partial(handler, *factory.args, **factory.keywords)  # noqa: SLF001
    return True


def limit_read_size(response: aiohttp.ClientResponse, size: int) -> None:
    """Read the rest of this connection's data in pieces of at most ``size`` bytes.

    Only the first read of a new connection (the head, perhaps with the start of the body)
    is asyncio's full size. A transport without the setting (another event loop's, or TLS,
    whose reads its protocol sizes) keeps its own, as does every transport on an aiohttp
    the hooks were not checked against.
    """
    connection = response.connection
    transport = None if connection is None else connection.transport
    if (
        transport is not None
        and getattr(transport, "max_size", None) not in (None, size)
        and checked()
    ):
        with contextlib.suppress(AttributeError):
            transport.max_size = size  # type: ignore[attr-defined]
