"""A minimal loopback chat-completions server for benchmarks, run in its own process.

It answers every POST with the same small completion, so the client side's CPU is what the
benchmark measures. It prints its port on the first line of stdout and stops on stdin EOF
or after ``--lifetime`` seconds, whichever comes first.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import subprocess
import sys
from collections.abc import Iterator

from aiohttp import web

BODY = (
    b'{"id":"b","object":"chat.completion","created":0,"model":"bench","choices":[{"index":0,'
    b'"message":{"role":"assistant","content":"The lamp is on.","tool_calls":[{"id":"call_1",'
    b'"type":"function","function":{"name":"move_to","arguments":"{\\"x\\":3,\\"y\\":4}"}}]},'
    b'"finish_reason":"tool_calls"}],"usage":{"prompt_tokens":50,"completion_tokens":9,'
    b'"total_tokens":59}}'
)


async def _answer(request: web.Request) -> web.Response:
    await request.read()
    return web.Response(body=BODY, content_type="application/json")


#: Bytes one endless response sends before giving up on a client that keeps reading.
ENDLESS_LIMIT = 1 << 30


async def _endless(request: web.Request) -> web.StreamResponse:
    await request.read()
    response = web.StreamResponse(headers={"Content-Type": "application/json"})
    await response.prepare(request)
    chunk = b"a" * 65536
    sent = 0
    try:
        await response.write(b'{"choices":[{"message":{"content":"')
        while sent < ENDLESS_LIMIT:
            await response.write(chunk)
            sent += len(chunk)
    except (ConnectionError, RuntimeError):
        pass  # the client closed the connection at its cap, as it should
    return response


async def _main(lifetime: float) -> None:
    app = web.Application()
    app.router.add_post("/endless", _endless)
    app.router.add_post("/{tail:.*}", _answer)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    sys.stdout.write(f"{port}\n")
    sys.stdout.flush()
    loop = asyncio.get_running_loop()
    eof = loop.run_in_executor(None, sys.stdin.read)
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(eof, timeout=lifetime)
    await runner.cleanup()


@contextlib.contextmanager
def serve(lifetime_s: float = 600.0) -> Iterator[str]:
    """Run this server in a child process; yield its origin ``http://127.0.0.1:PORT``."""
    server = subprocess.Popen(  # noqa: S603 - our own module, fixed arguments
        [sys.executable, "-m", "benchmarks._server", "--lifetime", str(lifetime_s)],
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
        server.wait(timeout=10)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--lifetime", type=float, default=300.0)
    asyncio.run(_main(parser.parse_args().lifetime))
