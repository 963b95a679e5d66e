"""CPU per request: this library's client against the floor, raw aiohttp and peers, in one run.

The endpoint runs in its own process on loopback, so only client-side CPU is counted
(``time.process_time``). Every contender sends the same realistic request (system prompt,
12 messages, 8 tools) and reads the same reply:

- hand-written floor: an asyncio ``Protocol`` on one keep-alive connection writing prebuilt
  request bytes and reading the reply by its ``Content-Length``; what one request costs
  with no HTTP library at all (the issue's floor).
- streams floor: the same over asyncio streams (``readuntil``, ``readexactly``).
- raw aiohttp: a default session posting the bytes this library encodes; no decoding.
- aiohttp as ours: the same, with the session and request options this library uses.
- ours: ``LLMClient.complete`` (serialise, post, read capped, decode, validate, map).
- httpx, openai SDK (``max_retries=0``): optional peers, from the ``bench`` group.

Contenders alternate within each round (the order rotates); each round runs every contender
in a fresh event loop, warm-up excluded. Reported: the median CPU per request and the median
of the per-round ratios against raw aiohttp (paired: same round, same machine load).

Run alone: ``uv run --locked python -m benchmarks.bench_transport [--requests N] [--rounds R]``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import importlib.util
import statistics
import time
import urllib.parse
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from benchmarks import _scenario
from benchmarks._server import serve
from metacrate_grid_agent import LLMClient, LLMConfig, Secret

Once = Callable[[], Awaitable[object]]
Contender = Callable[[str], contextlib.AbstractAsyncContextManager[Once]]

#: Requests in flight at once for ours and aiohttp as ours (the default is 4): at 64
#: concurrent requests, 60 would otherwise wait in line, and the count would be the line's.
SLOTS = 64

HEADERS = {
    "Authorization": "Bearer sk-bench",
    "Content-Type": "application/json",
    "Accept": "application/json",
    "Accept-Encoding": "identity",
}


def _prebuilt_request(parsed: urllib.parse.SplitResult) -> bytes:
    """The whole request, head and body, as the floors send it every time."""
    return (
        f"POST {parsed.path} HTTP/1.1\r\nHost: {parsed.hostname}:{parsed.port}\r\n"
        + "".join(f"{k}: {v}\r\n" for k, v in HEADERS.items())
        + f"Content-Length: {len(_scenario.BODY)}\r\n\r\n"
    ).encode() + _scenario.BODY


@contextlib.asynccontextmanager
async def floor(url: str) -> AsyncIterator[Once]:
    """Raw asyncio streams on prebuilt request bytes (``StreamReader``'s buffering on top of
    the protocol the hand-written floor is)."""
    parsed = urllib.parse.urlsplit(url)
    assert parsed.hostname is not None
    assert parsed.port is not None
    reader, writer = await asyncio.open_connection(parsed.hostname, parsed.port)
    request = _prebuilt_request(parsed)

    async def once() -> bytes:
        writer.write(request)
        head = await reader.readuntil(b"\r\n\r\n")
        start = head.lower().index(b"content-length:") + 15
        length = int(head[start : head.index(b"\r\n", start)])
        return await reader.readexactly(length)

    try:
        yield once
    finally:
        writer.close()


class _FloorProtocol(asyncio.Protocol):
    """Reads one response at a time: the head up to its blank line, then Content-Length bytes."""

    def __init__(self) -> None:
        self.waiter: asyncio.Future[bytes] | None = None
        self._data = bytearray()
        self._need = -1  # the whole response's length, once the head is in
        self._start = 0  # where its body starts

    def data_received(self, data: bytes) -> None:
        buffer = self._data
        buffer += data
        if self._need < 0:
            end = buffer.find(b"\r\n\r\n")
            if end < 0:
                return
            head = bytes(buffer[:end]).lower()
            start = head.index(b"content-length:") + 15
            stop = head.find(b"\r\n", start)
            self._start = end + 4
            self._need = self._start + int(head[start : None if stop < 0 else stop])
        if len(buffer) >= self._need and self.waiter is not None:
            body = bytes(buffer[self._start : self._need])
            del buffer[: self._need]
            self._need = -1
            self.waiter.set_result(body)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_exception(ConnectionError("lost"))


@contextlib.asynccontextmanager
async def floor_protocol(url: str) -> AsyncIterator[Once]:
    """The issue's hand-written floor: an asyncio Protocol on one keep-alive connection,
    prebuilt request bytes, the response read by its Content-Length; no parsing library."""
    parsed = urllib.parse.urlsplit(url)
    assert parsed.hostname is not None
    assert parsed.port is not None
    loop = asyncio.get_running_loop()
    transport, protocol = await loop.create_connection(_FloorProtocol, parsed.hostname, parsed.port)
    request = _prebuilt_request(parsed)

    async def once() -> bytes:
        waiter: asyncio.Future[bytes] = loop.create_future()
        protocol.waiter = waiter
        transport.write(request)
        return await waiter

    try:
        yield once
    finally:
        transport.close()


@contextlib.asynccontextmanager
async def raw_aiohttp(url: str) -> AsyncIterator[Once]:
    """Raw aiohttp, default session: post the same bytes, read the body; no decoding."""
    import aiohttp  # noqa: PLC0415 - a peer of the bench group, not needed to import this

    async with aiohttp.ClientSession() as session:

        async def once() -> bytes:
            async with session.post(url, data=_scenario.BODY, headers=HEADERS) as response:
                return await response.read()

        yield once


@contextlib.asynccontextmanager
async def aiohttp_as_ours(url: str) -> AsyncIterator[Once]:
    """Raw aiohttp with the session and request options this library sets; no decoding."""
    import aiohttp  # noqa: PLC0415 - a peer of the bench group, not needed to import this
    import yarl  # noqa: PLC0415

    config = LLMConfig(endpoint_url=url, api_key=Secret("sk-bench"), max_concurrent_requests=SLOTS)
    connector = aiohttp.TCPConnector(
        limit=config.max_concurrent_requests,
        limit_per_host=config.max_concurrent_requests,
        keepalive_timeout=config.pool_idle_timeout_s,
        ssl=True,
    )
    session = aiohttp.ClientSession(
        connector=connector,
        timeout=aiohttp.ClientTimeout(
            total=None,
            connect=None,
            sock_connect=config.connect_timeout_s,
            sock_read=config.response_idle_timeout_s,
            ceil_threshold=float("inf"),
        ),
        auto_decompress=False,
        trust_env=False,
        cookie_jar=aiohttp.DummyCookieJar(),
        raise_for_status=False,
        skip_auto_headers=("Accept-Encoding", "User-Agent", "Content-Type"),
    )
    target = yarl.URL(url, encoded=True)
    headers = {**HEADERS, "User-Agent": "bench", "X-Request-Id": "bench-1"}
    async with session:

        async def once() -> bytes:
            async with session.request(
                "POST",
                target,
                data=_scenario.BODY,
                headers=headers,
                allow_redirects=False,
                compress=None,
                chunked=None,
                proxy=None,
            ) as response:
                return await response.read()

        yield once


@contextlib.asynccontextmanager
async def ours(url: str) -> AsyncIterator[Once]:
    """This library: serialise, post, read capped, decode, validate, map."""
    config = LLMConfig(endpoint_url=url, api_key=Secret("sk-bench"), max_concurrent_requests=SLOTS)
    async with LLMClient(config) as client:

        async def once() -> object:
            return await client.complete(_scenario.MESSAGES, _scenario.TOOLS)

        yield once


@contextlib.asynccontextmanager
async def httpx_client(url: str) -> AsyncIterator[Once]:
    """httpx: post the same bytes, read the body; no decoding."""
    import httpx  # noqa: PLC0415 - optional peer

    async with httpx.AsyncClient() as client:

        async def once() -> bytes:
            response = await client.post(url, content=_scenario.BODY, headers=HEADERS)
            return response.read()

        yield once


@contextlib.asynccontextmanager
async def openai_sdk(url: str) -> AsyncIterator[Once]:
    """The official OpenAI SDK's chat.completions.create, retries off (it needs a model)."""
    import openai  # noqa: PLC0415 - optional peer

    base = url.rsplit("/chat/completions", 1)[0]
    messages: Any = _scenario.sdk_messages()
    tools: Any = _scenario.sdk_tools()
    async with openai.AsyncOpenAI(api_key="sk-bench", base_url=base, max_retries=0) as client:

        async def once() -> object:
            return await client.chat.completions.create(
                model="bench", messages=messages, tools=tools
            )

        yield once


#: Every contender, in table order; the last two need the ``bench`` group.
CONTENDERS: dict[str, Contender] = {
    "hand-written floor": floor_protocol,
    "streams floor": floor,
    "raw aiohttp": raw_aiohttp,
    "aiohttp as ours": aiohttp_as_ours,
    "ours": ours,
    "httpx": httpx_client,
    "openai SDK": openai_sdk,
}
PEER_MODULES = {"httpx": "httpx", "openai SDK": "openai"}
#: The contenders that take concurrent requests (the floors hold one connection).
CONCURRENT = frozenset({"raw aiohttp", "aiohttp as ours", "ours", "httpx", "openai SDK"})


def available() -> dict[str, Contender]:
    """The contenders whose packages are installed."""
    return {
        name: run
        for name, run in CONTENDERS.items()
        if name not in PEER_MODULES or importlib.util.find_spec(PEER_MODULES[name])
    }


async def run_requests(
    contender: Contender,
    url: str,
    count: int,
    warmup: int = 0,
    concurrency: int = 1,
    *,
    counted: bool = False,
) -> float:
    """CPU seconds per request over ``count`` requests, after ``warmup`` unmeasured ones.

    With ``concurrency`` above 1 (a contender of ``CONCURRENT`` only), that many tasks each
    make ``count // concurrency`` requests at once, all through the one client. ``counted``:
    a process callgrind counts (``_run_one``), whose set-up is then kept out of every
    collection.
    """
    async with contender(url) as once:
        for _ in range(warmup):
            await once()
        gc.collect()
        if counted:
            # The set-up's objects (a history benchmark's 192 sessions of 200 messages) out
            # of every collection for the rest of the process, as tune_gc_for_many_sessions()
            # does with start-up's: the one full collection that walks them fell in the 3N
            # run of a counted N and 3N pair and not in the N run, and counted 38k
            # instructions per request at 200 messages that no request spent. Collecting
            # them into the oldest generation first was not enough.
            gc.freeze()

        async def worker(requests: int) -> None:
            for _ in range(requests):
                await once()

        start = time.process_time()
        if concurrency == 1:
            await worker(count)
        else:
            each = count // concurrency
            await asyncio.gather(*(worker(each) for _ in range(concurrency)))
            count = each * concurrency
        return (time.process_time() - start) / count


def measure(url: str, *, requests: int, rounds: int) -> dict[str, dict[str, Any]]:
    """Alternate every available contender over ``rounds``; medians and paired ratios."""
    contenders = available()
    names = list(contenders)
    per_round: dict[str, list[float]] = {name: [] for name in names}
    for index in range(rounds):
        order = names[index % len(names) :] + names[: index % len(names)]
        for name in order:
            cpu = asyncio.run(
                run_requests(contenders[name], url, requests, warmup=max(5, requests // 10))
            )
            per_round[name].append(cpu)
    base = per_round["raw aiohttp"]
    results: dict[str, dict[str, Any]] = {}
    for name in CONTENDERS:
        if name not in per_round:
            results[name] = {"installed": False}
            continue
        ratios = [cpu / raw for cpu, raw in zip(per_round[name], base, strict=True)]
        results[name] = {
            "installed": True,
            "cpu_us_median": statistics.median(per_round[name]) * 1e6,
            "ratio_vs_raw_median": statistics.median(ratios),
            "ratio_vs_raw_range": [min(ratios), max(ratios)],
            "cpu_us_rounds": [cpu * 1e6 for cpu in per_round[name]],
        }
    # Paired ratios that the targets name: ours over aiohttp as ours, each peer over ours.
    for name, top, bottom in (
        ("aiohttp as ours", "ours", "aiohttp as ours"),
        ("httpx", "httpx", "ours"),
        ("openai SDK", "openai SDK", "ours"),
    ):
        if name in per_round:
            paired = [a / b for a, b in zip(per_round[top], per_round[bottom], strict=True)]
            results[name]["paired_with_ours_median"] = statistics.median(paired)
    return results


def main() -> None:
    """Run every available contender against one loopback server; print the figures."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=500, help="requests per round")
    parser.add_argument("--rounds", type=int, default=7, help="rounds, alternating contenders")
    args = parser.parse_args()
    with serve() as origin:
        results = measure(
            origin + "/v1/chat/completions", requests=args.requests, rounds=args.rounds
        )
    print(f"{'client':<18}{'CPU us/request':>16}{'vs raw aiohttp':>16}")
    for name, row in results.items():
        if row["installed"]:
            cpu, ratio = row["cpu_us_median"], row["ratio_vs_raw_median"]
            print(f"{name:<18}{cpu:>16.1f}{ratio:>15.2f}x")
        else:
            print(f"{name:<18}{'not installed':>16}")


if __name__ == "__main__":
    main()
