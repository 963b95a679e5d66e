"""What the journal of a durable session costs: CPU per turn, a mutating call's sync, many sessions.

1. CPU per turn, records written but not synced: the records of one tool turn with two
   read-only calls (request, reply with two calls, call, result, call, result), built by the
   loop's own recorder from the values the loop has and written through a
   :class:`~metacrate_grid_agent.journal.FileJournal` run (one ``write`` each, no sync), to
   a file in a temporary directory; ``time.process_time`` over many turns (best of five),
   and with ``--instructions`` the same turns counted by callgrind (N and 3N turns in two
   processes, the difference over 2N: start-up cancelled out).
2. The wall time a mutating call's intent adds: ``commit`` (fence, write, ``fdatasync`` on a
   sync thread), p50 and p99, interleaved in rounds with a bare ``write`` + ``fdatasync`` of
   a line of the same size to a file in the same directory (what the disk alone costs), and
   how many turns the event loop gave another task during each commit (zero when the sync
   blocks the loop).
3. ``--sessions N``: N concurrent journaled sessions in one process (the ``bench_scale``
   session: five tool turns of two calls, on the loopback server in its own process, one
   shared client), each in a fresh process, with and without a journal, read-only tools (one
   sync per session, at its finish) and mutating ones (one sync per call too): records per
   second, CPU per record, peak RSS growth per session, most descriptors open at once.

Run: ``uv run --locked python -m benchmarks.bench_journal [--turns N] [--commits N] [--dir D]
[--instructions] [--sessions N]`` (``--dir`` chooses the disk measured; the default is the
system's temporary directory).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from metacrate_grid_agent import (
    Completion,
    Effect,
    FunctionCall,
    LLMClient,
    LLMConfig,
    Secret,
    SessionGeneration,
    Success,
    Tool,
    ToolCall,
    ToolLoop,
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

#: Distinct turns the CPU benchmark cycles through (built before the clock starts).
POOL = 64
#: Tool turns of one session in ``--sessions`` (``bench_scale``'s session).
SESSION_TURNS = 5
#: How often the open descriptors are counted (listing them costs milliseconds at 1,000).
FD_SAMPLE_S = 0.25
#: Commits measured for the event loop's turns given to another task meanwhile.
SPIN_COMMITS = 20
_COLLECTED = re.compile(r"Collected : (\d+)")
KIB = 1024


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


async def _turns(directory: str, turns: int) -> float:
    """Write ``turns`` two-call turns' records; the CPU seconds they took."""
    journal = FileJournal(directory)
    run = await journal.create(_header(1))
    recorder = Recorder(run, _Clock())  # type: ignore[arg-type]
    pool = [_turn_values(t) for t in range(1, POOL + 1)]
    observation = Success("a fountain, two benches and a cat; nobody within 5 m")
    started = time.process_time()
    for index in range(turns):
        decision, completion, validated = pool[index % POOL]
        await recorder.request(decision, 1.0)
        await recorder.reply(completion, 1.1)
        for call in validated:
            await recorder.call(call, 1.2)
            await recorder.result(call, observation, 1.3, 0.001)
    spent = time.process_time() - started
    await run.close()
    return spent


async def turn_cpu(directory: str, turns: int) -> float:
    """Microseconds of CPU per two-call turn's records, written, not synced."""
    return await _turns(directory, turns) / turns * 1e6


def _counted(turns: int) -> int:
    """Instructions of one process writing ``turns`` turns, under callgrind."""
    command = [
        "valgrind",
        "--tool=callgrind",
        "--callgrind-out-file=/dev/null",
        sys.executable,
        "-m",
        "benchmarks.bench_journal",
        "--count-turns",
        str(turns),
    ]
    env = {**os.environ, "PYTHONHASHSEED": "0"}
    done = subprocess.run(  # noqa: S603 - our own module under valgrind, fixed arguments
        command, capture_output=True, text=True, check=True, timeout=3600, env=env
    )
    match = _COLLECTED.search(done.stderr)
    if match is None:
        raise RuntimeError("callgrind reported no count")
    return int(match.group(1))


def turn_instructions(turns: int) -> float:
    """Instructions per two-call turn's records: (count(3N) - count(N)) / 2N."""
    return (_counted(3 * turns) - _counted(turns)) / (2 * turns)


async def commit_wall(directory: str, commits: int, rounds: int = 5) -> dict[str, Any]:
    """Each mutating intent's commit, and a bare append + fdatasync, in interleaved rounds."""
    journal = FileJournal(directory)
    run = await journal.create(_header(2))
    recorder = Recorder(run, _Clock())  # type: ignore[arg-type]
    await recorder.call(ValidatedCall("warm", "move_to", {"x": 1}, Effect.MUTATING), 0.5)
    bare = os.open(os.path.join(directory, "bare"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    line = b"x" * len(_last_line(os.path.join(directory, "bench-g0-r2.journal")))
    ours: list[float] = []
    alone: list[float] = []
    turns: list[int] = []
    given = 0

    async def other_task() -> None:
        nonlocal given
        while True:
            await asyncio.sleep(0)
            given += 1

    index = 0
    for _ in range(rounds):
        for _ in range(commits // rounds):
            index += 1
            call = ValidatedCall(f"m{index}", "move_to", {"x": index, "y": 4}, Effect.MUTATING)
            started = time.perf_counter()
            await recorder.call(call, 1.0)
            ours.append((time.perf_counter() - started) * 1e3)
        for _ in range(commits // rounds):
            started = time.perf_counter()
            os.write(bare, line + b"\n")
            os.fdatasync(bare)
            alone.append((time.perf_counter() - started) * 1e3)
    # Apart (a task that never waits keeps the GIL from the sync thread, adding the
    # interpreter's switch interval to each commit): what the loop did meanwhile.
    other = asyncio.create_task(other_task())
    await asyncio.sleep(0)
    for _ in range(SPIN_COMMITS):
        index += 1
        call = ValidatedCall(f"m{index}", "move_to", {"x": index, "y": 4}, Effect.MUTATING)
        before = given
        await recorder.call(call, 1.0)
        turns.append(given - before)
    other.cancel()
    os.close(bare)
    await run.close()

    def cuts(times: list[float]) -> dict[str, float]:
        p99 = statistics.quantiles(times, n=100)[98]
        return {"p50_ms": statistics.median(times), "p99_ms": p99}

    return {
        "commit": cuts(ours),
        "bare_fdatasync": cuts(alone),
        "loop_turns_given_per_commit_p50": statistics.median(turns),
        "line_bytes": len(line) + 1,
    }


# --- many sessions ---------------------------------------------------------------------------


def _status_kib(field_name: str) -> int:
    for entry in Path("/proc/self/status").read_text().splitlines():
        if entry.startswith(field_name + ":"):
            return int(entry.split()[1])
    raise RuntimeError(f"no {field_name} in /proc/self/status")


def _last_line(path: str) -> bytes:
    with open(path, "rb") as file:
        return file.read().splitlines()[-1]


def _reset_peak() -> None:
    """Reset the kernel's RSS high-water mark to the current RSS."""
    Path("/proc/self/clear_refs").write_text("5")


def _lines(directory: str) -> int:
    return sum(p.read_bytes().count(b"\n") for p in Path(directory).glob("*.journal"))


class _Instant:
    """An executor whose tools succeed at once."""

    async def execute(self, call: ValidatedCall, cancel: object) -> Success:
        """Report success without doing anything."""
        return Success("moved")


async def _sessions(
    origin: str, sessions: int, journaled: bool, mutating: bool, directory: str
) -> dict[str, Any]:
    from benchmarks import _scenario  # noqa: PLC0415 - only the session mode needs it

    tool = Tool(
        name="move_to",
        description="Walk the avatar to a point in the region.",
        parameters=_scenario.MOVE_TO_SCHEMA,
        effect=Effect.MUTATING if mutating else Effect.READ_ONLY,
        needs_approval=False,
    )
    url = f"{origin}/loop/{SESSION_TURNS}/v1/chat/completions"
    config = LLMConfig(endpoint_url=url, api_key=Secret("sk-bench"), max_concurrent_requests=64)
    client = LLMClient(config)
    loop = ToolLoop(client, [tool], _Instant(), system_prompt=_scenario.SYSTEM_PROMPT)
    journal = FileJournal(directory, secret=config.api_key) if journaled else None
    most_fds = 0

    async def count_fds() -> None:
        nonlocal most_fds
        while True:
            most_fds = max(most_fds, len(os.listdir("/proc/self/fd")))
            await asyncio.sleep(FD_SAMPLE_S)

    counting = asyncio.create_task(count_fds())
    _reset_peak()
    rss_before = _status_kib("VmRSS")
    wall, cpu = time.perf_counter(), time.process_time()
    results = await asyncio.gather(
        *(
            loop.run(_scenario.LOOP_GOAL, generation=SessionGeneration(f"s{i}"), journal=journal)
            for i in range(sessions)
        )
    )
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    growth = (_status_kib("VmHWM") - rss_before) * KIB
    counting.cancel()
    await client.aclose()
    completed = sum(str(r.outcome) == "completed" for r in results)
    records = _lines(directory) if journaled else 0
    return {
        "completed": completed,
        "records": records,
        "wall_s": wall,
        "cpu_s": cpu,
        "records_per_s": records / wall,
        "memory_per_session": growth / sessions,
        "most_fds": most_fds,
    }


def sessions_case(
    origin: str, sessions: int, journaled: bool, mutating: bool, directory: str
) -> dict[str, Any]:
    """One case in a fresh process (its memory and descriptors its own)."""
    done = subprocess.run(  # noqa: S603 - our own module, fixed arguments
        [
            sys.executable,
            "-m",
            "benchmarks.bench_journal",
            "--case",
            origin,
            str(sessions),
            "journal" if journaled else "none",
            "mutating" if mutating else "read_only",
            directory,
        ],
        capture_output=True,
        text=True,
        check=True,
        timeout=1800,
    )
    return dict(json.loads(done.stdout.splitlines()[-1]))


def many_sessions(sessions: int, rounds: int, directory: str | None) -> list[dict[str, Any]]:
    """Every case, ``rounds`` times interleaved."""
    from benchmarks._server import serve  # noqa: PLC0415 - only the session mode needs it

    rows = []
    with serve() as origin:
        for round_ in range(rounds):
            for journaled, mutating in ((False, False), (True, False), (True, True)):
                with tempfile.TemporaryDirectory(dir=directory) as where:
                    row = sessions_case(origin, sessions, journaled, mutating, where)
                rows.append({"round": round_, "journal": journaled, "mutating": mutating, **row})
    return rows


def main(argv: Any = None) -> None:
    """Measure and print."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=20_000)
    parser.add_argument("--commits", type=int, default=500)
    parser.add_argument("--dir", default=None)
    parser.add_argument("--instructions", action="store_true", help="count with callgrind")
    parser.add_argument("--sessions", type=int, default=0, help="N concurrent sessions")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--count-turns", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--case", nargs=5, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.count_turns:
        with tempfile.TemporaryDirectory() as directory:
            asyncio.run(_turns(f"{directory}/count", args.count_turns))
        return
    if args.case:
        origin, sessions, journaled, mutating, directory = args.case
        row = asyncio.run(
            _sessions(origin, int(sessions), journaled == "journal", mutating == "mutating",
                      directory)
        )  # fmt: skip
        print(json.dumps(row))
        return
    if args.sessions:
        for row in many_sessions(args.sessions, args.rounds, args.dir):
            print(json.dumps(row))
        return
    with tempfile.TemporaryDirectory(dir=args.dir) as directory:
        runs = sorted(asyncio.run(turn_cpu(f"{directory}/cpu{i}", args.turns)) for i in range(5))
        sync = asyncio.run(commit_wall(f"{directory}/sync", args.commits))
    print(
        f"journal CPU per two-call turn (6 records, written, not synced): best {runs[0]:.1f} us, "
        f"median {runs[2]:.1f} us of five"
    )
    if args.instructions:
        count = turn_instructions(max(200, args.turns // 20))
        print(f"journal instructions per two-call turn: {count:,.0f}")
    commit, bare = sync["commit"], sync["bare_fdatasync"]
    print(
        f"mutating intent commit, {args.commits} commits: p50 {commit['p50_ms']:.3f} ms, "
        f"p99 {commit['p99_ms']:.3f} ms; bare write + fdatasync of a {sync['line_bytes']}-byte "
        f"line, same directory, interleaved: p50 {bare['p50_ms']:.3f} ms, "
        f"p99 {bare['p99_ms']:.3f} ms; event-loop turns given to another task per commit "
        f"(p50): {sync['loop_turns_given_per_commit_p50']:.0f}"
    )


if __name__ == "__main__":
    main()
