"""Tells a response head cut off partway from a connection that never answered.

A connection lost after some bytes of the response head arrived means the endpoint received
the request and may have acted on it: that is a protocol error, never retried. A connection
lost before any response byte is a transport failure the retry policy may retry. aiohttp's
public errors lose the difference: a reset is ``ClientOSError`` whether or not bytes came
first, and a clean close is ``ServerDisconnectedError`` whose ``message`` holds the partial
head only when the parser can make a message of it (always with the C parser; with the
pure-Python one only for some cuts, e.g. not inside the status line or a header name).

So the client's connector builds :class:`_WatchedHandler`, aiohttp's own response protocol
with three observations added, and nothing else changed: bytes received since the request's
response parameters were set, whether that response's final head was parsed, and, when the
connection is lost in between, the error aiohttp raises is replaced by
:class:`HeadCutOffError`. It watches decrypted bytes (under TLS a session ticket is not a
response byte) and is reset per request on a pooled connection.

:func:`watch` installs it only on the aiohttp versions it was checked against; elsewhere the
client keeps aiohttp's behaviour (the loss stays retryable), and a test fails loudly.
"""

from __future__ import annotations

import functools
from typing import Any, Final

import aiohttp
from aiohttp.client_proto import ResponseHandler
from aiohttp.http import RawResponseMessage
from aiohttp.streams import StreamReader

__all__ = ["HeadCutOffError", "watch"]

#: aiohttp versions (major, minor) whose ResponseHandler this hook was checked against:
#: the floor the project declares, up to the next major version.
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


def _version() -> tuple[int, int] | None:
    parts = aiohttp.__version__.split(".")
    try:
        return int(parts[0]), int(parts[1])
    except (IndexError, ValueError):
        return None


def watch(connector: aiohttp.TCPConnector) -> bool:
    """Make ``connector`` build :class:`_WatchedHandler`; False (nothing changed) when this
    aiohttp is not one the hook was checked against, or builds its protocol another way."""
    version = _version()
    factory = getattr(connector, "_factory", None)
    if (
        version is None
        or not SUPPORTED[0] <= version < SUPPORTED[1]
        or not isinstance(factory, functools.partial)
        or factory.func is not ResponseHandler
    ):
        return False
    handler: type[ResponseHandler] = _WatchedHandler
    connector._factory = functools.partial(handler, *factory.args, **factory.keywords)
    return True
