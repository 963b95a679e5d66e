"""The terminal approver's pure parts: how an answer is read and what a question shows."""

from __future__ import annotations

import pytest

from metacrate_grid_agent import ApprovalRequest, Approved, Denied, Effect, Tool, ValidatedCall
from metacrate_grid_agent.cli._approve import (
    MAX_SHOWN_ARGUMENTS,
    REFUSED,
    parse_answer,
    question_lines,
)

SAY = Tool("say", "Speak in local chat.", {"type": "object"}, Effect.MUTATING)


@pytest.mark.parametrize(
    ("line", "verdict"),
    [
        ("y", Approved()),
        (" YES \r", Approved()),
        ("", Denied(REFUSED)),
        ("n", Denied(REFUSED)),
        ("n too loud", Denied("too loud")),
        ("no: not in the library", Denied("not in the library")),
        ("yeah sure", Denied("yeah sure")),
        ("nope", Denied("nope")),
    ],
)
def test_only_yes_approves(line: str, verdict: Approved | Denied) -> None:
    """Fail closed: only "y"/"yes" run the call; the text after "n"/"no" is the reason."""
    assert parse_answer(line) == verdict


def test_a_question_escapes_control_characters_and_bounds_the_arguments() -> None:
    """Model-controlled text cannot drive the operator's terminal or flood it."""
    arguments = '{"text": "\x1b[2J' + "a" * 5000 + '"}'
    call = ValidatedCall(id="c-1", name="say", arguments={"text": "x"}, effect=Effect.MUTATING)
    request = ApprovalRequest(call, SAY, arguments, turn=3, session_id="s", generation=0)
    lines = question_lines(request)
    assert "  tool:        say (mutating)" in lines
    shown = next(line for line in lines if line.startswith("  arguments:"))
    assert "\x1b" not in shown
    assert "\\x1b[2J" in shown
    assert len(shown) <= len("  arguments:   ") + MAX_SHOWN_ARGUMENTS
