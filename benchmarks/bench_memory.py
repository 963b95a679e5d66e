"""Hostile bodies: how much a client reads and holds when the endpoint never stops sending.

Three bodies from the loopback server (its own process): endless chunked, endless
close-delimited, and one that declares 10 GiB. Each case runs in a fresh process, which
reports the bytes it read from its sockets (counted at ``socket.recv``), the peak of traced
Python allocations during the call (``tracemalloc``), and the growth of its resident set's
high-water mark (``VmHWM`` from the kernel, reset through ``/proc/self/clear_refs`` before
the call). Contenders: this library at 256 KiB and 4 MiB ``max_response_bytes``, and the
OpenAI SDK, which has no size cap: it is bounded only by its own 2 s timeout and by an
outer 5 s deadline, and the server itself stops after 64 MiB.

Run alone: ``uv run --locked python -m benchmarks.bench_memory``.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import socket
import subprocess
import sys
import tracemalloc
from pathlib import Path
from typing import Any

from benchmarks._server import serve
from metacrate_grid_agent import LLMClient, LLMConfig, Secret, UserMessage
from metacrate_grid_agent.errors import GridAgentError, ResponseTooLargeError

KIB = 1024
BODIES = ("endless-chunked", "endless-close", "huge-length")
#: The server stops every hostile body after this many bytes.
SERVER_LIMIT = 64 * KIB * KIB
CLIENTS = {"ours 256 KiB": 256 * KIB, "ours 4 MiB": 4 * KIB * KIB, "openai SDK": 0}

_received = 0


def _count_reads() -> None:
    """Count every byte read from any socket of this process."""
    recv, recv_into = socket.socket.recv, socket.socket.recv_into

    def counted_recv(self: socket.socket, *args: Any) -> bytes:
        global _received  # noqa: PLW0603 - a process-wide counter, one case per process
        data = recv(self, *args)
        _received += len(data)
        return data

    def counted_recv_into(self: socket.socket, *args: Any) -> int:
        global _received  # noqa: PLW0603
        size = recv_into(self, *args)
        _received += size
        return size

    socket.socket.recv = counted_recv  # type: ignore[method-assign,assignment]
    socket.socket.recv_into = counted_recv_into  # type: ignore[method-assign,assignment]


def _status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"no {field} in /proc/self/status")


async def _ours(url: str, cap: int) -> str:
    config = LLMConfig(
        endpoint_url=url, api_key=Secret("sk-bench"), max_response_bytes=cap, max_retries=0
    )
    async with LLMClient(config) as client:
        try:
            await client.complete([UserMessage(content="hello")])
        except ResponseTooLargeError:
            return "stopped at the cap"
        except GridAgentError as exc:
            return f"stopped: {exc.kind}"
    return "no error (a defect)"


async def _sdk(url: str) -> str:
    import openai  # noqa: PLC0415 - optional peer

    base = url.rsplit("/chat/completions", 1)[0]
    async with openai.AsyncOpenAI(
        api_key="sk-bench", base_url=base, max_retries=0, timeout=2.0
    ) as client:
        try:
            async with asyncio.timeout(5.0):
                await client.chat.completions.create(
                    model="bench", messages=[{"role": "user", "content": "hello"}]
                )
        except TimeoutError:
            return "outer deadline"
        except Exception as exc:  # noqa: BLE001 - any failure ends the case; report its type
            return f"stopped: {type(exc).__name__}"
    return "no error"


def _case(url: str, client: str) -> dict[str, Any]:
    """One case, in this process: read counters, traced peak and RSS high-water growth."""
    _count_reads()
    Path("/proc/self/clear_refs").write_text("5")  # reset VmHWM to the current RSS
    rss_before = _status_kib("VmRSS")
    tracemalloc.start()
    started_at = _received
    if client == "openai SDK":
        outcome = asyncio.run(_sdk(url))
    else:
        outcome = asyncio.run(_ours(url, CLIENTS[client]))
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return {
        "outcome": outcome,
        "bytes_read": _received - started_at,
        "traced_peak": peak,
        "rss_hwm_growth": (_status_kib("VmHWM") - rss_before) * KIB,
    }


def measure(origin: str, *, quick: bool) -> list[dict[str, Any]]:
    """Every body against every client, each in a fresh process."""
    clients = ["ours 256 KiB"] if quick else list(CLIENTS)
    if not importlib.util.find_spec("openai") and "openai SDK" in clients:
        clients.remove("openai SDK")
    rows = []
    for body in ("endless-chunked",) if quick else BODIES:
        for client in clients:
            url = f"{origin}/{body}/{SERVER_LIMIT}/v1/chat/completions"
            done = subprocess.run(  # noqa: S603 - our own module, fixed arguments
                [sys.executable, "-m", "benchmarks.bench_memory", "--case", url, client],
                capture_output=True,
                text=True,
                check=True,
                timeout=120,
            )
            row = {"body": body, "client": client, "cap": CLIENTS[client] or None}
            rows.append(row | json.loads(done.stdout.splitlines()[-1]))
    return rows


def main() -> None:
    """Run every case (or one, with ``--case``) and print the figures."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", nargs=2, metavar=("URL", "CLIENT"))
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    if args.case:
        print(json.dumps(_case(*args.case)))
        return
    with serve() as origin:
        rows = measure(origin, quick=args.quick)
    print(f"{'body':<17}{'client':<14}{'read past cap':>15}{'traced peak':>13}{'RSS growth':>12}")
    for row in rows:
        past = row["bytes_read"] - (row["cap"] or 0)
        print(
            f"{row['body']:<17}{row['client']:<14}{past // KIB:>11} KiB"
            f"{row['traced_peak'] // KIB:>9} KiB{row['rss_hwm_growth'] // KIB:>8} KiB"
        )


if __name__ == "__main__":
    main()
