"""What DBOS stores for durable sessions is JSON, never a pickle."""

from __future__ import annotations

import pytest

from dbos import PortableWorkflowError
from metacrate_grid_agent.dbos import MsgspecJSON, SessionSpec
from metacrate_grid_agent.errors import JournalFencedError


def test_plain_data_round_trips_as_json_text() -> None:
    """Workflow inputs (DBOS's ``{"args", "kwargs"}``), outputs and messages are JSON text
    and read back equal.

    Protects: DBOS's rows for our workflows can be read by any tool, and reading one runs
    no code.
    """
    serializer = MsgspecJSON()
    value = {"args": [{"session_id": "avatar-1", "generation": 2}], "kwargs": {}}
    text = serializer.serialize(value)
    assert text == '{"args":[{"session_id":"avatar-1","generation":2}],"kwargs":{}}'
    assert serializer.deserialize(text) == value
    assert serializer.name() == "grid_agent_msgspec_json"


def test_an_error_is_stored_as_name_kind_and_message() -> None:
    """An exception becomes its class name, stable kind and message, and reads back as a
    PortableWorkflowError carrying them; never a pickled object.

    Protects: a failed workflow's error in the database is data, not code.
    """
    serializer = MsgspecJSON()
    text = serializer.serialize(JournalFencedError("a newer generation started", run_id="r"))
    assert "pickle" not in text
    assert '"name":"JournalFencedError"' in text
    assert '"kind":"journal_fenced"' in text
    error = serializer.deserialize(text)
    assert isinstance(error, PortableWorkflowError)
    assert (error.name, error.code, error.message) == (
        "JournalFencedError",
        "journal_fenced",
        "a newer generation started",
    )


def test_what_is_not_plain_data_is_refused_not_pickled() -> None:
    """A value JSON cannot hold is refused with a TypeError that says why; a struct of ours
    is stored as its fields.

    Protects: nothing falls back to pickle, ever.
    """
    serializer = MsgspecJSON()

    class Opaque:
        pass

    with pytest.raises(TypeError, match="never pickles"):
        serializer.serialize(Opaque())
    spec = SessionSpec(app="a", session_id="s", generation=1, goal="g", avatar="s")
    assert serializer.deserialize(serializer.serialize(spec))["avatar"] == "s"
