"""The pure resume (``_core/_resume.py``): a journal that does not match what the loop decides
is refused at the first record that differs, naming it; nothing of it is papered over.

The records are those of the uncrashed scripted run (``test_resume.py``'s fixture), each
table row changing one thing; :func:`replay` feeds them to a new machine and must raise
:class:`JournalDivergenceError` (or :class:`JournalError` for a header this library cannot
read) with the difference in words.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import msgspec
import pytest

from metacrate_grid_agent import Failure, Success
from metacrate_grid_agent._core._resume import (
    check_header,
    completion_of,
    error_of,
    outcome_of,
    replay,
)
from metacrate_grid_agent._core._schema import ToolRegistry
from metacrate_grid_agent._core._wire import OversizedToolCall
from metacrate_grid_agent.errors import (
    HTTPStatusError,
    JournalDivergenceError,
    JournalError,
    TransportError,
)
from metacrate_grid_agent.journal import (
    Call,
    DroppedArguments,
    Finish,
    Header,
    ModelError,
    Record,
    Reply,
    Request,
    Result,
    Verdict,
    decode_record,
)
from tests.journal.scenario import CONFIG, TOOLS
from tests.journal.test_resume import _lines, _run_uncrashed

if TYPE_CHECKING:
    from collections.abc import Callable

Records = list[Record]


@pytest.fixture(scope="module")
def journaled(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """The journal lines of the uncrashed scripted run."""
    import asyncio

    directory = tmp_path_factory.mktemp("uncrashed")
    asyncio.run(_run_uncrashed(directory))
    return _lines(directory)


#: The uncrashed run's record kinds, by index (see test_resume.py).
#: 0 header, 1 request, 2 reply, 3 call (read-only c1), 4 result, 5 approval, 6 call (c2,
#: mutating), 7 result, 8 request, 9 reply, ..., 14 summary, 15 request, 16 reply, 17 finish.


def _records(lines: list[str]) -> Records:
    return [decode_record(json.dumps(json.loads(line)["j"]).encode()) for line in lines]


def _replace(record: Any, **changes: Any) -> Any:
    return msgspec.structs.replace(record, **changes)


def _replay(records: Records) -> object:
    registry = ToolRegistry.build(TOOLS, CONFIG)
    return replay(records, config=CONFIG, registry=registry, approval=True)


#: Each case: how the records change, and words the difference must hold.
CASES: list[tuple[str, Callable[[Records], Records], str]] = [
    ("a record after the finish", lambda r: [*r, r[1]], "follows the finish"),
    ("the header twice", lambda r: [*r[:2], r[0]], "repeats the header"),
    (
        "another request id",
        lambda r: [r[0], _replace(r[1], request_id="elsewhere-t9")],
        "holds request elsewhere-t9, the loop decided request",
    ),
    ("a reply never asked for", lambda r: [r[0], r[2]], "holds a reply"),
    ("a summary out of place", lambda r: [*r[:3], r[14]], "holds a summary, the loop decided"),
    (
        "an approval of another call",
        lambda r: [*r[:5], _replace(r[5], call_id="zz")],
        "holds approval of zz, the loop decided approval of",
    ),
    (
        "a call with other arguments",
        lambda r: [*r[:3], _replace(r[3], arguments='{"changed":1}')],
        "has another arguments now",
    ),
    ("a call before its reply", lambda r: [*r[:2], r[3]], "the loop decided request"),
    (
        "a result of a call never journaled",
        lambda r: [*r[:4], _replace(r[4], call_id="nope")],
        "result of a call not journaled",
    ),
    ("a mutating intent twice", lambda r: [*r[:7], r[6]], "twice"),
    (
        "a finish with another outcome",
        lambda r: [*r[:17], _replace(r[17], outcome="bound_reached")],
        "holds finish bound_reached, the loop decided the finish (completed)",
    ),
    ("a finish at the start", lambda r: [r[0], r[17]], "the loop decided request"),
]


@pytest.mark.parametrize(("change", "words"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_a_record_that_differs_from_the_decision_is_refused_naming_it(
    change: Callable[[Records], Records], words: str, journaled: list[str]
) -> None:
    """Each journal changed in one place stops the replay at that record, naming it."""
    records = _records(journaled)
    _replay(records)  # unchanged, it replays
    with pytest.raises(JournalDivergenceError) as caught:
        _replay(change(records))
    assert words in caught.value.difference


def test_the_kinds_the_table_relies_on(journaled: list[str]) -> None:
    """The indexes above are the records they are said to be."""
    records = _records(journaled)
    kinds = {0: Header, 1: Request, 2: Reply, 3: Call, 4: Result, 5: Verdict, 17: Finish}
    assert all(isinstance(records[i], kind) for i, kind in kinds.items())
    intent, read = records[6], records[3]
    assert isinstance(intent, Call)
    assert isinstance(read, Call)
    assert intent.mutating
    assert not read.mutating


def test_a_journal_without_its_header_is_refused() -> None:
    """No records, or a first record other than the header: a typed error, no machine."""
    with pytest.raises(JournalError, match="starts with its header"):
        _replay([])


def test_a_header_of_another_format_or_with_edited_tools_is_refused(
    journaled: list[str],
) -> None:
    """The header's format version and the hash of its tools are checked before the tools
    are compared: an edited journal is a typed error, not a divergence to explain."""
    header = _records(journaled)[0]
    assert isinstance(header, Header)
    prints = header.tools
    check_header(header, config=CONFIG, prints=prints, approval=True)
    with pytest.raises(JournalError, match="journal format"):
        check_header(_replace(header, version=999), config=CONFIG, prints=prints, approval=True)
    edited = _replace(header, tools_hash="0" * 64)
    with pytest.raises(JournalError, match="do not match their hash"):
        check_header(edited, config=CONFIG, prints=prints, approval=True)
    with pytest.raises(JournalDivergenceError, match="another order"):
        check_header(header, config=CONFIG, prints=prints[::-1], approval=True)


def test_a_reply_with_dropped_arguments_is_rebuilt_as_the_oversized_call(
    journaled: list[str],
) -> None:
    """A reply journaled with a call whose arguments were dropped comes back with that call
    as the :class:`OversizedToolCall` the client returned (size kept); an index out of
    range is ignored."""
    reply = _records(journaled)[2]
    assert isinstance(reply, Reply)
    kept = completion_of(reply)
    assert kept is reply.completion
    dropped = _replace(reply, dropped=(DroppedArguments(0, 123_456), DroppedArguments(7, 1)))
    calls = completion_of(dropped).tool_calls
    assert len(calls) == len(reply.completion.tool_calls)
    call = calls[0]
    assert isinstance(call, OversizedToolCall)
    assert (call.id, call.name, call.argument_bytes) == (
        reply.completion.tool_calls[0].id,
        reply.completion.tool_calls[0].name,
        123_456,
    )


def test_a_model_error_is_rebuilt_as_its_class_by_kind() -> None:
    """A journaled model error comes back as the class of its stable kind with the recorded
    fields (an HTTP status keeps its status); an unknown kind becomes a TransportError."""
    status = error_of(
        ModelError(
            t=1.0,
            request_id="r-t1",
            error_kind="http_status",
            message="HTTP 503",
            status=503,
            retryable=True,
            attempts=3,
            elapsed_s=2.5,
        )
    )
    assert isinstance(status, HTTPStatusError)
    assert (status.status, status.retryable, status.attempts, status.elapsed_s) == (
        503,
        True,
        3,
        2.5,
    )
    assert (status.request_id, status.message) == ("r-t1", "HTTP 503")
    other = error_of(ModelError(t=1.0, request_id=None, error_kind="no_such_kind", message="x"))
    assert type(other) is TransportError
    assert other.message == "x"


def test_a_result_is_rebuilt_as_the_executors_outcome() -> None:
    """success, failure and anything else (ambiguous) come back as the executor said."""
    made = [
        outcome_of(Result(t=0.0, call_id="c", status=s, observation="o", latency_s=0.0))
        for s in ("success", "failure", "ambiguous")
    ]
    assert made[0] == Success("o")
    assert made[1] == Failure("o")
    assert type(made[2]).__name__ == "Ambiguous"
