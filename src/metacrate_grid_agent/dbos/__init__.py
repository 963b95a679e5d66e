"""Durable sessions on DBOS, with Postgres (or SQLite) as the store (the ``dbos`` extra).

Install with ``pip install 'metacrate-grid-agent[dbos]'``. The core library never imports
this package; importing it without the extra raises an ImportError that says so.
"""

from __future__ import annotations

try:
    import dbos as _engine  # noqa: F401 - only to fail early with a clear message
except ImportError as exc:  # pragma: no cover - exercised by the import tidy test
    raise ImportError(
        "metacrate_grid_agent.dbos needs the optional DBOS package: install "
        "metacrate-grid-agent[dbos]"
    ) from exc

from metacrate_grid_agent import _public
from metacrate_grid_agent.dbos._config import application_version, dbos_config
from metacrate_grid_agent.dbos._serializer import MsgspecJSON
from metacrate_grid_agent.dbos._sessions import (
    CallSummary,
    DBOSApprover,
    DurableSessions,
    SessionOutcome,
    SessionSpec,
)
from metacrate_grid_agent.dbos._store import DBOSJournal, DBOSJournalRun

__all__ = [
    "CallSummary",
    "DBOSApprover",
    "DBOSJournal",
    "DBOSJournalRun",
    "DurableSessions",
    "MsgspecJSON",
    "SessionOutcome",
    "SessionSpec",
    "application_version",
    "dbos_config",
]

_public.claim(globals())
