"""Resume in process: a journaled run cut after any record resumes to the same end, and a
mutating call is never executed twice.

The journal of one uncrashed scripted run (:mod:`tests.journal.scenario`) is cut after each
of its lines, as a process killed right after writing that record leaves it (and as a host
crash leaves it at a sync point); each prefix is resumed by a new loop. The real-process
matrix (SIGKILL, a new interpreter) is ``test_crash_matrix.py``; this one is its fast twin.
"""

from __future__ import annotations

import os
import stat
from typing import TYPE_CHECKING, Any

import pytest

from metacrate_grid_agent import (
    LLMClient,
    Outcome,
    SessionGeneration,
    Tool,
    ToolLoop,
    ToolLoopConfig,
    transcript,
)
from metacrate_grid_agent.errors import (
    JournalDivergenceError,
    JournalError,
    JournalLockedError,
)
from metacrate_grid_agent.journal import (
    AMBIGUOUS_ON_RESUME,
    Call,
    FileJournal,
    Result,
    decode_record,
)
from metacrate_grid_agent.testing import FakeEndpoint
from tests.journal.scenario import (
    CONFIG,
    FINAL_TEXT,
    GOAL,
    KEY,
    LOOK,
    MOVE,
    RUN_ID,
    SESSION,
    TOOLS,
    WAVE,
    LedgerExecutor,
    llm_config,
    make_loop,
    respond,
    shape,
)

if TYPE_CHECKING:
    from pathlib import Path

Uncrashed = tuple[dict[str, Any], list[str], list[str]]
"""The uncrashed run's shape, ledger and journal lines."""


async def _run_uncrashed(directory: Path) -> tuple[dict[str, Any], list[str]]:
    ledger: list[str] = []
    async with FakeEndpoint(responder=respond) as ep:
        client = LLMClient(llm_config(ep.url))
        try:
            loop = make_loop(client, LedgerExecutor(ledger.append))
            result = await loop.run(
                GOAL,
                generation=SessionGeneration(SESSION),
                journal=FileJournal(directory, secret=KEY),
            )
        finally:
            await client.aclose()
    return shape(result), ledger


def _lines(directory: Path) -> list[str]:
    return (directory / f"{RUN_ID}.journal").read_text().splitlines(keepends=True)


@pytest.fixture(scope="module")
def uncrashed(tmp_path_factory: pytest.TempPathFactory) -> Uncrashed:
    """The uncrashed run's shape, ledger and journal lines."""
    import asyncio

    directory = tmp_path_factory.mktemp("uncrashed")
    expected, ledger = asyncio.run(_run_uncrashed(directory))
    return expected, ledger, _lines(directory)


def test_the_uncrashed_run_journals_every_input(
    uncrashed: Uncrashed,
) -> None:
    """The scenario runs as scripted, and its journal holds header, requests, replies, the
    verdict, each call before its result, the summary and the finish, in that order."""
    expected, ledger, lines = uncrashed
    assert expected["outcome"] == "completed"
    assert expected["final_text"] == FINAL_TEXT
    assert expected["compactions"] == 1
    assert ledger == ["c2", "c3"]
    kinds = [decode_record(_j(line)).__struct_config__.tag for line in lines]
    assert kinds == [
        "header", "request", "reply", "call", "result", "approval", "call", "result",
        "request", "reply", "call", "result", "call", "result", "summary", "request",
        "reply", "finish",
    ]  # fmt: skip


def _j(line: str) -> bytes:
    """The journal record of a line (its ``j`` member)."""
    import json

    return json.dumps(json.loads(line)["j"]).encode()


def _cut_records(lines: list[str], keep: int) -> tuple[list[str], list[str]]:
    """The mutating calls executed before a crash right after line ``keep`` (their result
    journaled), and the one whose intent is journaled without its result, if any."""
    done: list[str] = []
    open_intent: list[str] = []
    for line in lines[:keep]:
        record = decode_record(_j(line))
        if isinstance(record, Call) and record.mutating:
            open_intent = [record.call_id]
        elif isinstance(record, Result) and open_intent == [record.call_id]:
            done.append(record.call_id)
            open_intent = []
    return done, open_intent


async def _resume(directory: Path, ledger: list[str], **loop_args: Any) -> tuple[Any, FakeEndpoint]:
    async with FakeEndpoint(responder=respond) as ep:
        client = LLMClient(llm_config(ep.url))
        try:
            loop = make_loop(client, LedgerExecutor(ledger.append), **loop_args)
            result = await loop.resume(FileJournal(directory, secret=KEY), RUN_ID)
        finally:
            await client.aclose()
    return result, ep


@pytest.mark.parametrize("keep", range(1, 19))
async def test_a_run_cut_after_any_record_resumes_to_the_same_end(
    keep: int, uncrashed: Uncrashed, tmp_path: Path
) -> None:
    """Cut after record ``keep``: every mutating call is in the ledger at most once; an intent
    without its result ends ``ambiguous_mutation`` naming that call; any other cut ends
    exactly as the uncrashed run (outcome, calls, final text); a request whose reply was
    lost is sent again with the same id, at most once more."""
    expected, _, lines = uncrashed
    (tmp_path / f"{RUN_ID}.journal").write_text("".join(lines[:keep]))
    done, open_intent = _cut_records(lines, keep)
    ledger = list(done)
    result, ep = await _resume(tmp_path, ledger)
    assert sorted(set(ledger)) == sorted(ledger), f"a mutating call ran twice: {ledger}"
    got = shape(result)
    if open_intent:
        assert got["outcome"] == "ambiguous_mutation"
        assert got["ambiguous"] == open_intent[0]
        assert result.ambiguous_call.observation == AMBIGUOUS_ON_RESUME
        assert ep.requests == []
    else:
        assert got == expected
        assert sorted(ledger) == ["c2", "c3"]
    sent = [r.header("X-Request-Id") for r in ep.requests]
    assert len(sent) == len(set(sent))
    # The resumed journal reads back as a transcript with a finish, and resumes again to
    # the same result without acting.
    assert transcript.load(tmp_path / f"{RUN_ID}.journal").finish is not None
    again, ep2 = await _resume(tmp_path, list(ledger))
    assert shape(again) == got
    assert ep2.requests == []


async def test_the_journal_is_private_and_holds_no_key(
    uncrashed: Uncrashed, tmp_path: Path
) -> None:
    """The journal's file is 0600, and the key appears nowhere in it (nor in the generation
    file)."""
    await _run_uncrashed(tmp_path)
    for name in os.listdir(tmp_path):
        path = os.path.join(tmp_path, name)
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
        with open(path, encoding="utf-8") as file:  # noqa: ASYNC230 - a small local file
            assert KEY not in file.read()


async def test_a_second_resumer_is_refused_while_the_first_holds_the_run(
    uncrashed: Uncrashed, tmp_path: Path
) -> None:
    """Two resumers of one run: the second gets ``JournalLockedError`` and acts not."""
    _, _, lines = uncrashed
    (tmp_path / f"{RUN_ID}.journal").write_text("".join(lines[:3]))
    journal = FileJournal(tmp_path)
    held, _ = await journal.claim(RUN_ID)
    try:
        with pytest.raises(JournalLockedError):
            await _resume(tmp_path, [])
    finally:
        await held.close()


CHANGED_MOVE = Tool(
    name="move", description="Run to (x, y).", parameters=MOVE.parameters, effect=MOVE.effect
)


@pytest.mark.parametrize(
    ("tools", "config", "approver", "difference"),
    [
        ((LOOK, MOVE), None, True, "tool 'wave' is no longer registered"),
        ((LOOK, CHANGED_MOVE, WAVE), None, True, "tool 'move' changed its description"),
        ((LOOK, WAVE, MOVE), None, True, "the tools are registered in another order"),
        (TOOLS, {"max_turns": 9}, True, "loop setting max_turns"),
        (TOOLS, None, False, "the run had an approver, this loop has none"),
    ],
)
async def test_a_changed_tool_or_setting_is_refused_before_any_action(  # noqa: PLR0917
    tools: Any,
    config: Any,
    approver: bool,
    difference: str,
    uncrashed: Uncrashed,
    tmp_path: Path,
) -> None:
    """A journal whose tools, schemas, settings or approval differ from the resuming loop's
    is refused with a divergence error naming the difference; nothing is sent or run."""
    _, _, lines = uncrashed
    (tmp_path / f"{RUN_ID}.journal").write_text("".join(lines[:3]))
    ledger: list[str] = []
    loop_config = CONFIG if config is None else ToolLoopConfig(**{**CONFIG.to_dict(), **config})
    async with FakeEndpoint(responder=respond) as ep:
        client = LLMClient(llm_config(ep.url))
        try:
            executor = LedgerExecutor(ledger.append)
            loop = make_loop(client, executor, tools=tools, config=loop_config)
            if not approver:
                loop = ToolLoop(client, tools, executor, config=loop_config)
            with pytest.raises(JournalDivergenceError) as caught:
                await loop.resume(FileJournal(tmp_path), RUN_ID)
        finally:
            await client.aclose()
    assert difference in caught.value.difference
    assert ep.requests == []
    assert executor.calls == []


async def test_a_superseded_run_ends_without_acting(uncrashed: Uncrashed, tmp_path: Path) -> None:
    """Resumed while a newer generation of its session is current: ``superseded``, with no
    request and no call; the mutating call cut in flight is named ambiguous, never re-run."""
    _, _, lines = uncrashed
    (tmp_path / f"{RUN_ID}.journal").write_text("".join(lines[:7]))  # c2's intent
    (tmp_path / f"{SESSION}.generation").write_text("1")
    ledger: list[str] = []
    result, ep = await _resume(tmp_path, ledger)
    assert result.outcome is Outcome.SUPERSEDED
    assert ep.requests == []
    assert ledger == []
    assert result.ambiguous_call is not None
    assert result.ambiguous_call.call_id == "c2"


async def test_a_run_past_its_deadline_ends_bound_reached_without_acting(
    uncrashed: Uncrashed, tmp_path: Path
) -> None:
    """``max_session_s`` counts the downtime: a run resumed after its deadline ends
    ``bound_reached`` (wall clock) with no request and no call."""
    import json

    _, _, lines = uncrashed
    header = json.loads(lines[0])
    header["j"]["anchor"] -= 10_000.0  # started long ago: past max_session_s (600 s)
    edited = json.dumps(header, separators=(",", ":"))
    from metacrate_grid_agent.journal._format import line_hash

    second = json.loads(lines[1])
    second["prev"] = line_hash(edited)
    (tmp_path / f"{RUN_ID}.journal").write_text(
        edited + "\n" + json.dumps(second, separators=(",", ":")) + "\n"
    )
    ledger: list[str] = []
    result, ep = await _resume(tmp_path, ledger)
    assert result.outcome is Outcome.BOUND_REACHED
    assert result.bound == "wall_clock"
    assert ep.requests == []
    assert ledger == []


@pytest.mark.parametrize(
    "damage",
    ["edited", "deep", "not_json_middle", "no_header"],
)
async def test_a_damaged_journal_is_a_typed_error(
    damage: str, uncrashed: Uncrashed, tmp_path: Path
) -> None:
    """A journal changed after it was written, nested past the bound, broken in the middle
    or without its header is refused with ``JournalError``, bounded, before any action."""
    _, _, lines = uncrashed
    lines = list(lines[:5])
    if damage == "edited":
        lines[2] = lines[2].replace("c1", "cX")
    elif damage == "deep":
        lines.insert(2, "[" * 5000 + "]" * 5000 + "\n")
    elif damage == "not_json_middle":
        lines[2] = "{nope\n"
    else:
        lines = lines[1:]
    (tmp_path / f"{RUN_ID}.journal").write_text("".join(lines))
    with pytest.raises(JournalError) as caught:
        await _resume(tmp_path, [])
    assert len(caught.value.message) < 400


async def test_a_symbolic_link_is_never_written_through(tmp_path: Path) -> None:
    """A run's journal path that is a symbolic link is refused; its target is untouched."""
    target = tmp_path / "target"
    target.write_text("keep")
    directory = tmp_path / "journal"
    directory.mkdir()
    os.symlink(target, directory / f"{RUN_ID}.journal")
    with pytest.raises(JournalError):
        await _resume(directory, [])
    assert target.read_text() == "keep"


@pytest.mark.parametrize(("cut_in", "ambiguous"), [("c1", None), ("c2", "c2")])
async def test_a_run_cut_by_its_operator_resumes_to_the_same_end_without_acting(
    cut_in: str, ambiguous: str | None, tmp_path: Path
) -> None:
    """A journaled run cut from outside (the operator's token, inside a call) keeps the cut
    in its finish record: resumed, it returns the same result (a mutating call cut in flight
    still ambiguous) and sends nothing, runs nothing."""
    from metacrate_grid_agent import CancelToken

    cancel = CancelToken()

    def cut(call_id: str, when: str) -> None:
        if call_id == cut_in and when == "after":
            cancel.cancel("shutdown")

    ledger: list[str] = []
    async with FakeEndpoint(responder=respond) as ep:
        client = LLMClient(llm_config(ep.url))
        try:
            loop = make_loop(client, LedgerExecutor(ledger.append, cut))
            first = await loop.run(
                GOAL,
                generation=SessionGeneration(SESSION),
                cancel=cancel,
                journal=FileJournal(tmp_path, secret=KEY),
            )
        finally:
            await client.aclose()
    assert first.outcome is Outcome.CANCELLED
    assert shape(first)["ambiguous"] == ambiguous
    again, ep2 = await _resume(tmp_path, ledger)
    assert shape(again) == shape(first)
    assert ep2.requests == []
    assert ledger == ([] if cut_in == "c1" else ["c2"])


async def test_a_last_line_cut_mid_way_is_cut_off_and_the_run_resumes(
    uncrashed: Uncrashed, tmp_path: Path
) -> None:
    """A crash in the middle of a line's write leaves a partial last line: the resume cuts it
    off (the file ends at the last complete line) and goes on as from the line before."""
    expected, _, lines = uncrashed
    partial = lines[3][: len(lines[3]) // 2]  # c1's call record, half written
    path = tmp_path / f"{RUN_ID}.journal"
    path.write_text("".join(lines[:3]) + partial)
    ledger: list[str] = []
    result, _ = await _resume(tmp_path, ledger)
    assert shape(result) == expected
    assert sorted(ledger) == ["c2", "c3"]
    assert transcript.load(path).notes == ()  # no cut line left, a finish, the chain whole


@pytest.mark.parametrize("keep", [5, 6, 7])
async def test_an_approval_asked_but_not_answered_is_asked_again_once(
    keep: int, uncrashed: Uncrashed, tmp_path: Path
) -> None:
    """A run cut after ``c2``'s approval was asked but before its verdict was journaled
    (``keep`` 5) asks the approver again, exactly once, for that call; once the verdict is
    journaled (6: the verdict, 7: the intent) the approver is not asked again."""
    from tests.journal.scenario import Approve

    _, _, lines = uncrashed
    assert decode_record(_j(lines[5])).__struct_config__.tag == "approval"
    (tmp_path / f"{RUN_ID}.journal").write_text("".join(lines[:keep]))
    approver = Approve()
    await _resume(tmp_path, [], approver=approver)
    assert approver.asked == (["c2"] if keep == 5 else [])


async def test_a_finished_run_resumed_does_nothing_and_returns_its_result(
    uncrashed: Uncrashed, tmp_path: Path
) -> None:
    """A run whose finish record is journaled, resumed: no request is sent, no call runs,
    no approval is asked, the journal is not written, and the recorded result is returned
    (outcome, calls, final text)."""
    from tests.journal.scenario import Approve

    expected, _, lines = uncrashed
    path = tmp_path / f"{RUN_ID}.journal"
    path.write_text("".join(lines))
    before = path.read_bytes()
    ledger: list[str] = []
    approver = Approve()
    async with FakeEndpoint(responder=respond) as ep:
        client = LLMClient(llm_config(ep.url))
        try:
            executor = LedgerExecutor(ledger.append)
            loop = make_loop(client, executor, approver=approver)
            result = await loop.resume(FileJournal(tmp_path, secret=KEY), RUN_ID)
        finally:
            await client.aclose()
    assert shape(result) == expected
    assert ep.requests == []
    assert executor.calls == []
    assert ledger == []
    assert approver.asked == []
    assert path.read_bytes() == before
