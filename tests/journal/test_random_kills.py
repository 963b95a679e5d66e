"""The random kill profile: random scripted sessions, each killed with SIGKILL at one random
point, in a real child process, then resumed by a new one.

Session ``i`` of a batch is drawn from the seed ``<batch seed>-<i>``
(:mod:`tests.journal.random_sessions`: turns, read-only and mutating calls, approvals
granted or denied, compactions). Its uncrashed run, in this process, gives the session's
end and its kill points: right before and right after each journal record, and inside each
executed call, before and after its ledger write. One of them, drawn from the same seed, is
where the child dies; a second child resumes. Then, with the ledger read here (the
executor appends each mutating execution to a file), the crash matrix's rules
(:func:`tests.journal.test_crash_matrix.check`): no mutating call twice; a kill between a
mutating intent and its result ends ``ambiguous_mutation`` naming that call; any other ends
as the uncrashed run; no request sent more than twice.

By default a handful of sessions (a few seconds); ``CRASH_PROFILE=long`` runs 1,000
(:mod:`tests.proof_profiles`; the figure in docs/proof.md).
"""

from __future__ import annotations

import json
import random
import signal
import sys
from collections import Counter
from typing import TYPE_CHECKING, Any, Final

import pytest

from metacrate_grid_agent import LLMClient, SessionGeneration
from metacrate_grid_agent.journal import FileJournal
from metacrate_grid_agent.testing import FakeEndpoint
from tests.cli.conftest import together
from tests.journal import children
from tests.journal.child import Cue, CueJournal
from tests.journal.random_sessions import Script, draw, make_loop
from tests.journal.scenario import GOAL, KEY, SESSION, LedgerExecutor, llm_config, shape
from tests.journal.test_crash_matrix import (
    LIMIT,
    check,
    journal_records,
    open_intent,
)
from tests.proof_profiles import crash_kills, crash_seed

if TYPE_CHECKING:
    from collections.abc import Sequence
    from pathlib import Path

pytestmark = pytest.mark.slow

#: What a resumed session may end as besides the uncrashed end: killed before anything was
#: durable, there is no journal to resume.
NOTHING_TO_RESUME: Final = ("holds no record", "has no journal")


class Reference:
    """A session's uncrashed run: its end and the points it can be killed at."""

    def __init__(self, end: dict[str, Any], records: int, executed: Sequence[str]) -> None:
        self.end = end
        self.points = (
            [f"before:{n}" for n in range(1, records + 1)]
            + [f"after:{n}" for n in range(1, records + 1)]
            + [f"effect:{c}:{w}" for c in executed for w in ("before", "after")]
        )


async def uncrashed(script: Script, directory: Path) -> Reference:
    """Run the session to its end here, counting its records."""
    cue = Cue(None)
    ledger: list[str] = []
    executor = LedgerExecutor(ledger.append)
    async with FakeEndpoint(responder=script.respond) as ep:
        client = LLMClient(llm_config(ep.url))
        try:
            loop = make_loop(client, executor, script)
            journal = CueJournal(FileJournal(directory, secret=KEY), cue)
            generation = SessionGeneration(SESSION, start=0)
            result = await loop.run(GOAL, generation=generation, journal=journal)
        finally:
            await client.aclose()
    assert len(ledger) == len(set(ledger)), ledger
    end = json.loads(json.dumps(shape(result)))  # as a child prints it
    return Reference(end, cue.count, executor.calls)


async def child(
    mode: str, directory: Path, url: str, seed: str, cue: str | None = None
) -> children.ChildEnd:
    """Run ``tests/journal/random_child.py``; how it ended."""
    args = [mode, str(directory), url, str(directory / "ledger"), seed]
    if cue is not None:
        args.append(cue)
    return await children.finish(await children.start("tests.journal.random_child", *args))


def ledger_of(directory: Path) -> list[str]:
    """The mutating executions the ledger file holds."""
    path = directory / "ledger"
    return [x for x in path.read_text().split("\n") if x] if path.exists() else []


async def kill_and_resume(seed: str, tmp_path: Path) -> dict[str, Any]:
    """Draw session ``seed``, run it uncrashed here, then kill it at a drawn point in a child
    and resume it in another; what happened (``broken``: None, or what broke)."""
    script = draw(seed)
    reference = await uncrashed(script, tmp_path / f"{seed}-reference")
    draw_kill = random.Random(f"kill-{seed}")  # noqa: S311 - a replayable draw, no secret
    cue = draw_kill.choice(reference.points)
    directory = tmp_path / seed
    directory.mkdir()
    async with FakeEndpoint(responder=script.respond) as ep:
        status, _, err = await child("run", directory, ep.url, seed, cue)
        intent = open_intent(journal_records(directory))
        status2, resumed, err2 = await child("resume", directory, ep.url, seed)
        ids = [r.header("X-Request-Id") for r in ep.requests]
    outcome: dict[str, Any] = {
        "seed": seed,
        "cue": cue,
        "intent": intent,
        "shape": resumed,
        "ledger": ledger_of(directory),
        "ids": ids,
    }
    if status != -signal.SIGKILL:
        broken: str | None = f"the run was not killed (status {status}): {err}"
    elif status2 != 0:
        broken = f"the resume failed (status {status2}): {err2}"
    else:
        broken = check(outcome, reference.end)
    outcome["broken"] = broken
    outcome["resent"] = max(Counter(ids).values(), default=0) == 2
    return outcome


def kills_seeds() -> list[str]:
    """The batch's session seeds."""
    base = crash_seed()
    return [f"{base}-{i}" for i in range(crash_kills())]


async def test_random_sessions_killed_at_random_points_never_run_a_mutating_call_twice(
    tmp_path: Path,
) -> None:
    """Each random session, killed at a random point and resumed in a new process, runs no
    mutating call twice and ends as the crash matrix's rules say (ambiguous naming the call
    cut between intent and result, else as uncrashed). A broken session is reported by its
    seed (``CRASH_SEED`` and ``CRASH_KILLS`` replay its batch)."""
    seeds = kills_seeds()
    outcomes = await together(*(kill_and_resume(s, tmp_path) for s in seeds), limit=LIMIT)
    broken = {f"{o['seed']} at {o['cue']}": o["broken"] for o in outcomes if o["broken"]}
    assert broken == {}
    duplicates = [o["seed"] for o in outcomes if len(o["ledger"]) != len(set(o["ledger"]))]
    assert duplicates == []
    ambiguous = sum(o["intent"] is not None for o in outcomes)
    resent = sum(o["resent"] for o in outcomes)
    executions = sum(len(o["ledger"]) for o in outcomes)
    sys.stderr.write(
        f"\nrandom kills: {len(outcomes)} sessions, seed {crash_seed()}, "
        f"{executions} mutating executions, 0 twice, {ambiguous} ambiguous, "
        f"{resent} with a request sent again\n"
    )


def test_a_seed_draws_the_same_session_and_the_batch_varies() -> None:
    """The generator is deterministic per seed (a child redraws the test's session) and its
    batch holds what the profile claims: several turns, denied approvals, compaction bounds,
    both kinds of mutating call."""
    assert draw("s-1") == draw("s-1")
    scripts = [draw(f"{crash_seed()}-{i}") for i in range(200)]
    assert len({json.dumps(s.turns) for s in scripts}) > 150
    assert {len(s.turns) for s in scripts} == {1, 2, 3, 4}
    assert any(s.denied for s in scripts)
    assert {s.max_history for s in scripts} == {5, 7, 9, 64}
    names = {n for s in scripts for turn in s.turns for _, n, _ in turn}
    assert names == {"look", "move", "wave"}
