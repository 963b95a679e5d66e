"""Instructions per request, ours against raw aiohttp, counted by callgrind.

CPU time on a shared 2-core machine varies by tens of percent between runs; instruction
counts do not. Each contender runs twice under ``valgrind --tool=callgrind`` (N and 4N
requests, the loopback server in its own untraced process); the difference divided by 3N
is the cost of one request with start-up cancelled out.

Run: ``uv run --locked python -m benchmarks.bench_instructions [--requests N]`` (needs
valgrind; Debian's package of that name).
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys

from benchmarks._server import serve

_COLLECTED = re.compile(r"Collected : (\d+)")


def _instructions(url: str, name: str, count: int) -> int:
    command = [
        "valgrind",
        "--tool=callgrind",
        "--callgrind-out-file=/dev/null",
        sys.executable,
        "-m",
        "benchmarks._run_one",
        url,
        name,
        str(count),
    ]
    done = subprocess.run(command, capture_output=True, text=True, check=True, timeout=900)  # noqa: S603
    match = _COLLECTED.search(done.stderr)
    if match is None:
        raise RuntimeError(f"callgrind reported no count for {name}")
    return int(match.group(1))


def main() -> None:
    """Count both contenders and print the ratio."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=100, help="N (the long run is 4N)")
    args = parser.parse_args()
    if shutil.which("valgrind") is None:
        sys.exit("valgrind is not installed")
    n = args.requests
    with serve() as origin:
        url = origin + "/v1/chat/completions"
        per_request = {
            name: (_instructions(url, name, 4 * n) - _instructions(url, name, n)) / (3 * n)
            for name in ("raw", "ours")
        }
    print(f"{'client':<22}{'instructions/request':>22}{'vs raw aiohttp':>16}")
    for name, label in (("raw", "raw aiohttp"), ("ours", "metacrate-grid-agent")):
        ratio = per_request[name] / per_request["raw"]
        print(f"{label:<22}{per_request[name]:>22,.0f}{ratio:>15.2f}x")


if __name__ == "__main__":
    main()
