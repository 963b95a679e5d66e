"""Instructions per request, counted by callgrind: the small ratios, free of machine load.

CPU time on a shared machine varies by tens of percent between runs; instruction counts do
not. Each contender runs twice under ``valgrind --tool=callgrind`` (N and 3N requests, the
loopback server in its own untraced process); the difference divided by 2N is the cost of
one request, with start-up and imports cancelled out. The peers (httpx, the openai SDK) are
counted too when installed, with fewer requests (``PEER_SHARE`` of N: one of their requests
costs tens of ours, so fewer already give a count that rounds the same).

``--loop`` counts the tool loop's own instructions per tool turn instead: ``ToolLoop`` over
the stub client of ``bench_loop`` (no HTTP), N and 3N ten-turn sessions (``--journal``: each
session journaled in a ``FileJournal``, to report what the journal adds).

Run alone: ``uv run --locked python -m benchmarks.bench_instructions [--requests N]
[--concurrency C] [--only NAME ...] [--event-loop uvloop] [--loop [--sessions N]]`` (needs
valgrind; ``--event-loop uvloop`` runs the contenders on uvloop's event loop, with the
``uvloop`` dependency group: ``--group bench --group uvloop``). Every
process runs with one fixed hash seed: with random ones, the N and 3N runs differed by
millions of instructions at start-up, and the floor's count by 4x between runs.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
from typing import TYPE_CHECKING

from benchmarks import _scenario, bench_transport
from benchmarks._server import serve

if TYPE_CHECKING:
    from collections.abc import Collection

_COLLECTED = re.compile(r"Collected : (\d+)")
#: The contenders counted, in table order; the peers only when installed.
NAMES = (
    "hand-written floor",
    "streams floor",
    "raw aiohttp",
    "aiohttp as ours",
    "ours",
    "httpx",
    "openai SDK",
)
#: The peers' N as a share of the others' (at least ``PEER_MIN_REQUESTS``).
PEER_SHARE = 0.2
PEER_MIN_REQUESTS = 5
#: Bound on one process under callgrind: a hang guard, far above a slow machine's minutes.
PROCESS_TIMEOUT_S = 3 * 3600


def available() -> bool:
    """Whether valgrind is installed."""
    return shutil.which("valgrind") is not None


def _counted(module: str, *args: str) -> int:
    """Instructions of one ``python -m module args`` process under callgrind."""
    command = [
        "valgrind",
        "--tool=callgrind",
        "--callgrind-out-file=/dev/null",
        sys.executable,
        "-m",
        module,
        *args,
    ]
    # One hash seed for every process: with a random one, the layout of every dict and set
    # differs between the N and 3N runs, and so does start-up by millions of instructions.
    env = {**os.environ, "PYTHONHASHSEED": "0"}
    done = subprocess.run(  # noqa: S603 - our own modules under valgrind, fixed arguments
        command, capture_output=True, text=True, check=True, timeout=PROCESS_TIMEOUT_S, env=env
    )
    match = _COLLECTED.search(done.stderr)
    if match is None:
        raise RuntimeError(f"callgrind reported no count for {module} {' '.join(args)}")
    return int(match.group(1))


def counted_requests(url: str, name: str, count: int, concurrency: int = 1) -> int:
    """Instructions of one process making ``count`` requests with contender ``name``,
    ``concurrency`` at a time."""
    return _counted("benchmarks._run_one", url, name, str(count), str(concurrency))


def measure(
    url: str,
    *,
    requests: int,
    concurrency: int = 1,
    only: Collection[str] | None = None,
) -> dict[str, float]:
    """Instructions per request of each installed contender (of ``only``, when given).

    With ``concurrency`` above 1, only the contenders that take concurrent requests are
    counted, and N is rounded up to a multiple of it.
    """
    installed = bench_transport.available()
    counts = {}
    for name in NAMES:
        if name not in installed or (only is not None and name not in only):
            continue
        if concurrency > 1 and name not in bench_transport.CONCURRENT:
            continue
        n = requests
        if name in bench_transport.PEER_MODULES:
            n = max(PEER_MIN_REQUESTS, round(requests * PEER_SHARE))
        n = -(-n // concurrency) * concurrency
        short = counted_requests(url, name, n, concurrency)
        long = counted_requests(url, name, 3 * n, concurrency)
        counts[name] = (long - short) / (2 * n)
    return counts


def loop_per_turn(*, sessions: int, journal: bool = False) -> float:
    """Instructions per tool turn of ``ToolLoop`` over the stub client (no HTTP); with
    ``journal``, every session journaled in a ``FileJournal`` (reported, not the target)."""
    extra = ("--journal",) if journal else ()
    short = _counted("benchmarks._run_loop", str(sessions), *extra)
    long = _counted("benchmarks._run_loop", str(3 * sessions), *extra)
    return (long - short) / (2 * sessions * _scenario.LOOP_TOOL_TURNS)


def main() -> None:
    """Count every contender and print the ratios."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=100, help="N (the long run is 3N)")
    parser.add_argument("--loop", action="store_true", help="the tool loop's own cost instead")
    parser.add_argument("--sessions", type=int, default=6, help="with --loop: N (long run 3N)")
    parser.add_argument(
        "--journal", action="store_true", help="with --loop: every session journaled (a report)"
    )
    parser.add_argument(
        "--concurrency", type=int, default=1, help="requests in flight at once (floors: 1 only)"
    )
    parser.add_argument("--only", nargs="+", choices=NAMES, help="count these contenders only")
    parser.add_argument(
        "--event-loop",
        choices=("asyncio", "uvloop"),
        default="asyncio",
        help="the event loop the contenders run on (uvloop: the uvloop dependency group)",
    )
    args = parser.parse_args()
    os.environ["GRID_AGENT_EVENT_LOOP"] = args.event_loop  # read by each counted process
    if not available():
        sys.exit("valgrind is not installed")
    if args.loop:
        per_turn = loop_per_turn(sessions=args.sessions, journal=args.journal)
        journaled = ", journaled in a FileJournal" if args.journal else ""
        print(f"ToolLoop's own instructions per tool turn{journaled}: {per_turn:,.0f}")
        return
    with serve() as origin:
        counts = measure(
            origin + "/v1/chat/completions",
            requests=args.requests,
            concurrency=args.concurrency,
            only=args.only,
        )
    print(f"concurrency {args.concurrency}, event loop {args.event_loop}")
    print(f"{'client':<20}{'instructions/request':>22}{'vs raw aiohttp':>16}{'vs ours':>10}")
    raw, ours = counts.get("raw aiohttp"), counts.get("ours")
    for name, count in counts.items():
        vs_raw = "" if raw is None else f"{count / raw:.2f}x"
        vs_ours = "" if ours is None else f"{count / ours:.2f}x"
        print(f"{name:<20}{count:>22,.0f}{vs_raw:>16}{vs_ours:>10}")


if __name__ == "__main__":
    main()
