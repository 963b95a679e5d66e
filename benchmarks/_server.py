"""A minimal loopback chat-completions server for benchmarks, run in its own process.

Plain asyncio streams, so the server's own CPU stays small and every byte it sends is under
its control. Routes (POST; the rest of the path is ignored, so an SDK can append its own
``/chat/completions``):

- ``/v1/...``: the same small completion every time (one tool call), keep-alive.
- ``/loop/<n>/...``: two tool calls per reply while the request carries fewer than ``2n``
  tool results, then a final text reply: a session of ``n`` tool turns and a final answer.
- ``/stall/...``: reads the request and never answers (a request in flight, for supersession).
- ``/endless-chunked/<limit>/...``, ``/endless-close/<limit>/...``, ``/huge-length/<limit>/...``:
  hostile bodies. An endless chunked body, an endless close-delimited body, and a body that
  declares 10 GiB; each stops after ``limit`` bytes (a guard for clients without a cap).

It prints its port on the first line of stdout and stops when its stdin reaches EOF: when
the run that started it leaves ``serve()`` or dies (the kernel closes the pipe then), never
at a time of its own, so a run however slow keeps its server.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import subprocess
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Iterator

BODY = (
    b'{"id":"b","object":"chat.completion","created":0,"model":"bench","choices":[{"index":0,'
    b'"message":{"role":"assistant","content":"The lamp is on.","tool_calls":[{"id":"call_1",'
    b'"type":"function","function":{"name":"move_to","arguments":"{\\"x\\":3,\\"y\\":4}"}}]},'
    b'"finish_reason":"tool_calls"}],"usage":{"prompt_tokens":50,"completion_tokens":9,'
    b'"total_tokens":59}}'
)
FINAL = (
    b'{"id":"f","object":"chat.completion","created":0,"model":"bench","choices":[{"index":0,'
    b'"message":{"role":"assistant","content":"I am next to the lamp."},'
    b'"finish_reason":"stop"}],"usage":{"prompt_tokens":50,"completion_tokens":7,'
    b'"total_tokens":57}}'
)
#: How long ``serve()`` waits for the server to exit once told to, before killing it.
STOP_TIMEOUT_S = 10.0
_TOOL_RESULT = re.compile(rb'"role"\s*:\s*"tool"')


def tool_turn_body(turn: int) -> bytes:
    """The reply of tool turn ``turn``: two calls of ``move_to`` with fresh ids."""
    calls = b",".join(
        b'{"id":"call_%d_%d","type":"function","function":{"name":"move_to",'
        b'"arguments":"{\\"x\\":%d,\\"y\\":4}"}}' % (turn, i, i)
        for i in (1, 2)
    )
    return (
        b'{"id":"t","object":"chat.completion","created":0,"model":"bench","choices":[{"index":0,'
        b'"message":{"role":"assistant","content":null,"tool_calls":[' + calls + b"]},"
        b'"finish_reason":"tool_calls"}],"usage":{"prompt_tokens":50,"completion_tokens":9,'
        b'"total_tokens":59}}'
    )


_TOOL_TURNS = [tool_turn_body(turn) for turn in range(64)]
_CHUNK = b"a" * 65536
_OPEN = b'{"choices":[{"message":{"content":"'


def _head(body: bytes) -> bytes:
    return b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(
        body
    )


def _reply(path: str, body: bytes) -> bytes:
    if path.startswith("/loop/"):
        tool_turns = int(path.split("/")[2])
        done = len(_TOOL_RESULT.findall(body)) // 2
        reply = FINAL if done >= tool_turns else _TOOL_TURNS[done]
        return _head(reply) + reply
    return _head(BODY) + BODY


async def _hostile(kind: str, limit: int, writer: asyncio.StreamWriter) -> None:
    if kind == "endless-chunked":
        writer.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked"
            b"\r\n\r\n%x\r\n%s\r\n" % (len(_OPEN), _OPEN)
        )
        piece = b"%x\r\n%s\r\n" % (len(_CHUNK), _CHUNK)
    else:
        declared = b"Content-Length: 10737418240\r\n" if kind == "huge-length" else b""
        writer.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n"
            + declared
            + b"\r\n"
            + _OPEN
        )
        piece = _CHUNK
    sent = 0
    while sent < limit:
        writer.write(piece)
        sent += len(_CHUNK)
        await writer.drain()


async def _connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError):
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            path = head.split(b" ", 2)[1].decode("ascii")
            match = re.search(rb"(?i)\r\ncontent-length:\s*(\d+)", head)
            body = await reader.readexactly(int(match.group(1))) if match else b""
            kind = path.split("/")[1]
            if kind == "stall":
                await reader.read()  # until the client closes the connection
                break
            if kind in ("endless-chunked", "endless-close", "huge-length"):
                await _hostile(kind, int(path.split("/")[2]), writer)
                break
            writer.write(_reply(path, body))
    writer.close()


async def _main() -> None:
    server = await asyncio.start_server(_connection, "127.0.0.1", 0, backlog=4096)
    port = server.sockets[0].getsockname()[1]
    sys.stdout.write(f"{port}\n")
    sys.stdout.flush()
    loop = asyncio.get_running_loop()
    # Until the parent closes the pipe, explicitly or by exiting in any way.
    await loop.run_in_executor(None, sys.stdin.buffer.read)
    server.close()


@contextlib.contextmanager
def serve() -> Iterator[str]:
    """Run this server in a child process; yield its origin ``http://127.0.0.1:PORT``.

    The server lives as long as the ``with`` block (or this process, if it dies first).
    """
    server = subprocess.Popen(
        [sys.executable, "-m", "benchmarks._server"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert server.stdout is not None
        yield f"http://127.0.0.1:{int(server.stdout.readline())}"
    finally:
        assert server.stdin is not None
        server.stdin.close()
        try:
            server.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
        finally:
            assert server.stdout is not None
            server.stdout.close()


if __name__ == "__main__":
    asyncio.run(_main())
