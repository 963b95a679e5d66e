"""A child process running or resuming a random scripted session, killing itself on cue.

``python -m tests.journal.random_child run|resume DIR URL LEDGER SEED [KILL]``: the session
:func:`tests.journal.random_sessions.draw` draws from ``SEED``, journaled in ``DIR``; ``KILL``
as in :mod:`tests.journal.child` (``before:N``, ``after:N``, ``effect:CALL:before|after``).
Prints the result's shape as one JSON line, or ``{"error": kind, ...}`` for a journal error.
"""

from __future__ import annotations

import asyncio
import json
import signal
import sys
from pathlib import Path
from typing import Any

from metacrate_grid_agent import LLMClient, SessionGeneration
from metacrate_grid_agent.errors import JournalError
from metacrate_grid_agent.journal import FileJournal
from tests.journal.child import LIFETIME_S, Cue, CueJournal
from tests.journal.random_sessions import draw, make_loop
from tests.journal.scenario import (
    GOAL,
    KEY,
    RUN_ID,
    SESSION,
    LedgerExecutor,
    append_ledger,
    llm_config,
    shape,
)


async def main(args: list[str]) -> None:
    """Run or resume the drawn session (the command line's arguments), print the shape."""
    mode, directory, url, ledger, seed = args[:5]
    cue_text = args[5] if len(args) > 5 else None
    cue = Cue(cue_text)
    client = LLMClient(llm_config(url))
    out: dict[str, Any]
    try:
        executor = LedgerExecutor(append_ledger(Path(ledger)), cue.effect)
        loop = make_loop(client, executor, draw(seed))
        journal = CueJournal(FileJournal(directory, secret=KEY), cue)
        if mode == "run":
            generation = SessionGeneration(SESSION, start=0)
            result = await loop.run(GOAL, generation=generation, journal=journal)
        else:
            result = await loop.resume(journal, RUN_ID)
        out = shape(result)
    except JournalError as exc:
        out = {"error": exc.kind, "message": exc.message}
    finally:
        await client.aclose()
    sys.stdout.write(json.dumps(out) + "\n")


if __name__ == "__main__":
    signal.alarm(LIFETIME_S)  # SIGALRM ends it: a child a test lost never outlives this
    asyncio.run(main(sys.argv[1:]))
