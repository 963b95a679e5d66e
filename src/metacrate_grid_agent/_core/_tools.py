"""Public tool-side types: tools, validated calls, outcomes, approval requests and verdicts.

Pure data: the protocols that take them across the I/O boundary (``ToolExecutor``,
``Approver``, ``Summarizer``) are in ``_aio/_protocols.py``.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = [
    "Ambiguous",
    "ApprovalRequest",
    "Approved",
    "Denied",
    "Effect",
    "Failure",
    "Success",
    "Tool",
    "ToolOutcome",
    "ValidatedCall",
]


class Effect(enum.StrEnum):
    """What a tool does to the world."""

    READ_ONLY = "read_only"
    """Looks only: an error is a plain failure, reported to the model."""
    MUTATING = "mutating"
    """Changes the world (move, say, give, build): an unclear result ends the session."""


@dataclass(frozen=True, slots=True)
class Tool:
    """A tool the model may call: name, description, JSON-schema parameters and effect.

    ``timeout_s`` overrides ``tool_loop.tool_timeout_s`` for this tool. ``needs_approval``
    says whether a call must be approved by the loop's :class:`Approver` before it runs:
    None (the default) asks for mutating tools only, True asks for this tool whatever its
    effect (a loop without an approver then refuses the tool), False never asks.
    """

    name: str
    description: str
    parameters: Mapping[str, Any]
    effect: Effect
    timeout_s: float | None = None
    needs_approval: bool | None = None

    def asks_approval(self) -> bool:
        """Whether a call of this tool waits for an approver (when the loop has one)."""
        if self.needs_approval is None:
            return self.effect is Effect.MUTATING
        return self.needs_approval


@dataclass(frozen=True, slots=True)
class ValidatedCall:
    """A tool call that passed validation: known tool, JSON-object arguments, schema-valid.

    ``id`` is the model's, or the reissued one (``reissue_reused_call_ids``).
    """

    id: str
    name: str
    arguments: Mapping[str, Any]
    effect: Effect


@dataclass(frozen=True, slots=True)
class Success:
    """The tool did what was asked; ``observation`` is shown to the model."""

    observation: str


@dataclass(frozen=True, slots=True)
class Failure:
    """The tool definitely did not take effect; ``observation`` tells the model why."""

    observation: str


@dataclass(frozen=True, slots=True)
class Ambiguous:
    """A mutating effect may or may not have happened. Ends the session at once."""

    observation: str


ToolOutcome = Success | Failure | Ambiguous
"""What a :class:`~metacrate_grid_agent.ToolExecutor` returns for one call."""


@dataclass(frozen=True, slots=True)
class ApprovalRequest:
    """A validated call waiting for an operator's answer, with what to show them.

    ``arguments`` is the JSON text of ``call.arguments``, the very value the executor
    receives if the call is approved, encoded once (compact, keys in the model's order), not
    the text the model sent; it is never cut, so an approver that cannot show it whole
    should refuse the call rather than show a part. (Arguments that repeat a key never get
    here: validation refuses them.) ``tool`` is the registered tool (description, effect).
    ``timeout_s`` is how long the operator has to answer: ``approval_timeout_s``, or what is
    left of ``max_session_s`` when that is less (None in a request built by hand).
    """

    call: ValidatedCall
    tool: Tool
    arguments: str
    turn: int
    session_id: str
    generation: int
    timeout_s: float | None = None


@dataclass(frozen=True, slots=True)
class Approved:
    """The operator allows the call: it runs next (after the loop's usual checks)."""


@dataclass(frozen=True, slots=True)
class Denied:
    """The operator refuses the call: it never runs; ``reason`` is shown to the model."""

    reason: str = "no reason given"
