"""CPU per request: this library's client against raw aiohttp and peers, in one run.

The endpoint runs in a separate process on loopback, so only client-side CPU is counted
(``time.process_time``). Each contender posts the same request body and reads the same
reply; this library also validates, decodes and maps it. Results are ratios against raw
aiohttp from the same run, never absolute thresholds.

Run: ``uv run --locked python -m benchmarks.bench_transport [--requests N] [--rounds R]``.
Peers that are not installed (httpx, openai) are skipped; add them for a run with
``uv run --locked --with httpx --with openai python -m benchmarks.bench_transport``.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import time
from collections.abc import Callable, Coroutine
from typing import Any

import aiohttp

from benchmarks._server import serve
from metacrate_grid_agent import LLMClient, LLMConfig, Secret, UserMessage
from metacrate_grid_agent._wire import encode_request

MESSAGES = [UserMessage(content="Where is the lamp? Move next to it.")]
BODY = encode_request(MESSAGES, ())
HEADERS = {
    "Authorization": "Bearer sk-bench",
    "Content-Type": "application/json",
    "Accept": "application/json",
    "Accept-Encoding": "identity",
}

Runner = Callable[[str, int], Coroutine[Any, Any, None]]


async def raw_aiohttp(url: str, n: int) -> None:
    """Raw aiohttp: post the same bytes, read the body; no decoding."""
    async with aiohttp.ClientSession() as session:
        for _ in range(n):
            async with session.post(url, data=BODY, headers=HEADERS) as response:
                await response.read()


async def ours(url: str, n: int) -> None:
    """This library: serialise, post, read capped, decode, validate, map."""
    config = LLMConfig(endpoint_url=url, api_key=Secret("sk-bench"))
    async with LLMClient(config) as client:
        for _ in range(n):
            await client.complete(MESSAGES)


async def httpx_client(url: str, n: int) -> None:
    """httpx: post the same bytes, read the body; no decoding."""
    import httpx  # noqa: PLC0415 - optional peer

    async with httpx.AsyncClient() as client:
        for _ in range(n):
            response = await client.post(url, content=BODY, headers=HEADERS)
            response.read()


async def openai_sdk(url: str, n: int) -> None:
    """The official OpenAI SDK's chat.completions.create (it needs a model name)."""
    import openai  # noqa: PLC0415 - optional peer

    base = url.rsplit("/chat/completions", 1)[0]
    client = openai.AsyncOpenAI(api_key="sk-bench", base_url=base, max_retries=0)
    async with client:
        for _ in range(n):
            await client.chat.completions.create(
                model="bench",
                messages=[{"role": "user", "content": "Where is the lamp? Move next to it."}],
            )


def _measure(runner: Runner, url: str, n: int) -> float:
    """CPU seconds per request of one run of ``runner`` (after a short warm-up)."""
    asyncio.run(runner(url, max(10, n // 20)))
    start = time.process_time()
    asyncio.run(runner(url, n))
    return (time.process_time() - start) / n


def main() -> None:
    """Run every available contender against one loopback server; print ratios."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=2000, help="requests per round")
    parser.add_argument("--rounds", type=int, default=5, help="rounds, alternating contenders")
    args = parser.parse_args()
    with serve() as origin:
        url = origin + "/v1/chat/completions"
        contenders: dict[str, Runner] = {"raw aiohttp": raw_aiohttp, "metacrate-grid-agent": ours}
        if importlib.util.find_spec("httpx"):
            contenders["httpx"] = httpx_client
        if importlib.util.find_spec("openai"):
            contenders["openai SDK"] = openai_sdk
        # Alternate the contenders round by round and keep each one's best round: the
        # least disturbed by whatever else the machine is doing.
        results = dict.fromkeys(contenders, float("inf"))
        for _ in range(args.rounds):
            for name, run in contenders.items():
                results[name] = min(results[name], _measure(run, url, args.requests))
    base = results["raw aiohttp"]
    print(f"{'client':<22}{'CPU us/request':>16}{'vs raw aiohttp':>16}")
    for name, seconds in results.items():
        print(f"{name:<22}{seconds * 1e6:>16.1f}{seconds / base:>15.2f}x")


if __name__ == "__main__":
    main()
