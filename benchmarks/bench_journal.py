"""What the journal of a durable session costs: CPU per two-call turn, and a mutating call's sync.

1. CPU per turn, records written but not synced: the records of one tool turn with two
   read-only calls (request, reply with two calls, call, result, call, result), built by the
   loop's own recorder from the values the loop has and written through a
   :class:`~metacrate_grid_agent.journal.FileJournal` run (one ``write`` each, no sync), to
   a file in a temporary directory; ``time.process_time`` over many turns.
2. The wall time a mutating call's intent adds: ``commit`` (write and ``fdatasync``), one
   per mutating call, p50 and p99 over many commits, on the directory's disk.

Run: ``uv run --locked python -m benchmarks.bench_journal [--turns N] [--commits N] [--dir D]``
(``--dir`` chooses the disk measured; the default is the system's temporary directory).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any

from metacrate_grid_agent import (
    Completion,
    Effect,
    FunctionCall,
    Success,
    ToolCall,
    ToolLoopConfig,
    Usage,
    UserMessage,
    ValidatedCall,
)
from metacrate_grid_agent._aio._durable import Recorder
from metacrate_grid_agent._core._journal import Header, tool_prints, tools_hash
from metacrate_grid_agent._core._loop import CallModel
from metacrate_grid_agent._core._retry import AttemptRecord
from metacrate_grid_agent.journal import FileJournal


@dataclass
class _Clock:
    """What the recorder reads of the machine: its start on the loop's clock, its settings."""

    started_at: float = 0.0
    config: ToolLoopConfig = field(default_factory=ToolLoopConfig)


def _header(run: int) -> Header:
    return Header(
        library="bench",
        session_id="bench",
        generation=0,
        run=run,
        anchor=time.time(),
        config={},
        tools=tool_prints(()),
        tools_hash=tools_hash(()),
        approval=False,
        history=(UserMessage(content="walk the plaza"),),
    )


def _turn_values(turn: int) -> tuple[CallModel, Completion, list[ValidatedCall]]:
    request_id = f"bench-g0-r1-t{turn}"
    calls = [
        ToolCall(id=f"call-{turn}-{i}", function=FunctionCall("look", f'{{"radius": {i + 3}}}'))
        for i in range(2)
    ]
    completion = Completion(
        text=None,
        tool_calls=tuple(calls),
        minted_call_ids=frozenset(),
        usage=Usage(prompt_tokens=812, completion_tokens=41, total_tokens=853),
        finish_reason="tool_calls",
        request_id=request_id,
        attempts=1,
        latency_s=0.012,
        attempt_records=(AttemptRecord(1, "ok", 200, None, 0.012, None, None),),
    )
    validated = [
        ValidatedCall(c.id, "look", {"radius": i + 3}, Effect.READ_ONLY)
        for i, c in enumerate(calls)
    ]
    return CallModel(messages=(), request_id=request_id, turn=turn), completion, validated


async def turn_cpu(directory: str, turns: int) -> float:
    """Microseconds of CPU per two-call turn's records, written, not synced."""
    journal = FileJournal(directory)
    run = await journal.create(_header(1))
    recorder = Recorder(run, _Clock())  # type: ignore[arg-type]
    values = [_turn_values(t) for t in range(1, turns + 1)]
    observation = Success("a fountain, two benches and a cat; nobody within 5 m")
    started = time.process_time()
    for decision, completion, validated in values:
        await recorder.request(decision, 1.0)
        await recorder.reply(completion, 1.1)
        for call in validated:
            await recorder.call(call, 1.2)
            await recorder.result(call, observation, 1.3, 0.001)
    spent = time.process_time() - started
    await run.close()
    return spent / turns * 1e6


async def commit_wall(directory: str, commits: int) -> list[float]:
    """Milliseconds of wall time of each mutating intent's commit (write and fdatasync)."""
    journal = FileJournal(directory)
    run = await journal.create(_header(2))
    recorder = Recorder(run, _Clock())  # type: ignore[arg-type]
    await recorder.call(ValidatedCall("warm", "move_to", {"x": 1}, Effect.MUTATING), 0.5)
    times = []
    for index in range(commits):
        call = ValidatedCall(f"m{index}", "move_to", {"x": index, "y": 4}, Effect.MUTATING)
        started = time.perf_counter()
        await recorder.call(call, 1.0)
        times.append((time.perf_counter() - started) * 1e3)
    await run.close()
    return times


def main(argv: Any = None) -> None:
    """Measure and print."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=20_000)
    parser.add_argument("--commits", type=int, default=500)
    parser.add_argument("--dir", default=None)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(dir=args.dir) as directory:
        best = min(asyncio.run(turn_cpu(f"{directory}/cpu{i}", args.turns)) for i in range(5))
        times = asyncio.run(commit_wall(f"{directory}/sync", args.commits))
    cuts = statistics.quantiles(times, n=100)
    print(f"journal CPU per two-call turn (6 records, written, not synced): {best:.1f} us")
    print(
        f"mutating intent commit (write + fdatasync), {args.commits} commits: "
        f"p50 {statistics.median(times):.3f} ms, p99 {cuts[98]:.3f} ms, max {max(times):.3f} ms"
    )


if __name__ == "__main__":
    main()
