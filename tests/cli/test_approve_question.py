"""The terminal approver's pure parts: how an answer is read and what a question shows."""

from __future__ import annotations

import pytest

from metacrate_grid_agent import ApprovalRequest, Approved, Denied, Effect, Tool, ValidatedCall
from metacrate_grid_agent.cli._approve import (
    HIDDEN,
    MAX_SHOWN_ARGUMENTS,
    REFUSED,
    hidden,
    parse_answer,
    question_lines,
    too_long,
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


def request(arguments: str, timeout_s: float | None = 120.0) -> ApprovalRequest:
    """An approval request for a call of ``say`` whose arguments text is ``arguments``."""
    call = ValidatedCall(id="c-1", name="say", arguments={"text": "x"}, effect=Effect.MUTATING)
    return ApprovalRequest(
        call, SAY, arguments, turn=3, session_id="s", generation=0, timeout_s=timeout_s
    )


def test_a_question_shows_the_arguments_exactly_with_control_characters_escaped() -> None:
    """The arguments line is the request's text as it is, only made safe for the terminal.

    Runs of blanks inside a string are kept (a view must not differ from what runs), and
    model-controlled text cannot drive the operator's terminal.
    """
    lines = question_lines(request('{"text":"a  b\x1b[2J\u202e","n":1}'))
    assert lines[1:5] == [
        "grid-agent: approval needed (turn 3, call c-1)",
        "  tool:        say (mutating)",
        "  description: Speak in local chat.",
        '  arguments:   {"text":"a  b\\x1b[2J\\u202e","n":1}',
    ]


@pytest.mark.parametrize(
    ("timeout_s", "told"),
    [(120.0, " (you have 120 s)"), (27.75, " (you have 28 s)"), (0.5, " (you have 0.5 s)"),
     (2.5, " (you have 2.5 s)"), (None, "")],
)  # fmt: skip
def test_the_question_says_how_long_the_operator_has(timeout_s: float | None, told: str) -> None:
    """The operator is told the time left to answer, when the request says it."""
    lines = question_lines(request("{}", timeout_s))
    assert lines[-1] == (
        f"Run it? Type y to run it; n and a reason (or just Enter) to refuse it{told}:"
    )


def test_arguments_that_do_not_fit_whole_are_refused_never_cut() -> None:
    """Arguments longer than a question shows, once escaped, are refused, not shown in part."""
    fits = '{"text":"' + "a" * (MAX_SHOWN_ARGUMENTS - 11) + '"}'
    assert len(fits) == MAX_SHOWN_ARGUMENTS
    assert too_long(request(fits)) is None
    assert too_long(request(fits.replace("a", "\x7f", 1))) == Denied(
        f"too long to approve: the arguments are {MAX_SHOWN_ARGUMENTS + 3} characters once "
        f"escaped, more than the {MAX_SHOWN_ARGUMENTS} a question shows whole"
    )


def test_arguments_the_console_would_hide_are_refused_never_shown_in_part() -> None:
    """A call whose arguments hold the endpoint key (or a 12-character slice of it) would be
    shown with that part hidden: it is refused, so no operator approves a text that differs
    from what runs. Arguments without the key are asked about as they are."""
    from metacrate_grid_agent.cli._output import Redactor

    key = "sk-approval-" + "k" * 28
    redactor = Redactor()
    redactor.add(key)
    assert hidden(request('{"text":"hello"}'), redactor.scrub) is None
    for text in (key, key[5:17], key.upper()):
        found = hidden(request('{"text":"' + text + '"}'), redactor.scrub)
        assert found == Denied(HIDDEN)
