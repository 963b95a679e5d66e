"""The crash matrix: a journaled session killed with SIGKILL at every decision point, in a real
child process, then resumed by a new one.

The kill points: right before and right after each of the 18 journal records of the
uncrashed run (:mod:`tests.journal.scenario`), and inside each tool call's effect, before
and after its ledger write (44 in all). For each: the run's child kills itself there; a new
child resumes the run. Then:

- every mutating call is in the ledger (a file the executor appends to, read here) at most
  once;
- a kill between a mutating intent and its result ends ``ambiguous_mutation`` naming that
  call (8 of the points);
- any other kill ends exactly as the uncrashed run (outcome, calls, final text);
- a request cut by the kill is sent at most twice, with the same id (the fake's record).

Also: a host crash (the journal cut back to its last synced length after the kill), a
crash during the resume itself, and a second process trying to take a run over (locked
while the first lives, even stopped; fenced once a newer generation started).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
from collections import Counter
from typing import TYPE_CHECKING, Any, Final

import pytest

from metacrate_grid_agent.journal import Call, Finish, Result, decode_record
from metacrate_grid_agent.testing import FakeEndpoint
from tests.cli.conftest import together
from tests.journal import children
from tests.journal.children import CHILD_TIMEOUT_S
from tests.journal.scenario import FINAL_TEXT, RUN_ID, read_ledger, respond

if TYPE_CHECKING:
    from pathlib import Path

pytestmark = pytest.mark.slow

#: Children at once: one per core.
LIMIT: Final = os.cpu_count() or 1
RECORDS: Final = 18
KILL_POINTS: Final = (
    [f"before:{n}" for n in range(1, RECORDS + 1)]
    + [f"after:{n}" for n in range(1, RECORDS + 1)]
    + [f"effect:{c}:{w}" for c in ("c1", "c2", "c3", "c4") for w in ("before", "after")]
)


async def start_child(
    mode: str, directory: Path, url: str, cue: str | None = None, *, ledger: str = "ledger"
) -> asyncio.subprocess.Process:
    """Start the child (see ``tests/journal/child.py``)."""
    args = [mode, str(directory), url, str(directory / ledger)]
    if cue is not None:
        args.append(cue)
    return await children.start("tests.journal.child", *args)


async def child(
    mode: str, directory: Path, url: str, cue: str | None = None, *, ledger: str = "ledger"
) -> tuple[int, dict[str, Any] | None]:
    """Run the child; its exit status and the JSON it printed (None if killed)."""
    process = await start_child(mode, directory, url, cue, ledger=ledger)
    return await finish(process)


async def finish(process: asyncio.subprocess.Process) -> tuple[int, dict[str, Any] | None]:
    """Wait for the child (bounded); its exit status and JSON (None if killed)."""
    return children.killed_or_shape(await children.finish(process))


def journal_records(directory: Path) -> list[Any]:
    """The records of the run's journal (complete lines only)."""
    path = directory / f"{RUN_ID}.journal"
    if not path.exists():
        return []
    lines = path.read_bytes().splitlines(keepends=True)
    return [decode_record(json.dumps(json.loads(x)["j"])) for x in lines if x.endswith(b"\n")]


def open_intent(records: list[Any]) -> str | None:
    """The mutating call whose intent is journaled without its result, if any."""
    pending = None
    for record in records:
        if isinstance(record, Call) and record.mutating:
            pending = record.call_id
        elif isinstance(record, Result) and record.call_id == pending:
            pending = None
    return pending


def cut_to_last_sync(directory: Path) -> None:
    """What a host crash leaves: every byte after the last commit (intent, finish) lost."""
    path = directory / f"{RUN_ID}.journal"
    if not path.exists():
        return
    data = path.read_bytes()
    keep = 0
    offset = 0
    for line in data.splitlines(keepends=True):
        offset += len(line)
        if not line.endswith(b"\n"):
            break
        record = decode_record(json.dumps(json.loads(line)["j"]))
        if isinstance(record, Finish) or (isinstance(record, Call) and record.mutating):
            keep = offset
    path.write_bytes(data[:keep])


@pytest.fixture(scope="module")
def expected(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The uncrashed run's shape, from a child."""

    async def go() -> dict[str, Any]:
        directory = tmp_path_factory.mktemp("uncrashed")
        async with FakeEndpoint(responder=respond) as ep:
            status, shape = await child("run", directory, ep.url)
        assert status == 0
        assert shape is not None
        assert read_ledger(directory / "ledger") == ["c2", "c3"]
        assert len(journal_records(directory)) == RECORDS
        return shape

    return asyncio.run(go())


async def crash_and_resume(
    cue: str, tmp_path: Path, *, host_crash: bool = False, resume_cue: str | None = None
) -> dict[str, Any]:
    """Kill the run at ``cue``, resume it (killed at ``resume_cue`` first, if given, then
    resumed again); what happened."""
    directory = tmp_path / cue.replace(":", "-")
    directory.mkdir()
    async with FakeEndpoint(responder=respond) as ep:
        status, first = await child("run", directory, ep.url, cue)
        if host_crash:
            cut_to_last_sync(directory)
        intent = open_intent(journal_records(directory))
        resume_status = None
        if resume_cue is not None:
            resume_status, _ = await child("resume", directory, ep.url, resume_cue)
        status2, shape = await child("resume", directory, ep.url)
        ids = [r.header("X-Request-Id") for r in ep.requests]
    return {
        "cue": cue,
        "killed": status == -signal.SIGKILL,
        "first": first,
        "resume_killed": resume_status == -signal.SIGKILL,
        "intent": intent,
        "shape": shape,
        "status": status2,
        "ledger": read_ledger(directory / "ledger"),
        "ids": ids,
    }


def check(outcome: dict[str, Any], expected: dict[str, Any]) -> str | None:
    """The matrix's rules for one kill point: None, or what broke."""
    ledger = outcome["ledger"]
    shape = outcome["shape"]
    if len(ledger) != len(set(ledger)):
        return f"a mutating call ran twice: {ledger}"
    counts = Counter(outcome["ids"])
    if any(n > 2 for n in counts.values()):
        return f"a request was sent more than twice: {counts}"
    if shape is None:
        return "the resume was killed"
    if shape.get("error") == "journal" and (
        "holds no record" in shape["message"] or "has no journal" in shape["message"]
    ):
        # Killed before the header, or a host crash before the first sync: nothing to
        # resume, and no mutating call ran (none runs before its intent is durable).
        return None if not ledger else f"no journal, yet the ledger holds {ledger}"
    if outcome["intent"] is not None:
        if shape["outcome"] != "ambiguous_mutation" or shape["ambiguous"] != outcome["intent"]:
            return f"expected ambiguous_mutation naming {outcome['intent']}, got {shape}"
        return None
    if shape != expected:
        return f"ended differently: {shape}"
    return None


#: The kill points between a mutating intent and its result.
AMBIGUOUS: Final = frozenset(
    {"after:7", "before:8", "effect:c2:before", "effect:c2:after",
     "after:11", "before:12", "effect:c3:before", "effect:c3:after"}
)  # fmt: skip
#: The kill points between a reply and its record: the request is sent a second time.
RESENT: Final = frozenset({"before:3", "before:10", "before:17"})
#: The matrix runs in this many parts (each well within the per-test time limit).
PARTS: Final = 4


@pytest.mark.parametrize("part", range(PARTS))
async def test_a_kill_at_any_point_resumes_without_a_second_mutating_execution(
    part: int, expected: dict[str, Any], tmp_path: Path
) -> None:
    """The matrix (44 kill points in four parts, a real SIGKILL each, resumed in a new
    process): see the module doc for the rules."""
    points = KILL_POINTS[part::PARTS]
    outcomes = await together(*(crash_and_resume(cue, tmp_path) for cue in points), limit=LIMIT)
    broken = {o["cue"]: why for o in outcomes if (why := check(o, expected)) is not None}
    assert broken == {}
    assert all(o["killed"] for o in outcomes), [o["cue"] for o in outcomes if not o["killed"]]
    ambiguous = {o["cue"] for o in outcomes if o["intent"] is not None}
    assert ambiguous == AMBIGUOUS & set(points)
    assert expected["final_text"] == FINAL_TEXT
    # A request is sent again only when the kill fell between its reply and the reply's record.
    resent = {o["cue"] for o in outcomes if max(Counter(o["ids"]).values(), default=0) == 2}
    assert resent == RESENT & set(points)


@pytest.mark.parametrize("part", range(PARTS))
async def test_a_host_crash_loses_what_was_not_synced_and_still_runs_nothing_twice(
    part: int, expected: dict[str, Any], tmp_path: Path
) -> None:
    """The matrix again, each journal cut back to its last synced length (a host crash loses
    every byte written after the last fdatasync): still no mutating call twice, and the
    session ends ambiguous, as uncrashed, or (nothing durable yet) refuses to resume."""
    points = KILL_POINTS[part::PARTS]
    outcomes = await together(
        *(crash_and_resume(cue, tmp_path, host_crash=True) for cue in points), limit=LIMIT
    )
    broken = {o["cue"]: why for o in outcomes if (why := check(o, expected)) is not None}
    assert broken == {}


@pytest.mark.parametrize("resume_cue", [f"before:{n}" for n in (1, 2, 3)] + ["after:1"])
async def test_a_crash_during_the_resume_converges_to_the_same_end(
    resume_cue: str, expected: dict[str, Any], tmp_path: Path
) -> None:
    """Killed after turn 1's reply, then killed again while resuming (at each of its first
    records), then resumed: the same end as the uncrashed run, each call executed once."""
    outcome = await crash_and_resume("after:3", tmp_path, resume_cue=resume_cue)
    assert outcome["resume_killed"]
    assert check(outcome, expected) is None
    assert outcome["ledger"] == ["c2", "c3"]


async def wait_stopped(process: asyncio.subprocess.Process) -> None:
    """Wait (bounded) until the child has stopped itself (SIGSTOP); the wait leaves it
    waitable (``WNOWAIT``) for its exit later, and also returns if it exited instead."""
    flags = os.WSTOPPED | os.WEXITED | os.WNOWAIT
    async with asyncio.timeout(CHILD_TIMEOUT_S):
        state = await asyncio.to_thread(os.waitid, os.P_PID, process.pid, flags)
    assert state is not None
    assert state.si_code == os.CLD_STOPPED


async def test_a_stopped_process_keeps_its_run_and_runs_no_mutating_call_after_a_takeover(
    tmp_path: Path,
) -> None:
    """A process stopped (SIGSTOP) right before committing a mutating intent keeps its lock:
    a second process's resume is refused (``journal_locked``) and acts not. Once a newer
    generation of the session has run (the operator's takeover), the stopped process, woken
    (SIGCONT), runs no mutating call: its commit is fenced and it ends ``superseded``."""
    async with FakeEndpoint(responder=respond) as ep:
        stopped = await start_child("run", tmp_path, ep.url, "stop:7")
        try:
            await wait_stopped(stopped)
            sent = len(ep.requests)
            status, refused = await child("resume", tmp_path, ep.url)
            assert status == 0
            assert refused is not None
            assert refused["error"] == "journal_locked"
            assert len(ep.requests) == sent
            status, newer = await child("run-g1", tmp_path, ep.url, ledger="ledger-g1")
            assert status == 0
            assert newer is not None
            assert newer["outcome"] == "completed"
            stopped.send_signal(signal.SIGCONT)
            status, woken = await finish(stopped)
        finally:
            if stopped.returncode is None:
                stopped.kill()
                await stopped.wait()
    assert status == 0
    assert woken is not None
    assert woken["outcome"] == "superseded"
    assert read_ledger(tmp_path / "ledger") == []
    assert [c[0] for c in woken["calls"] if c[2] == "ok"] == ["c1"]


async def test_a_run_resumed_after_a_newer_generation_started_ends_superseded(
    tmp_path: Path,
) -> None:
    """Killed after turn 1's reply; generation 1 of the session then runs in another
    process; resuming the old run ends ``superseded`` with no request and no call."""
    async with FakeEndpoint(responder=respond) as ep:
        status, _ = await child("run", tmp_path, ep.url, "after:3")
        assert status == -signal.SIGKILL
        status, newer = await child("run-g1", tmp_path, ep.url, ledger="ledger-g1")
        assert newer is not None
        assert newer["outcome"] == "completed"
        sent = [r.header("X-Request-Id") for r in ep.requests]
        status, resumed = await child("resume", tmp_path, ep.url)
        assert [r.header("X-Request-Id") for r in ep.requests] == sent
    assert resumed is not None
    assert resumed["outcome"] == "superseded"
    assert read_ledger(tmp_path / "ledger") == []


async def test_a_new_process_with_changed_tools_or_settings_is_refused_and_acts_not(
    tmp_path: Path,
) -> None:
    """Killed right after ``c2``'s approval (its mutating call next); a new process whose
    tools (``wave`` removed), then one whose loop settings (``max_turns``) differ, is
    refused with ``journal_divergence`` naming the difference: no request is sent, the
    ledger stays empty, the journal keeps every byte. The unchanged program then resumes
    it to the uncrashed end."""
    path = tmp_path / f"{RUN_ID}.journal"
    async with FakeEndpoint(responder=respond) as ep:
        status, _ = await child("run", tmp_path, ep.url, "after:6")
        assert status == -signal.SIGKILL
        sent = [r.header("X-Request-Id") for r in ep.requests]
        before = path.read_bytes()
        refused: dict[str, dict[str, Any] | None] = {}
        for mode in ("resume-tools", "resume-config"):
            status, refused[mode] = await child(mode, tmp_path, ep.url)
            assert status == 0
        assert [r.header("X-Request-Id") for r in ep.requests] == sent
        assert read_ledger(tmp_path / "ledger") == []
        assert path.read_bytes() == before
        status, resumed = await child("resume", tmp_path, ep.url)
    assert refused["resume-tools"] is not None
    assert refused["resume-tools"]["error"] == "journal_divergence"
    assert "tool 'wave' is no longer registered" in refused["resume-tools"]["message"]
    assert refused["resume-config"] is not None
    assert refused["resume-config"]["error"] == "journal_divergence"
    assert "loop setting max_turns" in refused["resume-config"]["message"]
    assert resumed is not None
    assert resumed["outcome"] == "completed"
    assert resumed["final_text"] == FINAL_TEXT
    assert read_ledger(tmp_path / "ledger") == ["c2", "c3"]
