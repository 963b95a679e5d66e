"""A child process running or resuming the scripted journaled session, killing itself on cue.

``python -m tests.journal.child run|run-g1|resume|resume-tools|resume-config DIR URL LEDGER
[KILL]`` (``run-g1``: the run of generation 1, a takeover of the session; ``resume-tools`` /
``resume-config``: a resume by a program whose tools / loop settings changed) prints the
result's shape (:func:`tests.journal.scenario.shape`) as one JSON line, or
``{"error": kind, ...}`` for a journal error. ``KILL`` is where the process sends itself
SIGKILL (a real crash, never a mocked one):

- ``before:N`` / ``after:N``: right before / after the N-th journal record (1 is the header)
  is written (after a commit, once it is durable);
- ``effect:CALL:before`` / ``effect:CALL:after``: inside the executor's call ``CALL``,
  before / after its ledger write;
- ``stop:N``: SIGSTOP itself right before the N-th record (the test wakes it with SIGCONT).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from metacrate_grid_agent import LLMClient, SessionGeneration, ToolLoop, ToolLoopConfig
from metacrate_grid_agent.errors import JournalError
from metacrate_grid_agent.journal import FileJournal, Header, Journal, JournalRun, Record
from tests.journal.scenario import (
    CONFIG,
    GOAL,
    KEY,
    LOOK,
    MOVE,
    RUN_ID,
    SESSION,
    LedgerExecutor,
    append_ledger,
    llm_config,
    make_loop,
    shape,
)

if TYPE_CHECKING:
    from collections.abc import Coroutine


class Cue:
    """Where to stop: the record count so far and the cue."""

    def __init__(self, cue: str | None) -> None:
        self.kind, _, rest = (cue or "none:").partition(":")
        self.rest = rest
        self.count = 0

    def record(self, when: str) -> None:
        """Called before (``when`` "before") and after each record."""
        if when == "before":
            self.count += 1
        if self.kind == when and int(self.rest) == self.count:
            os.kill(os.getpid(), signal.SIGKILL)
        if self.kind == "stop" and when == "before" and int(self.rest) == self.count:
            os.kill(os.getpid(), signal.SIGSTOP)

    def effect(self, call_id: str, when: str) -> None:
        """Called inside the executor around the ledger write."""
        if self.kind == "effect" and self.rest == f"{call_id}:{when}":
            os.kill(os.getpid(), signal.SIGKILL)


class CueRun:
    """A journal run that calls the cue around every record."""

    def __init__(self, inner: JournalRun, cue: Cue) -> None:
        self.inner = inner
        self.cue = cue

    @property
    def run_id(self) -> str:
        """The inner run's id."""
        return self.inner.run_id

    async def append(self, record: Record) -> None:
        """Append, between the cue's points."""
        self.cue.record("before")
        await self.inner.append(record)
        self.cue.record("after")

    async def commit(self, record: Record) -> None:
        """Commit, between the cue's points."""
        self.cue.record("before")
        await self.inner.commit(record)
        self.cue.record("after")

    async def close(self) -> None:
        """Close the inner run."""
        await self.inner.close()


class CueJournal:
    """A journal (a file journal here, the database journal in ``tests/dbos``) whose runs
    call the cue around every record (the header included)."""

    def __init__(self, inner: Journal, cue: Cue) -> None:
        self.inner = inner
        self.cue = cue

    async def create(self, header: Header) -> JournalRun:
        """Create, the header being the first record."""
        self.cue.record("before")
        run = await self.inner.create(header)
        self.cue.record("after")
        return CueRun(run, self.cue)

    async def claim(self, run_id: str) -> tuple[JournalRun, tuple[Record, ...]]:
        """Claim; resumed records count on from the first one written."""
        run, records = await self.inner.claim(run_id)
        return CueRun(run, self.cue), records

    async def pending(self) -> tuple[str, ...]:
        """As the inner journal."""
        return await self.inner.pending()

    async def newest_generation(self, session_id: str) -> int | None:
        """As the inner journal."""
        return await self.inner.newest_generation(session_id)


#: The resumes by a changed program: its tools (``wave`` removed) or its loop settings.
CHANGED: Final[dict[str, dict[str, Any]]] = {
    "resume-tools": {"tools": (LOOK, MOVE)},
    "resume-config": {"config": ToolLoopConfig(**{**CONFIG.to_dict(), "max_turns": 9})},
}

#: Bound on the child process itself (the tests wait for it at most half a minute).
LIFETIME_S: Final = 300


async def play(loop: ToolLoop, journal: Journal, start: int | None) -> dict[str, Any]:
    """Run the session as generation ``start``, or resume its run (``start`` None): the
    result's shape, or ``{"error": kind, "message": ...}`` for a journal error."""
    try:
        if start is not None:
            generation = SessionGeneration(SESSION, start=start)
            result = await loop.run(GOAL, generation=generation, journal=journal)
        else:
            result = await loop.resume(journal, RUN_ID)
    except JournalError as exc:
        return {"error": exc.kind, "message": exc.message}
    return shape(result)


def child_main(main: Coroutine[Any, Any, dict[str, Any]]) -> None:
    """A child's whole life: ``main`` run (SIGALRM ends the process past :data:`LIFETIME_S`,
    so a child a test lost never outlives it), then its shape printed as one JSON line."""
    signal.alarm(LIFETIME_S)
    out = asyncio.run(main)
    sys.stdout.write(json.dumps(out) + "\n")


async def main(
    mode: str, directory: str, url: str, ledger: str, cue_text: str | None
) -> dict[str, Any]:
    """Run or resume; the shape."""
    cue = Cue(cue_text)
    client = LLMClient(llm_config(url))
    try:
        executor = LedgerExecutor(append_ledger(Path(ledger)), cue.effect)
        loop = make_loop(client, executor, **CHANGED.get(mode, {}))
        journal = CueJournal(FileJournal(directory, secret=KEY), cue)
        start = {"run": 0, "run-g1": 1}.get(mode)
        return await play(loop, journal, start)
    finally:
        await client.aclose()


if __name__ == "__main__":
    args = sys.argv[1:]
    child_main(main(args[0], args[1], args[2], args[3], args[4] if len(args) > 4 else None))
