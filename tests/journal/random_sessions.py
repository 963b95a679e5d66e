"""Random scripted sessions for the random kill profile, each one drawn from a seed.

A seed (any text) draws a session: one to four tool turns of one to three calls each, every
call ``look`` (read-only), ``move`` (mutating, asked for approval, denied now and then) or
``wave`` (mutating, no approval) with random arguments, then a turn whose reply is the final
text; a history bound drawn low enough, in most sessions, to make the loop compact its
history once or more. The same seed draws the same session in every process: the test and
its children each draw it (``random.Random`` seeded with a string is stable across
processes and Python versions).

The tools, the ledger and the executor are the crash matrix's
(:mod:`tests.journal.scenario`): only the script changes.
"""

from __future__ import annotations

import json
import random
import re
from dataclasses import dataclass
from typing import Any, Final

from metacrate_grid_agent import (
    ApprovalRequest,
    Approved,
    CancelToken,
    Denied,
    LLMClient,
    ToolLoop,
    ToolLoopConfig,
)
from metacrate_grid_agent.testing import RecordedRequest, Reply
from tests.journal.scenario import SYSTEM, TOOLS, LedgerExecutor, Summarize

#: Tool turns a session has at most (each then answered; one more turn ends it with text).
MAX_TOOL_TURNS: Final = 4
#: Calls a tool turn asks for at most.
MAX_CALLS: Final = 3
#: Of the ``move`` calls, this share is denied by the operator.
DENY_SHARE: Final = 0.25
#: History bounds drawn from: the low ones make the loop compact (with three messages kept),
#: the last one never does.
HISTORY_BOUNDS: Final = (5, 7, 9, 64)
KEEP_RECENT: Final = 3
_TURN: Final = re.compile(r"-t(\d+)\Z")


@dataclass(frozen=True)
class Script:
    """One drawn session: the calls of each tool turn, the denied calls, the history bound,
    the final text."""

    seed: str
    turns: tuple[tuple[tuple[str, str, dict[str, Any]], ...], ...]
    denied: frozenset[str]
    max_history: int
    final_text: str

    @property
    def config(self) -> ToolLoopConfig:
        """The loop's configuration (the journal pins it: the resume draws the same)."""
        return ToolLoopConfig(
            max_history_messages=self.max_history, keep_recent_messages=KEEP_RECENT
        )

    @property
    def mutating(self) -> tuple[str, ...]:
        """The mutating calls the script asks for (denied ones included)."""
        return tuple(c for turn in self.turns for c, name, _ in turn if name != "look")

    def respond(self, request: RecordedRequest) -> Reply:
        """The model: the reply of the request's turn (its request id's ``-t<n>``)."""
        found = _TURN.search(request.header("X-Request-Id") or "")
        assert found is not None
        turn = int(found[1])
        if turn > len(self.turns):
            return Reply.completion(self.final_text, usage=(12, 4))
        calls = [(i, n, json.dumps(a)) for i, n, a in self.turns[turn - 1]]
        return Reply.completion(None, tool_calls=calls, usage=(10, 5))


def _arguments(rng: random.Random, name: str) -> dict[str, Any]:
    if name == "look":
        return {"radius": rng.randint(1, 9)}
    if name == "move":
        return {"x": rng.randint(-50, 50), "y": rng.randint(-50, 50)}
    return {"at": rng.choice(("bob", "ann", "cy"))}


def draw(seed: str) -> Script:
    """The session ``seed`` draws."""
    rng = random.Random(seed)  # noqa: S311 - a replayable draw, no secret
    turns = []
    denied = set()
    number = 0
    for _ in range(rng.randint(1, MAX_TOOL_TURNS)):
        calls = []
        for _ in range(rng.randint(1, MAX_CALLS)):
            number += 1
            name = rng.choice(("look", "move", "wave"))
            call_id = f"c{number}"
            calls.append((call_id, name, _arguments(rng, name)))
            if name == "move" and rng.random() < DENY_SHARE:
                denied.add(call_id)
        turns.append(tuple(calls))
    return Script(
        seed=seed,
        turns=tuple(turns),
        denied=frozenset(denied),
        max_history=rng.choice(HISTORY_BOUNDS),
        final_text=f"done ({seed})",
    )


class ScriptedApprover:
    """Approves the calls the script does not deny; counts the questions."""

    def __init__(self, denied: frozenset[str]) -> None:
        self.denied = denied
        self.asked: list[str] = []

    async def approve(self, request: ApprovalRequest, cancel: CancelToken) -> Approved | Denied:
        """Yes, unless the script denies this call."""
        self.asked.append(request.call.id)
        return Denied("not there") if request.call.id in self.denied else Approved()


def make_loop(client: LLMClient, executor: LedgerExecutor, script: Script) -> ToolLoop:
    """The loop of the drawn session."""
    return ToolLoop(
        client,
        TOOLS,
        executor,
        config=script.config,
        summarizer=Summarize(),
        system_prompt=SYSTEM,
        approver=ScriptedApprover(script.denied),
    )
