"""Unit tests for the sans-I/O retry policy in ``metacrate_grid_agent._core._retry``."""

from __future__ import annotations

import hashlib
import math
from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from metacrate_grid_agent._core._retry import (
    DEFAULT_BASE_DELAY_S,
    MAX_ATTEMPT_RECORDS,
    MAX_RETRY_AFTER_CHARS,
    RETRYABLE_STATUSES,
    AttemptRecord,
    GiveUp,
    Retry,
    RetryPolicy,
    backoff_delay,
    is_retryable_status,
    parse_retry_after,
)

POLICY = RetryPolicy(max_retries=3, max_retry_delay_s=8.0)

# A budget no test's delays come near, for tests not about the deadline.
NO_DEADLINE = 1e9

request_ids = st.text(max_size=40)
positive_seconds = st.floats(min_value=1e-3, max_value=1e4, allow_nan=False, allow_infinity=False)


def decide(
    policy: RetryPolicy = POLICY,
    *,
    attempt: int = 1,
    retryable: bool = True,
    retry_after_s: float | None = None,
    request_id: str = "req-1",
    elapsed_s: float = 0.0,
    total_timeout_s: float = NO_DEADLINE,
) -> Retry | GiveUp:
    """Call ``policy.decide`` with defaults that make a retry possible."""
    return policy.decide(
        attempt=attempt,
        retryable=retryable,
        retry_after_s=retry_after_s,
        request_id=request_id,
        elapsed_s=elapsed_s,
        total_timeout_s=total_timeout_s,
    )


def expected_ceiling(attempt: int, base_s: float, cap_s: float) -> float:
    """The documented backoff ceiling, computed exactly with no overflow."""
    return float(min(Fraction(cap_s), Fraction(base_s) * 2 ** (attempt - 1)))


# --- statuses -------------------------------------------------------------------------


def test_retryable_statuses_are_exactly_the_documented_set() -> None:
    """The retryable set is pinned: widening it would resend non-transient failures."""
    assert frozenset({408, 425, 429, 500, 502, 503, 504}) == RETRYABLE_STATUSES


@pytest.mark.parametrize("status", [408, 425, 429, 500, 502, 503, 504])
def test_transient_status_is_retryable(status: int) -> None:
    """Each transient status (timeout, too early, rate limit, 5xx blips) is retried."""
    assert is_retryable_status(status) is True


@pytest.mark.parametrize("status", [400, 401, 403, 404, 409, 413, 422, 501, 505, 599, 200, 301])
def test_deterministic_status_is_not_retryable(status: int) -> None:
    """Client errors, permanent server answers and non-errors are never retried."""
    assert is_retryable_status(status) is False


# --- Retry-After parsing --------------------------------------------------------------


@pytest.mark.parametrize(
    ("retry_after", "retry_after_ms", "expected"),
    [
        pytest.param("0", None, 0.0, id="zero"),
        pytest.param("3", None, 3.0, id="integer"),
        pytest.param("1.5", None, 1.5, id="decimal"),
        pytest.param(" 2 ", None, 2.0, id="surrounding-spaces"),
        pytest.param("\t2\t", None, 2.0, id="surrounding-tabs"),
        pytest.param("-1", None, None, id="negative"),
        pytest.param("+1", None, None, id="explicit-sign"),
        pytest.param("abc", None, None, id="garbage"),
        pytest.param("Wed, 21 Oct 2015 07:28:00 GMT", None, None, id="http-date"),
        pytest.param("", None, None, id="empty"),
        pytest.param("   ", None, None, id="blank"),
        pytest.param("nan", None, None, id="nan"),
        pytest.param("inf", None, None, id="inf"),
        pytest.param("1e309", None, None, id="exponent-overflow"),
        pytest.param("1e3", None, None, id="exponent"),
        pytest.param("1_000", None, None, id="underscore"),
        pytest.param("\u0661", None, None, id="non-ascii-digit"),
        pytest.param(".5", None, None, id="bare-fraction"),
        pytest.param("5.", None, None, id="trailing-dot"),
        pytest.param("1" * MAX_RETRY_AFTER_CHARS, None, float("1" * 32), id="longest-accepted"),
        pytest.param("1" * (MAX_RETRY_AFTER_CHARS + 1), None, None, id="over-length"),
        pytest.param("9" * 400, None, None, id="very-long-digits"),
        pytest.param("9" * 100_000, None, None, id="huge-digits"),
        pytest.param(None, None, None, id="both-absent"),
        pytest.param(None, "1500", 1.5, id="ms-only"),
        pytest.param(None, "250.5", 0.2505, id="ms-fractional"),
        pytest.param(None, "0", 0.0, id="ms-zero"),
        pytest.param("30", "1500", 1.5, id="ms-wins-over-seconds"),
        pytest.param("7", "abc", 7.0, id="invalid-ms-falls-back"),
        pytest.param("7", "-5", 7.0, id="negative-ms-falls-back"),
        pytest.param("7", "", 7.0, id="empty-ms-falls-back"),
        pytest.param("7", "nan", 7.0, id="nan-ms-falls-back"),
        pytest.param("7", "9" * 400, 7.0, id="long-ms-falls-back"),
        pytest.param("abc", "abc", None, id="both-invalid"),
    ],
)
def test_parse_retry_after(
    retry_after: str | None, retry_after_ms: str | None, expected: float | None
) -> None:
    """Only plain non-negative numbers are read; ms wins; anything else counts as absent."""
    assert expected == parse_retry_after(retry_after, retry_after_ms)


@settings(max_examples=150)
@given(st.one_of(st.none(), st.text()), st.one_of(st.none(), st.text()))
def test_parse_retry_after_never_raises_and_is_finite(
    retry_after: str | None, retry_after_ms: str | None
) -> None:
    """Whatever the server sends, parsing returns None or a finite non-negative number."""
    result = parse_retry_after(retry_after, retry_after_ms)
    assert result is None or (math.isfinite(result) and result >= 0)


# --- delay source ---------------------------------------------------------------------


@pytest.mark.parametrize("retry_after_s", [0.0, 2.5, 8.0])
def test_retry_after_within_ceiling_is_honoured(retry_after_s: float) -> None:
    """A server hint up to max_retry_delay_s (inclusive) is used as the delay."""
    assert Retry(retry_after_s, "retry_after", 2) == decide(retry_after_s=retry_after_s)


@pytest.mark.parametrize("retry_after_s", [8.000001, 120.0, math.inf, math.nan, -1.0])
def test_unusable_retry_after_falls_back_to_jitter(retry_after_s: float) -> None:
    """A hint over the ceiling (or nonsense) never stalls the agent: jitter is used."""
    expected = Retry(backoff_delay("req-1", 1, base_s=DEFAULT_BASE_DELAY_S, cap_s=8.0), "jitter", 2)
    assert expected == decide(retry_after_s=retry_after_s)


def test_no_retry_after_uses_jitter() -> None:
    """Without a server hint the delay is the deterministic backoff for this attempt."""
    expected = Retry(backoff_delay("req-1", 2, base_s=DEFAULT_BASE_DELAY_S, cap_s=8.0), "jitter", 3)
    assert expected == decide(attempt=2)


# --- jitter ---------------------------------------------------------------------------


def test_jitter_is_deterministic() -> None:
    """The same request id and attempt always give the same delay (reproducible logs)."""
    first = [backoff_delay("req-abc", n, base_s=0.5, cap_s=30.0) for n in range(1, 8)]
    second = [backoff_delay("req-abc", n, base_s=0.5, cap_s=30.0) for n in range(1, 8)]
    assert first == second


def test_jitter_differs_between_request_ids() -> None:
    """Different requests spread out instead of retrying in lockstep."""
    delays = {backoff_delay(f"req-{i}", 1, base_s=0.5, cap_s=30.0) for i in range(20)}
    assert len(delays) == 20


@pytest.mark.parametrize(("request_id", "attempt"), [("req-1", 1), ("abc", 3), ("", 12)])
def test_jitter_matches_documented_formula(request_id: str, attempt: int) -> None:
    """The delay is exactly the documented blake2b formula, so it is stable across versions."""
    digest = hashlib.blake2b(f"{request_id}:{attempt}".encode(), digest_size=8).digest()
    fraction = (int.from_bytes(digest, "big") >> 12) / 2**52
    u = 0.5 + 0.5 * fraction
    expected = min(5.0, 0.25 * 2 ** (attempt - 1)) * u
    assert expected == backoff_delay(request_id, attempt, base_s=0.25, cap_s=5.0)


def test_jitter_survives_huge_attempt_numbers() -> None:
    """An attempt number past float range does not overflow; the delay stays under the cap."""
    delay = backoff_delay("req-1", 10**9, base_s=0.5, cap_s=30.0)
    assert 15.0 <= delay < 30.0


@settings(max_examples=150)
@given(
    request_id=request_ids,
    attempt=st.integers(min_value=1, max_value=10_000),
    base_s=positive_seconds,
    cap_s=positive_seconds,
)
def test_jitter_is_bounded(request_id: str, attempt: int, base_s: float, cap_s: float) -> None:
    """For any input the delay is positive, within the cap and at least half the ceiling."""
    delay = backoff_delay(request_id, attempt, base_s=base_s, cap_s=cap_s)
    ceiling = expected_ceiling(attempt, base_s, cap_s)
    assert 0 < delay <= cap_s
    assert 0.5 * min(cap_s, ceiling) <= delay <= ceiling


@pytest.mark.parametrize(
    ("attempt", "base_s", "cap_s"),
    [
        (0, 0.5, 8.0),
        (-1, 0.5, 8.0),
        (1, 0.0, 8.0),
        (1, -0.5, 8.0),
        (1, math.nan, 8.0),
        (1, math.inf, 8.0),
        (1, 0.5, 0.0),
        (1, 0.5, math.inf),
        (1, 0.5, math.nan),
    ],
)
def test_backoff_rejects_invalid_arguments(attempt: int, base_s: float, cap_s: float) -> None:
    """Nonsense inputs fail loudly instead of producing a zero, negative or infinite delay."""
    with pytest.raises(ValueError, match="must be"):
        backoff_delay("req-1", attempt, base_s=base_s, cap_s=cap_s)


# --- deadline -------------------------------------------------------------------------


def test_retry_that_would_end_at_deadline_is_not_started() -> None:
    """A retry left with zero time could only time out, so the policy gives up instead."""
    assert GiveUp("deadline") == decide(retry_after_s=2.0, elapsed_s=8.0, total_timeout_s=10.0)


def test_retry_ending_just_before_deadline_is_started() -> None:
    """A retry that still has time left after its delay goes ahead."""
    assert Retry(2.0, "retry_after", 2) == decide(
        retry_after_s=2.0, elapsed_s=7.5, total_timeout_s=10.0
    )


@pytest.mark.parametrize(
    ("elapsed_s", "total_timeout_s"), [(math.nan, 10.0), (0.0, math.nan), (math.inf, 10.0)]
)
def test_nonsense_clock_values_give_up(elapsed_s: float, total_timeout_s: float) -> None:
    """A NaN or infinite elapsed time never turns into an unbounded retry."""
    assert GiveUp("deadline") == decide(elapsed_s=elapsed_s, total_timeout_s=total_timeout_s)


@settings(max_examples=150)
@given(
    attempt=st.integers(min_value=1, max_value=5),
    retry_after_s=st.one_of(st.none(), st.floats()),
    request_id=request_ids,
    elapsed_s=st.floats(),
    total_timeout_s=st.floats(),
)
def test_retry_never_starts_past_deadline(
    attempt: int,
    retry_after_s: float | None,
    request_id: str,
    elapsed_s: float,
    total_timeout_s: float,
) -> None:
    """For any clock and hint, a Retry starts before the deadline and within the delay cap."""
    policy = RetryPolicy(max_retries=5, max_retry_delay_s=8.0)
    decision = decide(
        policy,
        attempt=attempt,
        retry_after_s=retry_after_s,
        request_id=request_id,
        elapsed_s=elapsed_s,
        total_timeout_s=total_timeout_s,
    )
    if isinstance(decision, Retry):
        assert elapsed_s + decision.delay_s < total_timeout_s
        assert 0 <= decision.delay_s <= policy.max_retry_delay_s
        assert attempt + 1 == decision.attempt
    else:
        assert GiveUp("deadline") == decision


# --- attempt counting -----------------------------------------------------------------


def test_retries_exhausted_exactly_after_max_retries() -> None:
    """With max_retries=3 attempts 1..3 retry and attempt 4 (the fourth failure) gives up."""
    retries: list[Retry | GiveUp] = [
        Retry(backoff_delay("req-1", n, base_s=DEFAULT_BASE_DELAY_S, cap_s=8.0), "jitter", n + 1)
        for n in (1, 2, 3)
    ]
    expected = [*retries, GiveUp("retries_exhausted"), GiveUp("retries_exhausted")]
    assert expected == [decide(attempt=n) for n in range(1, 6)]


def test_zero_max_retries_never_retries() -> None:
    """max_retries=0 means one attempt only, whatever the failure or hint."""
    policy = RetryPolicy(max_retries=0, max_retry_delay_s=8.0)
    assert GiveUp("retries_exhausted") == decide(policy, retry_after_s=1.0)


@settings(max_examples=100)
@given(
    attempt=st.integers(min_value=1, max_value=100),
    retry_after_s=st.one_of(st.none(), st.floats()),
)
def test_not_retryable_never_retries(attempt: int, retry_after_s: float | None) -> None:
    """A failure classified as not retryable is final, even with a Retry-After hint."""
    assert GiveUp("not_retryable") == decide(
        attempt=attempt, retryable=False, retry_after_s=retry_after_s
    )


@pytest.mark.parametrize("attempt", [0, -1])
def test_decide_rejects_attempt_below_one(attempt: int) -> None:
    """Attempts are 1-based; a zero or negative count is a caller bug, reported loudly."""
    with pytest.raises(ValueError, match="attempt must be"):
        decide(attempt=attempt)


# --- policy validation ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"max_retries": -1, "max_retry_delay_s": 8.0}, "max_retries"),
        ({"max_retries": MAX_ATTEMPT_RECORDS, "max_retry_delay_s": 8.0}, "max_retries"),
        ({"max_retries": 1.5, "max_retry_delay_s": 8.0}, "max_retries"),
        ({"max_retries": True, "max_retry_delay_s": 8.0}, "max_retries"),
        ({"max_retries": 2, "max_retry_delay_s": 0.0}, "max_retry_delay_s"),
        ({"max_retries": 2, "max_retry_delay_s": -1.0}, "max_retry_delay_s"),
        ({"max_retries": 2, "max_retry_delay_s": math.inf}, "max_retry_delay_s"),
        ({"max_retries": 2, "max_retry_delay_s": math.nan}, "max_retry_delay_s"),
        ({"max_retries": 2, "max_retry_delay_s": 8.0, "base_delay_s": 0.0}, "base_delay_s"),
        ({"max_retries": 2, "max_retry_delay_s": 8.0, "base_delay_s": math.nan}, "base_delay_s"),
        ({"max_retries": 2, "max_retry_delay_s": "8"}, "max_retry_delay_s"),
    ],
)
def test_policy_rejects_invalid_fields(kwargs: dict[str, object], message: str) -> None:
    """An invalid policy fails at construction, naming the field, not at the first retry."""
    with pytest.raises(ValueError, match=message):
        RetryPolicy(**kwargs)  # type: ignore[arg-type]


def test_policy_reports_every_problem_at_once() -> None:
    """Validation lists all invalid fields in one error, so one fix cycle suffices."""
    with pytest.raises(ValueError, match="invalid retry policy") as info:
        RetryPolicy(max_retries=-1, max_retry_delay_s=0.0, base_delay_s=math.inf)
    message = str(info.value)
    assert all(name in message for name in ("max_retries", "max_retry_delay_s", "base_delay_s"))


def test_policy_accepts_boundary_values() -> None:
    """Zero retries, the largest history-sized retry count and integer seconds are valid."""
    assert RetryPolicy(max_retries=0, max_retry_delay_s=1).base_delay_s == DEFAULT_BASE_DELAY_S
    assert RetryPolicy(max_retries=MAX_ATTEMPT_RECORDS - 1, max_retry_delay_s=0.1).max_retries == 63


def test_values_are_frozen() -> None:
    """Policies and decisions are immutable values that can be shared and compared."""
    record = AttemptRecord(
        attempt=1,
        outcome="error",
        status=503,
        error_kind="http_status",
        latency_s=0.2,
        delay_s=0.4,
        delay_source="jitter",
    )
    for value, field in [
        (POLICY, "max_retries"),
        (record, "attempt"),
        (GiveUp("deadline"), "reason"),
    ]:
        with pytest.raises(AttributeError):
            setattr(value, field, 0)
