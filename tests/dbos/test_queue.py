"""The fleet's queue on DBOS: one running session per avatar, and a cap on running sessions.

One worker process (tests/dbos/worker.py, mode ``queue``) runs five sessions through
:class:`~metacrate_grid_agent.dbos.DurableSessions` on SQLite; its executors record, in
order, when each session's workflow starts and when it reaches its mutating call, and who
is inside the read-only call with whom. Each wait in them is on what another session
recorded (bounded), never on the clock: if the queue ran two sessions of one avatar at
once, the second would start while the first waits inside its first call for the other
avatar's session, and the record would show it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest

from tests.dbos.crash import finish, spawn

if TYPE_CHECKING:
    from pathlib import Path

# One child process launching DBOS (seconds on a loaded two-core machine).
pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

AVATAR = {"fleet-a1": "a", "fleet-a2": "a", "fleet-b1": "b", "cap-x": "x", "cap-y": "y"}
CAPPED = {"cap-x", "cap-y"}


def _overlaps(events: list[list[str]]) -> list[tuple[str, str]]:
    """Sessions that started while another that must not run beside them was running (same
    avatar, or both on the capped queue), from the executors' ordered record."""
    running: set[str] = set()
    found: list[tuple[str, str]] = []
    for what, session in events:
        if what == "start":
            found += [
                (other, session)
                for other in sorted(running)
                if AVATAR[other] == AVATAR[session] or {other, session} <= CAPPED
            ]
            running.add(session)
        else:
            running.discard(session)
    return found


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_one_running_session_per_avatar_and_the_cap_on_running_sessions(
    database_url: str, tmp_path: Path
) -> None:
    """Two sessions of avatar ``a`` never run at once, while ``b``'s runs beside one of them
    (each was inside its first call while the other was); on a queue capped at one running
    session (``max_running_sessions=1``: at most one model request in flight across the
    fleet), the second session does not start while the first runs, though the first
    waited five queue polls for it. Every session completes; DBOS's record shows each on
    its queue, partitioned by its avatar.

    Protects: the queue partitioned by avatar (one running session per avatar across the
    fleet) and the global cap on running sessions, hence on concurrent model requests.
    """
    done: dict[str, Any] = finish(spawn("queue", database_url, tmp_path))
    assert set(done["outcomes"].values()) == {"completed"}, done
    assert _overlaps(done["events"]) == [], done["events"]
    assert any(
        "fleet-b1" in together and {"fleet-a1", "fleet-a2"} & set(together)
        for together in done["seen_together"]
    ), done["seen_together"]
    assert not any({"fleet-a1", "fleet-a2"} <= set(t) for t in done["seen_together"])
    # The first capped session waited for the other, which did not start meanwhile.
    assert len(done["timeouts"]) == 1, done
    assert set(done["timeouts"]) <= CAPPED, done
    starts = [s for what, s in done["events"] if what == "start"]
    assert sorted(starts) == sorted(AVATAR)
    assert done["queues"] == {
        f"{s}-g1-r1": [
            "grid_agent_test_capped" if s in CAPPED else "grid_agent_sessions",
            AVATAR[s],
        ]
        for s in AVATAR
    }
