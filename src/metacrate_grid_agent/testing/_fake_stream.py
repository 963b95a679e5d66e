"""One connection's bytes for the fake endpoint: a bounded inbox and counted, drained writes.

`Stream` reads a request's head and body under caps (`TooLongError` past a cap), writes a
reply piece by piece and counts it in the connection's `ConnectionRecord`, pauses in ways
that end at once when the client leaves (`ClientGoneError`), and closes with FIN or RST in
bounded time. `_fake_endpoint` decides what to read and write; `_fake_wire` makes the bytes.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
from typing import Final

from metacrate_grid_agent.testing._fake_wire import MAX_HEADER_BYTES, ConnectionRecord

__all__ = [
    "CLOSE_TIMEOUT_S",
    "READ_AHEAD_BYTES",
    "READ_CHUNK_BYTES",
    "ClientGoneError",
    "Stream",
    "TooLongError",
]

READ_CHUNK_BYTES: Final = 64 * 1024
"""Largest single read from a connection (also the StreamReader's buffer limit)."""
READ_AHEAD_BYTES: Final = MAX_HEADER_BYTES
"""While a reply is written, read at most this much of the next request (to notice a close)."""
CLOSE_TIMEOUT_S: Final = 2.0
"""A clean close (FIN, or TLS close_notify) that takes longer than this becomes an abort."""

#: SO_LINGER on with a zero timeout: closing the socket then sends RST, not FIN.
_LINGER_ZERO: Final = struct.pack("ii", 1, 0)


class ClientGoneError(Exception):
    """The client closed or reset the connection (or left mid-request); stop quietly."""


class TooLongError(Exception):
    """A header block or chunk-size line passed its cap."""


class Stream:
    """One connection's bytes: a bounded inbox over the reader, and counted, drained writes."""

    def __init__(
        self, record: ConnectionRecord, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        self.record = record
        self.reader = reader
        self.writer = writer
        self.buffer = bytearray()
        self.eof = False
        self.gone = asyncio.Event()

    async def _fill(self) -> None:
        try:
            data = await self.reader.read(READ_CHUNK_BYTES)
        except OSError:  # reset by the client; TLS errors are OSErrors too
            data = b""
        if not data:
            self.eof = True
            self.gone.set()
            return
        self.buffer += data
        self.record.bytes_received += len(data)

    async def read_until(self, delimiter: bytes, limit: int) -> bytes | None:
        """Return bytes up to and including `delimiter`, or None on EOF between messages."""
        start = 0
        while True:  # bounded: every pass reads more, and the buffer is capped by `limit`
            found = self.buffer.find(delimiter, start)
            if found >= 0:
                end = found + len(delimiter)
                if end > limit:
                    raise TooLongError
                data = bytes(self.buffer[:end])
                del self.buffer[:end]
                return data
            if len(self.buffer) >= limit:
                raise TooLongError
            if self.eof:
                if self.buffer:
                    raise ClientGoneError
                return None
            start = max(0, len(self.buffer) - len(delimiter) + 1)
            await self._fill()

    async def read_exact(self, size: int) -> bytes:
        """Return exactly `size` bytes (the caller caps `size`)."""
        while len(self.buffer) < size:  # bounded: every pass reads more, up to `size`
            if self.eof:
                raise ClientGoneError
            await self._fill()
        data = bytes(self.buffer[:size])
        del self.buffer[:size]
        return data

    async def watch(self) -> None:
        """Read ahead while a reply is written, so that `gone` is set when the client leaves."""
        while not self.eof and len(self.buffer) < READ_AHEAD_BYTES:
            await self._fill()

    async def write(self, data: bytes) -> None:
        """Write and drain one piece (with the buffer limit at 0, drained means in the kernel)."""
        if self.gone.is_set() or self.writer.transport.is_closing():
            raise ClientGoneError
        try:
            self.writer.write(data)
            await self.writer.drain()
        except OSError as exc:  # ConnectionResetError, BrokenPipeError: the client left
            raise ClientGoneError from exc
        self.record.bytes_sent += len(data)
        self.record.writes += 1

    async def pause(self, seconds: float) -> None:
        """Sleep `seconds`, unless the client leaves first (then raise ClientGoneError)."""
        if seconds > 0:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(seconds):
                    await self.gone.wait()
        if self.gone.is_set():
            raise ClientGoneError

    async def close(self, *, abort: bool, linger: bool) -> None:
        """Close with FIN after the buffer, or `abort` (with `linger`: RST), in bounded time."""
        transport = self.writer.transport
        if abort:
            sock = self.writer.get_extra_info("socket")
            if linger and sock is not None:
                with contextlib.suppress(OSError):
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER_ZERO)
            transport.abort()
        else:
            self.writer.close()
        try:
            async with asyncio.timeout(CLOSE_TIMEOUT_S):
                await self.writer.wait_closed()
        except (TimeoutError, OSError):  # the client stopped reading, or reset first
            transport.abort()
        except asyncio.CancelledError:
            transport.abort()
            raise
