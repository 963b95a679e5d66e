"""A child process running or resuming the journal tests' scripted session on the database
journal (DBOSJournal), killing itself on cue: ``tests/journal/child.py`` with the database
in place of the directory.

``python -m tests.dbos.matrix_child run|resume DATABASE_URL ENDPOINT_URL LEDGER [KILL]``
prints the result's shape as one JSON line (or ``{"error": kind, ...}``); ``KILL`` is as in
``tests/journal/child.py`` (``before:N``, ``after:N``, ``effect:CALL:before|after``).
"""

from __future__ import annotations

import asyncio
import json
import signal
import sys
from pathlib import Path
from typing import Any, Final

from metacrate_grid_agent import LLMClient, SessionGeneration
from metacrate_grid_agent.dbos import DBOSJournal
from metacrate_grid_agent.errors import JournalError
from tests.journal.child import Cue, CueJournal
from tests.journal.scenario import (
    GOAL,
    RUN_ID,
    SESSION,
    LedgerExecutor,
    append_ledger,
    llm_config,
    make_loop,
    shape,
)

#: Bound on the child process itself (the tests wait for it at most half a minute).
LIFETIME_S: Final = 300


async def main(mode: str, database: str, url: str, ledger: str, cue_text: str | None) -> None:
    """Run or resume, print the shape."""
    cue = Cue(cue_text)
    client = LLMClient(llm_config(url))
    inner = DBOSJournal(database)
    out: dict[str, Any]
    try:
        executor = LedgerExecutor(append_ledger(Path(ledger)), cue.effect)
        loop = make_loop(client, executor)
        journal = CueJournal(inner, cue)
        if mode == "run":
            generation = SessionGeneration(SESSION, start=0)
            result = await loop.run(GOAL, generation=generation, journal=journal)
        else:
            result = await loop.resume(journal, RUN_ID)
        out = shape(result)
    except JournalError as exc:
        out = {"error": exc.kind, "message": exc.message}
    finally:
        await inner.aclose()
        await client.aclose()
    sys.stdout.write(json.dumps(out) + "\n")


if __name__ == "__main__":
    signal.alarm(LIFETIME_S)  # SIGALRM ends it: a child a test lost never outlives this
    args = sys.argv[1:]
    asyncio.run(main(args[0], args[1], args[2], args[3], args[4] if len(args) > 4 else None))
