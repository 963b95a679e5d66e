"""What one response costs in memory, whatever its framing, and what a connection keeps.

Driven on the connection protocol alone (a stub transport, reads handed over exactly), so
that tracemalloc sees the client's own allocations and nothing of a server's.
"""

from __future__ import annotations

import asyncio
import gc
import tracemalloc
from typing import Final

import pytest

from metacrate_grid_agent._aio._http import Response, _Connection
from tests.llm_transport.client.protocol_support import exchange

MiB: Final = 1024 * 1024
KiB: Final = 1024
#: The body cap of these tests.
CAP: Final = MiB
#: What an exchange may allocate besides the body: the parser, the reads, the response.
CONSTANT: Final = 256 * KiB


def _chunked(size: int, total: int) -> bytes:
    """A chunked 200 whose body is ``total`` bytes in chunks of ``size``."""
    chunk = b"%x\r\n%b\r\n" % (size, b"x" * size)
    whole, rest = divmod(total, size)
    tail = b"%x\r\n%b\r\n" % (rest, b"x" * rest) if rest else b""
    head = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
    return head + chunk * whole + tail + b"0\r\n\r\n"


@pytest.mark.parametrize("size", [1, 2, 7, 4 * KiB, 16 * KiB])
async def test_body_memory_is_bounded_by_the_cap_whatever_the_chunk_sizes(size: int) -> None:
    """A body at the cap in chunks of 1 byte to 16 KiB: the exchange's peak memory stays
    within about twice the cap (the one growing buffer, and the bytes handed on) plus a
    constant, never one object per chunk. The outcome is the body, or a typed refusal of
    framing that passed its bound (small chunks of a body this long)."""
    raw = _chunked(size, CAP)
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        tracemalloc.reset_peak()
        settled = await exchange(raw, [], cap=CAP)
        peak = tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()
    assert settled.outcome[3:5] == (b"x" * CAP, True) or settled.outcome == ("BadResponseError",)
    assert peak <= 2 * CAP + CONSTANT, f"peak {peak} bytes for chunks of {size}"


def _held(root: object) -> int:
    """Bytes of every bytes or bytearray object reachable from ``root`` through containers,
    futures, responses and the connection's own fields (not its fixed read buffer)."""
    seen: set[int] = set()
    pending = [root]
    total = 0
    while pending:  # bounded: each object once
        obj = pending.pop()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        if isinstance(obj, bytes | bytearray):
            total += len(obj)
        elif isinstance(obj, dict | list | tuple | set | Response | asyncio.Future | _Connection):
            pending += gc.get_referents(obj)
    return total


@pytest.mark.parametrize("framing", ["content-length", "chunked"])
async def test_an_idle_connection_holds_no_response(framing: str) -> None:
    """After a 3 MiB reply, the connection that goes back to the pool keeps no part of it
    (body, pieces, the settled future): it is released when the exchange ends, not at the
    connection's next use, its close or the pool-idle expiry."""
    body = b"x" * (3 * MiB)
    if framing == "chunked":
        raw = _chunked(4 * KiB, len(body))
    else:
        raw = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%b" % (len(body), body)
    settled = await exchange(raw, [], cap=4 * MiB)
    assert (settled.outcome[3], settled.kept) == (body, True)
    connection = settled.connection
    del settled
    assert _held(connection) < 64 * KiB
