"""A child process running or resuming a random scripted session, killing itself on cue.

``python -m tests.journal.random_child run|resume DIR URL LEDGER SEED [KILL]``: the session
:func:`tests.journal.random_sessions.draw` draws from ``SEED``, journaled in ``DIR``; ``KILL``
as in :mod:`tests.journal.child` (``before:N``, ``after:N``, ``effect:CALL:before|after``).
Prints the result's shape as one JSON line, or ``{"error": kind, ...}`` for a journal error.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from metacrate_grid_agent import LLMClient
from metacrate_grid_agent.journal import FileJournal
from tests.journal.child import Cue, CueJournal, child_main, play
from tests.journal.random_sessions import draw, make_loop
from tests.journal.scenario import (
    KEY,
    LedgerExecutor,
    append_ledger,
    llm_config,
)


async def main(args: list[str]) -> dict[str, Any]:
    """Run or resume the drawn session (the command line's arguments); the shape."""
    mode, directory, url, ledger, seed = args[:5]
    cue = Cue(args[5] if len(args) > 5 else None)
    client = LLMClient(llm_config(url))
    try:
        executor = LedgerExecutor(append_ledger(Path(ledger)), cue.effect)
        loop = make_loop(client, executor, draw(seed))
        journal = CueJournal(FileJournal(directory, secret=KEY), cue)
        return await play(loop, journal, 0 if mode == "run" else None)
    finally:
        await client.aclose()


if __name__ == "__main__":
    child_main(main(sys.argv[1:]))
