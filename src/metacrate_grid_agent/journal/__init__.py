"""Durable sessions: the journal a tool-loop run writes, and the embedded file journal.

A run given a journal (``ToolLoop.run(..., journal=FileJournal(directory))``) writes each
input of its state machine before acting on it, and makes a mutating call's intent durable
before the executor is called; :meth:`ToolLoop.resume <metacrate_grid_agent.ToolLoop.resume>`
rebuilds the run from its journal in a new process and goes on, never running a mutating
call twice (one that was cut while it ran ends the session ``ambiguous_mutation``).

:class:`Journal` and :class:`JournalRun` are the protocol a backend implements (the file
journal here; a database-backed one elsewhere); the records are the loop's inputs
(:class:`Header`, :class:`Request`, :class:`Reply`, :class:`ModelError`, :class:`Summary`,
:class:`Verdict`, :class:`Call`, :class:`Result`, :class:`Finish`), msgspec JSON.
"""

from __future__ import annotations

from metacrate_grid_agent import _public
from metacrate_grid_agent._aio._journal import Journal, JournalRun
from metacrate_grid_agent._core._journal import (
    AMBIGUOUS_ON_RESUME,
    Call,
    Cut,
    DroppedArguments,
    Finish,
    FinishReport,
    Header,
    ModelError,
    Record,
    Reply,
    Request,
    Result,
    ShownCall,
    Summary,
    ToolPrint,
    Verdict,
    decode_record,
    encode_record,
    is_commit,
    parse_run_id,
    run_id,
)
from metacrate_grid_agent.journal._file import FileJournal

__all__ = [
    "AMBIGUOUS_ON_RESUME",
    "Call",
    "Cut",
    "DroppedArguments",
    "FileJournal",
    "Finish",
    "FinishReport",
    "Header",
    "Journal",
    "JournalRun",
    "ModelError",
    "Record",
    "Reply",
    "Request",
    "Result",
    "ShownCall",
    "Summary",
    "ToolPrint",
    "Verdict",
    "decode_record",
    "encode_record",
    "is_commit",
    "parse_run_id",
    "run_id",
]

_public.claim(globals())
