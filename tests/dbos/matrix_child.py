"""A child process running or resuming the journal tests' scripted session on the database
journal (DBOSJournal), killing itself on cue: ``tests/journal/child.py`` with the database
in place of the directory.

``python -m tests.dbos.matrix_child run|resume DATABASE_URL ENDPOINT_URL LEDGER [KILL]``
prints the result's shape as one JSON line (or ``{"error": kind, ...}``); ``KILL`` is as in
``tests/journal/child.py`` (``before:N``, ``after:N``, ``effect:CALL:before|after``).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from metacrate_grid_agent import LLMClient
from metacrate_grid_agent.dbos import DBOSJournal
from tests.journal.child import Cue, CueJournal, child_main, play
from tests.journal.scenario import (
    LedgerExecutor,
    append_ledger,
    llm_config,
    make_loop,
)


async def main(
    mode: str, database: str, url: str, ledger: str, cue_text: str | None
) -> dict[str, Any]:
    """Run or resume; the shape."""
    cue = Cue(cue_text)
    client = LLMClient(llm_config(url))
    inner = DBOSJournal(database)
    try:
        executor = LedgerExecutor(append_ledger(Path(ledger)), cue.effect)
        loop = make_loop(client, executor)
        return await play(loop, CueJournal(inner, cue), 0 if mode == "run" else None)
    finally:
        await inner.aclose()
        await client.aclose()


if __name__ == "__main__":
    args = sys.argv[1:]
    child_main(main(args[0], args[1], args[2], args[3], args[4] if len(args) > 4 else None))
