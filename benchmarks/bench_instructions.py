"""Instructions per request, counted by callgrind: the small ratios, free of machine load.

CPU time on a shared machine varies by tens of percent between runs; instruction counts do
not. Each contender runs twice under ``valgrind --tool=callgrind`` (N and 3N requests, the
loopback server in its own untraced process); the difference divided by 2N is the cost of
one request, with start-up and imports cancelled out.

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

from benchmarks import _scenario
from benchmarks._server import serve

_COLLECTED = re.compile(r"Collected : (\d+)")
#: The contenders counted (the peers cost too much under callgrind; their CPU ratios are
#: large enough that CPU time measures them well).
NAMES = ("floor", "raw aiohttp", "aiohttp as ours", "ours")


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
    done = subprocess.run(command, capture_output=True, text=True, check=True, timeout=1800)  # noqa: S603
    match = _COLLECTED.search(done.stderr)
    if match is None:
        raise RuntimeError(f"callgrind reported no count for {module} {' '.join(args)}")
    return int(match.group(1))


def _instructions(url: str, name: str, count: int) -> int:
    return _counted("benchmarks._run_one", url, name, str(count))


def measure(url: str, *, requests: int) -> dict[str, float]:
    """Instructions per request of each contender."""
    return {
        name: (_instructions(url, name, 3 * requests) - _instructions(url, name, requests))
        / (2 * requests)
        for name in NAMES
    }


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
    print(f"{'client':<18}{'instructions/request':>22}{'vs raw aiohttp':>16}")
    for name, count in counts.items():
        print(f"{name:<18}{count:>22,.0f}{count / counts['raw aiohttp']:>15.2f}x")


if __name__ == "__main__":
    main()
