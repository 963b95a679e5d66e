"""Behaviours a surviving mutant showed untested, one test each (the survivors of the core's
mutation run, read one by one: docs/proof.md lists those left as equivalent, with why).

Each test goes through the module's own API (the retry policy, the tool registry, the content
guard), not through helpers that may move.
"""

from __future__ import annotations

from typing import Final

import pytest

from metacrate_grid_agent import Effect, Tool, ToolLoopConfig
from metacrate_grid_agent._core._redact import ContentGuard, bounded_text, shortened
from metacrate_grid_agent._core._retry import RetryPolicy
from metacrate_grid_agent._core._schema import ToolRegistry
from metacrate_grid_agent.config import REDACTED
from metacrate_grid_agent.errors import ToolDefinitionError

KEY: Final = "sk-survivor-0123456789abcdefghijklmnopqrstuvwxyz"


@pytest.mark.parametrize("attempt", [0, -1, True])
@pytest.mark.parametrize(
    ("retryable", "retry_after_s"), [(False, None), (True, 0.5)], ids=["final", "hinted"]
)
def test_an_attempt_below_one_is_refused_on_every_path(
    attempt: int, *, retryable: bool, retry_after_s: float | None
) -> None:
    """A bad attempt number is a caller's bug on every path of ``decide``: also where the
    answer needs no backoff (a failure that is final, a usable server hint), so it is never
    hidden behind a plausible answer."""
    policy = RetryPolicy(max_retries=3, max_retry_delay_s=1.0)
    with pytest.raises(ValueError, match="attempt must be an int of at least 1"):
        policy.decide(
            attempt=attempt,
            retryable=retryable,
            retry_after_s=retry_after_s,
            request_id="r",
            elapsed_s=0.0,
            total_timeout_s=10.0,
        )


def _pattern_problem(pattern: str) -> str:
    schema = {"type": "object", "properties": {"a": {"type": "string", "pattern": pattern}}}
    with pytest.raises(ToolDefinitionError) as caught:
        ToolRegistry.build([Tool("t", "T.", schema, Effect.READ_ONLY)], ToolLoopConfig())
    return str(caught.value)


def test_an_invalid_pattern_is_named_with_the_engines_detail_when_it_has_one() -> None:
    """A pattern the regex engine refuses with a reason of its own (nesting too deep) is
    named with that reason in parentheses; one it only calls "not a regex" is named
    without (nothing is added that says nothing)."""
    deep = "(" * 500 + ")" * 500
    assert "is not a valid regular expression (" in _pattern_problem(deep)
    assert _pattern_problem("(").endswith("'(' is not a valid regular expression")


@pytest.mark.parametrize("limit", [1, 2, 5, 8, 11, 12, 13, 20])
def test_a_short_bound_cuts_the_text_itself_whatever_the_keys_length(limit: int) -> None:
    """Under a bound shorter than the key, the guard's text is the whole text cut at the
    bound, as ``bounded_text`` cuts it: the margin kept for a key that straddles the cut
    is added to the text read, never taken from it."""
    guard = ContentGuard(KEY)
    text = "plain words, no secret in them at all"
    assert guard.text(text, limit) == bounded_text(text, limit)


def test_a_key_straddling_the_cut_leaves_no_fragment_of_itself() -> None:
    """Under a bound much shorter than the key, a key that begins before the cut and runs
    far past it is still read whole, redacted, and only then cut: no prefix of it is left
    in the bounded text."""
    guard = ContentGuard(KEY)
    for limit in (4, 5, 8, 12):
        for before in range(limit):
            text = "x" * before + KEY + " tail"
            kept = guard.text(text, limit)
            assert kept == bounded_text("x" * before + REDACTED + " tail", limit), limit
            assert not any(KEY[:n] in kept for n in range(3, len(KEY))), (limit, before)


def test_needs_approval_is_checked_as_none_true_or_false() -> None:
    """A tool's ``needs_approval`` of True or False registers; anything else is named as
    the definition's problem (a mistyped flag never decides an approval)."""
    for flag in (True, False, None):
        tool = Tool("t", "T.", {"type": "object"}, Effect.MUTATING, needs_approval=flag)
        assert ToolRegistry.build([tool], ToolLoopConfig()).get("t") is not None
    odd = Tool("t", "T.", {"type": "object"}, Effect.MUTATING, needs_approval="yes")  # type: ignore[arg-type]
    with pytest.raises(ToolDefinitionError, match="needs_approval must be None, True or False"):
        ToolRegistry.build([odd], ToolLoopConfig())


def test_a_pattern_outside_a_schema_position_is_not_checked_as_a_regex() -> None:
    """A "pattern" inside a vendor extension or an unknown keyword is data, not a keyword:
    it is not compiled as a regular expression, so it cannot refuse the tool."""
    schema = {"type": "object", "x-note": {"pattern": "(", "deeper": {"pattern": "("}}}
    tool = Tool("t", "T.", schema, Effect.READ_ONLY)
    assert ToolRegistry.build([tool], ToolLoopConfig()).get("t") is not None


def test_a_text_shortened_to_one_character_is_the_ellipsis_alone() -> None:
    """``shortened`` to a bound of one character keeps no character of a longer text: the
    "…" takes the only place, so the result stays within the bound."""
    assert shortened("abc", 1) == "…"
    assert shortened("a", 1) == "a"
