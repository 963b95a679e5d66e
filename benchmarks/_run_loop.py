"""Run N sessions of the tool loop over the stub client (the process callgrind counts)."""

from __future__ import annotations

import asyncio
import sys

from benchmarks import _scenario
from benchmarks.bench_loop import own_loop


async def run_sessions(count: int) -> None:
    """``count`` ten-turn sessions of ``ToolLoop`` over the stub client, one after another."""
    session = own_loop(_scenario.LOOP_TOOL_TURNS)
    for _ in range(count):
        await session()


if __name__ == "__main__":
    asyncio.run(run_sessions(int(sys.argv[1])))
