"""Recovery after a crash: N unfinished 16-turn sessions resumed by a fresh process.

1. Generate: N sessions (two read-only calls per tool turn) run by the real loop with a
   real :class:`~metacrate_grid_agent.journal.FileJournal` against the loopback server
   (its own process), each stopped the way a crash stops it: once the request of turn 17
   is journaled, the journal takes nothing more (the run's process "dies" there), so each
   journal holds 16 whole turns and a request without its reply. Every byte is written by
   the library's writer. The journals are generated once, for the largest N, and copied
   (with their generation files) into a fresh directory for each round.
2. Resume: a fresh process (``benchmarks._recover_child``: the clock starts before it is
   spawned, so the interpreter's start and the imports count) resumes every run of the
   directory with :meth:`ToolLoop.resume_pending` against the same server: each run
   re-reads and checks its journal, replays its 16 turns, sends the pending request again
   (same request id), gets the final reply and commits its finish (one ``fdatasync``).
   Measured: the first action (the first request sent) and the end (every run ended),
   from the spawn; the child's CPU time.

The child calls ``tune_gc_for_many_sessions()`` first, as a deployment with many sessions
does (``RECOVERY_GC=default`` in the environment leaves the collector as it is).

Run alone: ``uv run --locked python -m benchmarks.bench_recovery [--sessions N ...]
[--rounds R] [--concurrency C] [--dir D] [--source KEPT]``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

from benchmarks._recover_child import CONFIG, KEY, MOVE_TO, SYSTEM_PROMPT, Walker, client_config
from benchmarks._server import serve
from metacrate_grid_agent import LLMClient, SessionGeneration, ToolLoop
from metacrate_grid_agent.errors import JournalError
from metacrate_grid_agent.journal import FileJournal, Header, Journal, JournalRun, Record, Request

#: Tool turns each journal holds whole (the target's "16 turns").
TURNS = 16
#: How many sessions the generator runs at once.
GENERATE_AT_ONCE = 256
#: Targets: the first action within this many seconds of the process start; all within the
#: second for 10,000 sessions.
FIRST_ACTION_S = 1.0
ALL_10K_S = 30.0


class _Crashing:
    """A journal run that stops taking records once turn ``TURNS + 1``'s request is written.

    What a process killed right after that write leaves behind: the records before it,
    as the real writer wrote them, and no finish.
    """

    def __init__(self, run: JournalRun) -> None:
        self._run = run
        self._dead = False

    @property
    def run_id(self) -> str:
        return self._run.run_id

    async def append(self, record: Record) -> None:
        if self._dead:
            raise JournalError("the process is gone")
        await self._run.append(record)
        if isinstance(record, Request) and record.turn > TURNS:
            self._dead = True
            raise JournalError("the process is gone")

    async def commit(self, record: Record) -> None:
        if self._dead:
            raise JournalError("the process is gone")
        await self._run.commit(record)

    async def close(self) -> None:
        await self._run.close()


class _CrashingJournal:
    """A :class:`FileJournal` whose runs die after turn ``TURNS`` (see :class:`_Crashing`)."""

    def __init__(self, journal: FileJournal) -> None:
        self._journal = journal

    async def create(self, header: Header) -> JournalRun:
        return _Crashing(await self._journal.create(header))

    async def claim(self, run_id: str) -> tuple[JournalRun, tuple[Record, ...]]:
        raise NotImplementedError  # pragma: no cover - the generator only creates

    async def pending(self) -> tuple[str, ...]:
        return await self._journal.pending()  # pragma: no cover

    async def newest_generation(self, session_id: str) -> int | None:
        return await self._journal.newest_generation(session_id)  # pragma: no cover


async def _generate(directory: str, url: str, sessions: int) -> int:
    journal: Journal = _CrashingJournal(FileJournal(directory, secret=KEY))
    stopped = 0
    gate = asyncio.Semaphore(GENERATE_AT_ONCE)
    async with LLMClient(client_config(url)) as client:
        loop = ToolLoop(client, [MOVE_TO], Walker(), config=CONFIG, system_prompt=SYSTEM_PROMPT)

        async def one(i: int) -> None:
            nonlocal stopped
            async with gate:
                result = await loop.run(
                    "Walk to the lamp in small steps.",
                    generation=SessionGeneration(f"avatar-{i:05d}"),
                    journal=journal,
                )
            stopped += result.turns == TURNS + 1 and result.outcome == "cancelled"

        await asyncio.gather(*(one(i) for i in range(sessions)))
    return stopped


def generate(directory: str, url: str, sessions: int) -> None:
    """``sessions`` unfinished journals of ``TURNS`` turns in ``directory``."""
    logging.getLogger("metacrate_grid_agent").setLevel(logging.ERROR)  # the "crashes"
    stopped = asyncio.run(_generate(directory, url, sessions))
    if stopped != sessions:
        raise RuntimeError(f"only {stopped} of {sessions} sessions stopped after turn {TURNS}")


def _name(i: int) -> str:
    """The journal file of session ``i``."""
    return f"avatar-{i:05d}-g0-r1.journal"


def _copy(source: str, target: str, sessions: int) -> None:
    os.mkdir(target, 0o700)
    for i in range(sessions):
        for name in (_name(i), f"avatar-{i:05d}.generation"):
            shutil.copyfile(os.path.join(source, name), os.path.join(target, name))
            os.chmod(os.path.join(target, name), 0o600)


def _resume(directory: str, url: str, concurrency: int) -> dict[str, Any]:
    env = dict(os.environ, PYTHONHASHSEED="0")
    spawned = time.time()
    child = subprocess.run(  # noqa: S603 - our own module, fixed arguments
        [sys.executable, "-m", "benchmarks._recover_child", directory, url, str(concurrency)],
        capture_output=True,
        text=True,
        check=True,
        env=env,
    )
    report: dict[str, Any] = json.loads(child.stdout.splitlines()[-1])
    report["first_action_s"] = report.pop("first_action") - spawned
    report["first_reply_s"] = report.pop("first_reply") - spawned
    report["all_s"] = report.pop("end") - spawned
    return report


def measure(
    origin: str,
    *,
    sizes: tuple[int, ...] = (100, 1000, 10000),
    rounds: int = 3,
    concurrency: int = 64,
    base: str | None = None,
    reuse: str | None = None,
) -> list[dict[str, Any]]:
    """Per size: the median (and spread) of the first action and of the whole recovery.

    ``reuse``: a directory of journals this benchmark generated before (kept, never resumed
    in place), or where to generate them, to skip the generation next time."""
    url = f"{origin}/loop/{TURNS}/v1/chat/completions"
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-recovery-", dir=base) as tmp:
        source = reuse or os.path.join(tmp, "source")
        started = time.perf_counter()
        if not os.path.exists(os.path.join(source, _name(max(sizes) - 1))):
            generate(source, url, max(sizes))
        generated_s = time.perf_counter() - started
        journal_bytes = os.path.getsize(os.path.join(source, _name(0)))
        for n in sizes:
            reports = []
            for r in range(rounds):
                target = os.path.join(tmp, f"n{n}-r{r}")
                _copy(source, target, n)
                reports.append(_resume(target, url, concurrency))
                shutil.rmtree(target)
            firsts = [x["first_action_s"] for x in reports]
            replies = [x["first_reply_s"] for x in reports]
            first_cpu = [x["first_action_cpu_s"] for x in reports]
            alls = [x["all_s"] for x in reports]
            rows.append(
                {
                    "sessions": n,
                    "turns": TURNS,
                    "concurrency": concurrency,
                    "rounds": rounds,
                    "first_action_s_median": statistics.median(firsts),
                    "first_action_s": firsts,
                    "first_action_cpu_s_median": statistics.median(first_cpu),
                    "first_reply_s_median": statistics.median(replies),
                    "first_reply_s": replies,
                    "all_s_median": statistics.median(alls),
                    "all_s": alls,
                    "cpu_s": [x["cpu_s"] for x in reports],
                    "outcomes": reports[-1]["outcomes"],
                    "runs": reports[-1]["runs"],
                    "max_rss_kib": reports[-1]["max_rss_kib"],
                    "journal_bytes": journal_bytes,
                    "generate_s": generated_s,
                }
            )
    return rows


def main() -> None:
    """Measure and print the rows."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, nargs="+", default=[100, 1000, 10000])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--dir", default=None, help="where the journals go (its disk is measured)")
    parser.add_argument(
        "--source", default=None, help="keep the generated journals here, and reuse them"
    )
    args = parser.parse_args()
    with serve() as origin:
        rows = measure(
            origin,
            sizes=tuple(args.sessions),
            rounds=args.rounds,
            concurrency=args.concurrency,
            base=args.dir,
            reuse=args.source,
        )
    for row in rows:
        print(json.dumps(row))


if __name__ == "__main__":
    main()
