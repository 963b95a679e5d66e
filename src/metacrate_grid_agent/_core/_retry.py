"""Retry policy for calls to the chat-completions endpoint, as pure decisions.

Rule 1: this module never awaits, never reads a clock and never touches a socket. The
caller passes in what happened (the attempt number, whether the failure is retryable,
any ``Retry-After`` hint, the time already spent and the total budget) and gets back a
value: ``Retry(delay_s, source, attempt)`` ("sleep ``delay_s``, then make attempt number
``attempt``") or ``GiveUp(reason)``. It imports nothing from the rest of the package.

The policy, for the attempt numbered ``n`` (1-based) that has just failed::

    if not retryable:                 GiveUp("not_retryable")
    if n > max_retries:               GiveUp("retries_exhausted")

    if retry_after is not None and 0 <= retry_after <= max_retry_delay_s:
        delay = retry_after                                      # source "retry_after"
    else:
        ceiling = min(max_retry_delay_s, base_delay_s * 2 ** (n - 1))
        h       = blake2b(f"{request_id}:{n}".encode(), digest_size=8)  # 64 bits
        u       = 0.5 + 0.5 * (h >> 12) / 2 ** 52           # top 52 bits; u in [0.5, 1)
        delay   = ceiling * u                                            # source "jitter"

    if not elapsed_s + delay < total_timeout_s:  GiveUp("deadline")
    else:                                        Retry(delay, source, n + 1)

So there are at most ``max_retries`` retries (``max_retries + 1`` attempts), no delay
exceeds ``max_retry_delay_s``, and no retry is started that could not begin before the
total deadline (a retry with zero time left could only time out). The jitter is "full
jitter" with a floor of half the ceiling, so a retry never fires instantly, and it is
derived from the request id rather than a random source: the same request and attempt
always wait the same time, which keeps tests and logs reproducible, while different
requests still spread out. The exponent is clamped so huge attempt numbers cannot overflow.

A server's ``Retry-After`` (or the ``retry-after-ms`` that OpenAI-compatible servers
send) is honoured only when it is a plain non-negative number of at most
``max_retry_delay_s`` seconds; a longer hint falls back to the jittered backoff instead of
stalling the agent, and an HTTP-date or anything malformed is ignored.

Only these HTTP statuses are retried (``RETRYABLE_STATUSES``): 408 Request Timeout, 425
Too Early, 429 Too Many Requests, and 500, 502, 503, 504, the transient server and
gateway failures. Each one says "not processed now, the same request may succeed later".
Every other status is deterministic for the same request body (400, 401, 403, 404, 409,
413, 422 are the client's fault; 501 and 505 are permanent server answers), so sending the
same bytes again only repeats the failure, and a chat completion is not free to repeat.
Transport errors are classified by the caller, never by a bare ``except Exception``: a
connection lost before any byte of the response is retryable; one lost once bytes of it
arrived (in the head, or inside the body of a 2xx) is not, as the endpoint has acted on the
request and a 2xx is billed: resending it would run and pay for it twice.
"""

from __future__ import annotations

import hashlib
import math
import re
from dataclasses import dataclass
from typing import Final, Literal, TypeAlias

import msgspec

__all__ = [
    "DEFAULT_BASE_DELAY_S",
    "MAX_ATTEMPT_RECORDS",
    "MAX_RETRY_AFTER_CHARS",
    "RETRYABLE_STATUSES",
    "AttemptOutcome",
    "AttemptRecord",
    "DelaySource",
    "GiveUp",
    "GiveUpReason",
    "Retry",
    "RetryPolicy",
    "backoff_delay",
    "is_retryable_status",
    "parse_retry_after",
]

RETRYABLE_STATUSES: Final[frozenset[int]] = frozenset({408, 425, 429, 500, 502, 503, 504})
"""HTTP statuses that mean "try the same request again later"; see the module docstring."""

DEFAULT_BASE_DELAY_S: Final = 0.5
"""First backoff ceiling in seconds: long enough to clear a blip, short for an agent turn."""

MAX_ATTEMPT_RECORDS: Final = 64
"""Hard cap on the per-attempt history (so ``max_retries`` is at most 63); every buffer has one."""

MAX_RETRY_AFTER_CHARS: Final = 32
"""Longest retry header value looked at; any honest number of seconds is far shorter."""

# 2.0 ** 1024 overflows. The clamp binds only when cap_s / base_s > 2 ** 1023, far outside
# any configuration, so it changes nothing but the OverflowError for huge attempt numbers.
_MAX_BACKOFF_EXPONENT: Final = 1023

# RFC 9110 delta-seconds is 1*DIGIT; servers also send "1.5", so one optional fraction.
# ASCII digits only: ``\d`` and ``float()`` accept other scripts, ``_``, exponents, "inf".
_DECIMAL = re.compile(r"[0-9]+(?:\.[0-9]+)?", re.ASCII)

# Optional whitespace around a field value (RFC 9110 OWS).
_OWS: Final = " \t"

DelaySource: TypeAlias = Literal["retry_after", "jitter"]
"""Where a retry delay came from: the server's hint, or the jittered backoff."""

GiveUpReason: TypeAlias = Literal["not_retryable", "retries_exhausted", "deadline"]
"""Why the policy stopped retrying."""

AttemptOutcome: TypeAlias = Literal["ok", "error"]
"""How one attempt ended."""


def is_retryable_status(status: int) -> bool:
    """Return whether an HTTP ``status`` is one of ``RETRYABLE_STATUSES``."""
    return status in RETRYABLE_STATUSES


def _parse_decimal(value: str | None) -> float | None:
    """Read a non-negative plain decimal number, or ``None`` if it is not one."""
    if value is None or len(value) > MAX_RETRY_AFTER_CHARS:
        return None
    text = value.strip(_OWS)
    if _DECIMAL.fullmatch(text) is None:
        return None
    number = float(text)
    # At most MAX_RETRY_AFTER_CHARS digits cannot overflow, but say so in code too.
    return number if math.isfinite(number) else None


def parse_retry_after(retry_after: str | None, retry_after_ms: str | None) -> float | None:
    """Return the server's requested wait in seconds, or ``None`` if it gave none usable.

    ``retry_after_ms`` (the ``retry-after-ms`` header: non-negative milliseconds, possibly
    fractional) wins when valid; otherwise ``retry_after`` (the ``Retry-After`` header as
    non-negative delta-seconds, integer or decimal) is read. HTTP-dates, signs, exponents,
    ``nan``/``inf``, empty or over-long values (more than ``MAX_RETRY_AFTER_CHARS``
    characters, surrounding whitespace included) all count as absent.
    """
    milliseconds = _parse_decimal(retry_after_ms)
    if milliseconds is not None:
        return milliseconds / 1000.0
    return _parse_decimal(retry_after)


def _require_positive_finite(name: str, value: float) -> None:
    """Raise ``ValueError`` unless ``value`` is a positive finite number."""
    if not _is_positive_finite(value):
        raise ValueError(f"{name} must be a positive finite number of seconds, got {value!r}")


def _is_positive_finite(value: object) -> bool:
    """Return whether ``value`` is a real (non-bool) number, finite and above zero."""
    return (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and math.isfinite(value)
        and value > 0
    )


def _is_int(value: object) -> bool:
    """Return whether ``value`` is an ``int`` and not a ``bool``."""
    return isinstance(value, int) and not isinstance(value, bool)


def backoff_delay(request_id: str, attempt: int, *, base_s: float, cap_s: float) -> float:
    """Return the jittered backoff in seconds after attempt number ``attempt`` failed.

    ``ceiling = min(cap_s, base_s * 2 ** (attempt - 1))`` and the delay is ``ceiling * u``
    with ``u`` in ``[0.5, 1)`` taken from ``blake2b(f"{request_id}:{attempt}",
    digest_size=8)``. The same ``request_id`` and ``attempt`` always give the same delay;
    it is never above ``cap_s`` and never below half the ceiling. Raises ``ValueError``
    if ``attempt`` is below 1 or ``base_s`` or ``cap_s`` is not positive and finite.
    """
    if not _is_int(attempt) or attempt < 1:
        raise ValueError(f"attempt must be an int of at least 1, got {attempt!r}")
    _require_positive_finite("base_s", base_s)
    _require_positive_finite("cap_s", cap_s)
    exponent = min(attempt - 1, _MAX_BACKOFF_EXPONENT)
    # base_s * 2.0 ** 1023 may be inf for a large base; min() then picks cap_s.
    ceiling = min(cap_s, base_s * 2.0**exponent)
    digest = hashlib.blake2b(f"{request_id}:{attempt}".encode(), digest_size=8).digest()
    # Top 52 bits as m; u = (2**52 + m) / 2**53 is exact and lies in [0.5, 1 - 2**-53].
    mantissa = int.from_bytes(digest, "big") >> 12
    u = (2**52 + mantissa) / 2**53
    return min(cap_s, ceiling * u)


@dataclass(frozen=True, slots=True)
class Retry:
    """Decision: sleep ``delay_s`` seconds, then make attempt number ``attempt``."""

    delay_s: float
    source: DelaySource
    attempt: int


@dataclass(frozen=True, slots=True)
class GiveUp:
    """Decision: stop and report the last error, for ``reason``."""

    reason: GiveUpReason


class AttemptRecord(msgspec.Struct, frozen=True):
    """What happened on one attempt, as the client reports it in its history.

    A frozen msgspec struct rather than a dataclass: one is built per attempt, on the hot
    path, and a struct is built about ten times faster.

    ``delay_s`` and ``delay_source`` describe the wait chosen after this attempt and are
    ``None`` when no retry followed. A history holds at most ``MAX_ATTEMPT_RECORDS``.
    """

    attempt: int
    outcome: AttemptOutcome
    status: int | None
    error_kind: str | None
    latency_s: float
    delay_s: float | None
    delay_source: DelaySource | None


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How many times, and how long apart, to retry one request; see the module docstring.

    ``max_retries`` is the number of retries after the first attempt (0 disables retrying,
    at most ``MAX_ATTEMPT_RECORDS - 1``); ``max_retry_delay_s`` caps every single delay,
    including an honoured ``Retry-After``; ``base_delay_s`` is the first backoff ceiling.
    Raises ``ValueError`` naming every invalid field.
    """

    max_retries: int
    max_retry_delay_s: float
    base_delay_s: float = DEFAULT_BASE_DELAY_S

    def __post_init__(self) -> None:
        """Validate every field and report all problems in one ``ValueError``."""
        problems: list[str] = []
        if not _is_int(self.max_retries) or not (0 <= self.max_retries < MAX_ATTEMPT_RECORDS):
            problems.append(
                f"max_retries must be an int from 0 to {MAX_ATTEMPT_RECORDS - 1}, "
                f"got {self.max_retries!r}"
            )
        for name in ("max_retry_delay_s", "base_delay_s"):
            value = getattr(self, name)
            if not _is_positive_finite(value):
                problems.append(
                    f"{name} must be a positive finite number of seconds, got {value!r}"
                )
        if problems:
            raise ValueError("invalid retry policy: " + "; ".join(problems))

    def decide(
        self,
        *,
        attempt: int,
        retryable: bool,
        retry_after_s: float | None,
        request_id: str,
        elapsed_s: float,
        total_timeout_s: float,
    ) -> Retry | GiveUp:
        """Decide what to do after attempt number ``attempt`` (1-based) failed.

        ``retryable`` is the caller's classification of the failure, ``retry_after_s`` the
        parsed server hint (see ``parse_retry_after``), ``elapsed_s`` the time spent since
        the first attempt started and ``total_timeout_s`` the whole budget. A returned
        ``Retry`` always satisfies ``elapsed_s + delay_s < total_timeout_s`` and
        ``0 <= delay_s <= max_retry_delay_s``. Raises ``ValueError`` if ``attempt < 1``.
        """
        if not _is_int(attempt) or attempt < 1:
            raise ValueError(f"attempt must be an int of at least 1, got {attempt!r}")
        if not retryable:
            return GiveUp("not_retryable")
        if attempt > self.max_retries:
            return GiveUp("retries_exhausted")
        delay: float
        source: DelaySource
        if retry_after_s is not None and 0 <= retry_after_s <= self.max_retry_delay_s:
            delay, source = float(retry_after_s), "retry_after"
        else:
            delay = backoff_delay(
                request_id, attempt, base_s=self.base_delay_s, cap_s=self.max_retry_delay_s
            )
            source = "jitter"
        # Written as "not <" so a NaN elapsed or budget also gives up rather than retrying.
        if not elapsed_s + delay < total_timeout_s:
            return GiveUp("deadline")
        return Retry(delay, source, attempt + 1)
