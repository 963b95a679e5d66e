"""Instructions per request, counted by callgrind: the small ratios, free of machine load.

CPU time on a shared machine varies by tens of percent between runs; instruction counts do
not. Each contender runs twice under ``valgrind --tool=callgrind`` (N and 3N requests, the
loopback server in its own untraced process); the difference divided by 2N is the cost of
one request, with start-up and imports cancelled out. The peers (httpx, the openai SDK) are
counted too when installed, with fewer requests (``PEER_SHARE`` of N: one of their requests
costs tens of ours, so fewer already give a count that rounds the same).

``--loop`` counts the tool loop's own instructions per tool turn instead: ``ToolLoop`` over
the stub client of ``bench_loop`` (no HTTP), N and 3N ten-turn sessions.

Run alone: ``uv run --locked python -m benchmarks.bench_instructions [--requests N]
[--loop [--sessions N]]`` (needs valgrind).
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys

from benchmarks import _scenario, bench_transport
from benchmarks._server import serve

_COLLECTED = re.compile(r"Collected : (\d+)")
#: The contenders counted, in table order; the peers only when installed.
NAMES = ("floor", "raw aiohttp", "aiohttp as ours", "ours", "httpx", "openai SDK")
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
    done = subprocess.run(  # noqa: S603 - our own modules under valgrind, fixed arguments
        command, capture_output=True, text=True, check=True, timeout=PROCESS_TIMEOUT_S
    )
    match = _COLLECTED.search(done.stderr)
    if match is None:
        raise RuntimeError(f"callgrind reported no count for {module} {' '.join(args)}")
    return int(match.group(1))


def counted_requests(url: str, name: str, count: int) -> int:
    """Instructions of one process making ``count`` requests with contender ``name``."""
    return _counted("benchmarks._run_one", url, name, str(count))


def measure(url: str, *, requests: int) -> dict[str, float]:
    """Instructions per request of each installed contender."""
    installed = bench_transport.available()
    counts = {}
    for name in NAMES:
        if name not in installed:
            continue
        n = requests
        if name in bench_transport.PEER_MODULES:
            n = max(PEER_MIN_REQUESTS, round(requests * PEER_SHARE))
        counts[name] = (counted_requests(url, name, 3 * n) - counted_requests(url, name, n)) / (
            2 * n
        )
    return counts


def loop_per_turn(*, sessions: int) -> float:
    """Instructions per tool turn of ``ToolLoop`` over the stub client (no HTTP)."""
    short = _counted("benchmarks._run_loop", str(sessions))
    long = _counted("benchmarks._run_loop", str(3 * sessions))
    return (long - short) / (2 * sessions * _scenario.LOOP_TOOL_TURNS)


def main() -> None:
    """Count every contender and print the ratios."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=100, help="N (the long run is 3N)")
    parser.add_argument("--loop", action="store_true", help="the tool loop's own cost instead")
    parser.add_argument("--sessions", type=int, default=6, help="with --loop: N (long run 3N)")
    args = parser.parse_args()
    if not available():
        sys.exit("valgrind is not installed")
    if args.loop:
        per_turn = loop_per_turn(sessions=args.sessions)
        print(f"ToolLoop's own instructions per tool turn: {per_turn:,.0f}")
        return
    with serve() as origin:
        counts = measure(origin + "/v1/chat/completions", requests=args.requests)
    print(f"{'client':<18}{'instructions/request':>22}{'vs raw aiohttp':>16}{'vs ours':>10}")
    for name, count in counts.items():
        raw, ours = count / counts["raw aiohttp"], count / counts["ours"]
        print(f"{name:<18}{count:>22,.0f}{raw:>15.2f}x{ours:>9.2f}x")


if __name__ == "__main__":
    main()
