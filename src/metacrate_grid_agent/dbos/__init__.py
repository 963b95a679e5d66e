"""Durable sessions on DBOS, with Postgres (or SQLite) as the store (the ``dbos`` extra).

Install with ``pip install 'metacrate-grid-agent[dbos]'``. The core library never imports
this package; importing it without the extra raises an ImportError that says so.

:class:`DBOSJournal` needs only SQLAlchemy; the parts that need DBOS itself (the sessions,
the serializer, the configuration) are imported when first used, so a process that only
reads or resumes journals does not load DBOS.
"""

from __future__ import annotations

import importlib
import importlib.util
from typing import TYPE_CHECKING, Any, Final


def _installed(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ImportError:
        return False


if not (_installed("dbos") and _installed("sqlalchemy")):  # pragma: no cover - the tidy test
    raise ImportError(
        "metacrate_grid_agent.dbos needs the optional DBOS package: install "
        "metacrate-grid-agent[dbos]"
    )

# After the check: without the extra, the hint above is the error, not a bare import's.
from metacrate_grid_agent import _public  # noqa: E402
from metacrate_grid_agent.dbos._store import DBOSJournal, DBOSJournalRun  # noqa: E402

if TYPE_CHECKING:
    from metacrate_grid_agent.dbos._config import application_version, dbos_config
    from metacrate_grid_agent.dbos._serializer import MsgspecJSON
    from metacrate_grid_agent.dbos._sessions import (
        CallSummary,
        DBOSApprover,
        DurableSessions,
        LoopBuilder,
        SessionOutcome,
        SessionSpec,
        take_over,
    )

__all__ = [
    "CallSummary",
    "DBOSApprover",
    "DBOSJournal",
    "DBOSJournalRun",
    "DurableSessions",
    "LoopBuilder",
    "MsgspecJSON",
    "SessionOutcome",
    "SessionSpec",
    "application_version",
    "dbos_config",
    "take_over",
]

#: The names that need DBOS itself, and the private module each comes from.
_ON_DBOS: Final = {
    "CallSummary": "_sessions",
    "DBOSApprover": "_sessions",
    "DurableSessions": "_sessions",
    "LoopBuilder": "_sessions",
    "SessionOutcome": "_sessions",
    "SessionSpec": "_sessions",
    "MsgspecJSON": "_serializer",
    "application_version": "_config",
    "dbos_config": "_config",
    "take_over": "_sessions",
}


def _claimed(names: list[str], values: dict[str, Any]) -> None:
    """Claim ``names`` for this module (see :mod:`metacrate_grid_agent._public`) and keep
    them here."""
    _public.claim({"__name__": __name__, "__all__": names, **values})
    globals().update(values)


def __getattr__(name: str) -> Any:
    """The parts that need DBOS, imported on first use."""
    where = _ON_DBOS.get(name)
    if where is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module = importlib.import_module(f"{__name__}.{where}")
    names = [n for n, w in _ON_DBOS.items() if w == where]
    _claimed(names, {n: getattr(module, n) for n in names})
    return globals()[name]


_claimed(
    ["DBOSJournal", "DBOSJournalRun"],
    {"DBOSJournal": DBOSJournal, "DBOSJournalRun": DBOSJournalRun},
)
