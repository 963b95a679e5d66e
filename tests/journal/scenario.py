"""The scripted durable session the journal tests crash and resume.

Three turns: turn 1 asks for ``look`` (read-only, ``c1``) and ``move`` (mutating, approved
first, ``c2``); turn 2 for ``wave`` (mutating, no approval, ``c3``) and ``look`` (``c4``);
the history then passes ``max_history_messages`` and one compaction runs before turn 3,
whose reply is the final text. The model is a responder keyed by the request's turn (the
``-t<n>`` of its request id), so a resumed run is answered exactly as the first one was.

Every mutating execution appends its call id to a ledger (a list in process, a file across
processes), so a test counts executions where the executor cannot hide them.
"""

from __future__ import annotations

import json
import os
import re
from typing import TYPE_CHECKING, Any, Final

from metacrate_grid_agent import (
    ApprovalRequest,
    Approved,
    CancelToken,
    Effect,
    LLMClient,
    LLMConfig,
    LoopResult,
    Message,
    Secret,
    Success,
    Tool,
    ToolLoop,
    ToolLoopConfig,
    ToolOutcome,
    ValidatedCall,
)
from metacrate_grid_agent.testing import RecordedRequest, Reply

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence
    from pathlib import Path

SESSION: Final = "avatar-7"
RUN_ID: Final = f"{SESSION}-g0-r1"
GOAL: Final = "tidy the plaza, then report"
SYSTEM: Final = "You drive an avatar. Use the tools."
KEY: Final = "sk-journal-test-key-0123456789abcdef"
FINAL_TEXT: Final = "the plaza is tidy"
MUTATING_CALLS: Final = ("c2", "c3")

LOOK: Final = Tool(
    name="look",
    description="Describe what the avatar sees.",
    parameters={"type": "object", "properties": {"radius": {"type": "number"}}},
    effect=Effect.READ_ONLY,
)
MOVE: Final = Tool(
    name="move",
    description="Walk to (x, y). Changes the world.",
    parameters={
        "type": "object",
        "properties": {"x": {"type": "number"}, "y": {"type": "number"}},
        "required": ["x", "y"],
        "additionalProperties": False,
    },
    effect=Effect.MUTATING,
)
WAVE: Final = Tool(
    name="wave",
    description="Wave at someone. Others see it.",
    parameters={"type": "object", "properties": {"at": {"type": "string"}}},
    effect=Effect.MUTATING,
    needs_approval=False,
)
TOOLS: Final = (LOOK, MOVE, WAVE)
CONFIG: Final = ToolLoopConfig(max_history_messages=7, keep_recent_messages=3)


def _reply(*calls: tuple[str, str, dict[str, Any]]) -> Reply:
    return Reply.completion(
        None, tool_calls=[(i, n, json.dumps(a)) for i, n, a in calls], usage=(10, 5)
    )


TURNS: Final = {
    1: _reply(("c1", "look", {"radius": 5}), ("c2", "move", {"x": 10, "y": 20})),
    2: _reply(("c3", "wave", {"at": "bob"}), ("c4", "look", {"radius": 2})),
    3: Reply.completion(FINAL_TEXT, usage=(12, 4)),
}
_TURN: Final = re.compile(r"-t(\d+)\Z")


def respond(request: RecordedRequest) -> Reply:
    """The model: the reply of the request's turn."""
    found = _TURN.search(request.header("X-Request-Id") or "")
    assert found is not None
    return TURNS[int(found[1])]


def llm_config(url: str) -> LLMConfig:
    """The client's configuration for the fake endpoint (no retries to muddle the counts)."""
    return LLMConfig(endpoint_url=url, api_key=Secret(KEY), max_retries=0)


class LedgerExecutor:
    """Runs the scenario's tools; each mutating execution is appended to ``ledger``.

    ``effect_hook(call_id, "before" | "after")`` is called around the ledger write (the
    crash tests kill the process there).
    """

    def __init__(
        self,
        ledger: Callable[[str], None],
        effect_hook: Callable[[str, str], None] | None = None,
    ) -> None:
        self.ledger = ledger
        self.effect_hook = effect_hook
        self.calls: list[str] = []

    async def execute(self, call: ValidatedCall, cancel: CancelToken) -> ToolOutcome:
        """Record the call; a mutating one goes to the ledger."""
        self.calls.append(call.id)
        if self.effect_hook is not None:
            self.effect_hook(call.id, "before")
        if call.effect is Effect.MUTATING:
            self.ledger(call.id)
        if self.effect_hook is not None:
            self.effect_hook(call.id, "after")
        arguments = json.dumps(dict(call.arguments), sort_keys=True)
        return Success(f"{call.name} done: {arguments}")


class Approve:
    """Approves every call it is asked about; counts the questions."""

    def __init__(self) -> None:
        self.asked: list[str] = []

    async def approve(self, request: ApprovalRequest, cancel: CancelToken) -> Approved:
        """Yes."""
        self.asked.append(request.call.id)
        return Approved()


class Summarize:
    """A deterministic summarizer."""

    def __init__(self) -> None:
        self.spans = 0

    async def summarize(self, messages: Sequence[Message], cancel: CancelToken) -> str:
        """The span's size, as text."""
        self.spans += 1
        return f"earlier: {len(messages)} messages"


def make_loop(
    client: LLMClient,
    executor: LedgerExecutor,
    *,
    tools: Sequence[Tool] = TOOLS,
    config: ToolLoopConfig = CONFIG,
    approver: Approve | None = None,
) -> ToolLoop:
    """The scenario's loop."""
    return ToolLoop(
        client,
        tools,
        executor,
        config=config,
        summarizer=Summarize(),
        system_prompt=SYSTEM,
        approver=Approve() if approver is None else approver,
    )


def shape(result: LoopResult) -> dict[str, Any]:
    """What must be equal between a crashed-and-resumed run and the uncrashed one."""
    return {
        "outcome": str(result.outcome),
        "final_text": result.final_text,
        "calls": [(c.call_id, c.name, c.status, c.observation) for c in result.calls],
        "turns": result.turns,
        "compactions": result.compactions,
        "ambiguous": None if result.ambiguous_call is None else result.ambiguous_call.call_id,
    }


def read_ledger(path: Path) -> list[str]:
    """The call ids a ledger file holds, in order."""
    if not path.exists():
        return []
    return [line for line in path.read_text().split("\n") if line]


def append_ledger(path: Path) -> Callable[[str], None]:
    """A ledger writer appending to ``path`` (one ``write`` per line, before returning)."""

    def write(call_id: str) -> None:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, f"{call_id}\n".encode())
        finally:
            os.close(fd)

    return write
