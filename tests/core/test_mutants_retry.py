"""The retry policy's refusals, exactly as an operator reads them.

The policy tests prove the decisions; these pin what a wrong input is told (which
argument, which range, every problem at once) and the input checks of ``decide``.
"""

from __future__ import annotations

import pytest

from metacrate_grid_agent._core._retry import (
    MAX_ATTEMPT_RECORDS,
    RetryPolicy,
    backoff_delay,
    parse_retry_after,
)


@pytest.mark.parametrize(("name", "base", "cap"), [("base_s", 0.0, 1.0), ("cap_s", 1.0, -1.0)])
def test_backoff_delay_names_the_argument_that_is_not_positive(
    name: str, base: float, cap: float
) -> None:
    """A bad base or cap is refused with its own name and value."""
    bad = base if name == "base_s" else cap
    expected = f"^{name} must be a positive finite number of seconds, got {bad!r}$"
    with pytest.raises(ValueError, match=expected):
        backoff_delay("r", 1, base_s=base, cap_s=cap)


def test_retry_policy_reports_every_problem_in_one_message() -> None:
    """All invalid fields are named at once, joined by "; ", after one prefix."""
    with pytest.raises(ValueError, match="invalid") as caught:
        RetryPolicy(max_retries=MAX_ATTEMPT_RECORDS, max_retry_delay_s=0.0, base_delay_s=-1.0)
    assert str(caught.value) == (
        "invalid retry policy: "
        f"max_retries must be an int from 0 to {MAX_ATTEMPT_RECORDS - 1}, "
        f"got {MAX_ATTEMPT_RECORDS}; "
        "max_retry_delay_s must be a positive finite number of seconds, got 0.0; "
        "base_delay_s must be a positive finite number of seconds, got -1.0"
    )


@pytest.mark.parametrize("attempt", [0, -1, 2.5, True])
def test_decide_refuses_an_attempt_that_is_not_a_positive_int(attempt: object) -> None:
    """An attempt number below 1, or not an int, is a programming error."""
    policy = RetryPolicy(max_retries=3, max_retry_delay_s=1.0)
    with pytest.raises(ValueError, match="attempt must be an int of at least 1"):
        policy.decide(
            attempt=attempt,  # type: ignore[arg-type]
            retryable=True,
            retry_after_s=None,
            request_id="r",
            elapsed_s=0.0,
            total_timeout_s=10.0,
        )


@pytest.mark.parametrize("value", ["5\n", "\x0b5", "5\r"])
def test_only_spaces_and_tabs_surround_a_retry_hint(value: str) -> None:
    """RFC 9110 whitespace is space and tab; any other whitespace makes the hint unusable."""
    assert parse_retry_after(value, None) is None
    assert parse_retry_after(None, value) is None
    assert parse_retry_after(" \t5\t ", None) == 5.0
