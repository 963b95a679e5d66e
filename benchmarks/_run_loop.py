"""Run N sessions of the tool loop over the stub client (the process callgrind counts).

``python -m benchmarks._run_loop N [--journal]``: with ``--journal`` every session is
journaled in a ``FileJournal`` in a temporary directory (records written, no sync for the
read-only calls), to report what the journal adds; the loop's own target is counted without.
"""

from __future__ import annotations

import asyncio
import sys
import tempfile

from benchmarks import _scenario
from benchmarks.bench_loop import own_loop


async def run_sessions(count: int, journal_dir: str | None = None) -> None:
    """``count`` ten-turn sessions of ``ToolLoop`` over the stub client, one after another."""
    session = own_loop(_scenario.LOOP_TOOL_TURNS, journal_dir=journal_dir)
    for _ in range(count):
        await session()


if __name__ == "__main__":
    if "--journal" in sys.argv[2:]:
        with tempfile.TemporaryDirectory() as directory:
            asyncio.run(run_sessions(int(sys.argv[1]), directory))
    else:
        asyncio.run(run_sessions(int(sys.argv[1])))
