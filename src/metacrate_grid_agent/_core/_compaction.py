"""History compaction for the tool loop, as pure plans.

Rule 1: this module never awaits, never reads a clock and never touches a socket. The
caller passes in the history, the serialised size of each message (cached by the caller,
so nothing is re-encoded here) and the envelope; a decision comes out as a value:
``None`` ("already fits"), a :class:`CompactionPlan` ("replace ``history[start:end]`` by
one message") or :class:`CannotFit` ("no compaction can make this fit"). The async driver
that calls the summarizer lives in the tool loop.

Size accounting. A message's size is the byte length of its JSON encoding
(:func:`message_size`); a history's size is the byte length of the JSON array holding it::

    history_bytes(sizes) = sum(sizes) + 2 + max(len(sizes) - 1, 0)     # "[", "]" and commas

and a history fits an :class:`Envelope` when ``len(sizes) <= max_messages`` and
``history_bytes(sizes) <= max_bytes`` (:func:`fits`).

Groups. An :class:`AssistantMessage` with tool calls and the :class:`ToolMessage` run that
immediately follows it form one *group*: the results are never separated from the call
that asked for them. Grouping is positional, so it is O(n) and needs no id lookup. Every
other message is a group of one; so is a tool message with no assistant before its run
(an orphan), which may be compacted like any message.

The plan, for a history of ``n`` messages::

    head  = length of the leading run of SystemMessage            # pinned, never compacted
    tail  = max(head, n - keep_recent), moved back to the start   # kept verbatim
            of the group it falls inside
    region = history[head:tail]                                   # whole groups only

    for each group boundary e in region, oldest first:
        if the history with history[head:e] replaced by one message of
           max(replacement_budget, MARKER_SIZE) bytes fits:    CompactionPlan(head, e, ...)
    otherwise:                                                 CannotFit(least reachable)

The span is therefore the *oldest* compactable messages (an earlier summary or marker sits
right after the head, so it is folded into the next one) and the *shortest* prefix, in
whole groups, that makes the history fit. Both the count and the byte size are
non-increasing as the span grows, so one scan with running sums finds it: O(n) in total.

The replacement's size is not known before the summarizer has run, so the caller states
the most it may be (``replacement_budget``, e.g. the size of :func:`summary_message` of a
summary of ``max_summary_bytes``). The plan is made against at least :data:`MARKER_SIZE`,
so :func:`marker_message` is always a safe fallback for any plan. The driver's flow::

    decision = plan(history, sizes, envelope, replacement_budget=summary_budget)
    None            -> send as is
    CompactionPlan  -> summarise decision.span; replacement = summary_message(text), or
                       marker_message() if the summarizer failed or its message is bigger
                       than summary_budget; history, sizes = apply(...)   # fits
    CannotFit       -> plan again with replacement_budget=MARKER_SIZE:
                       CompactionPlan -> apply it with marker_message()  # fits
                       CannotFit      -> raise HistoryOverflowError; nothing is sent
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

import msgspec

from metacrate_grid_agent._core._types import (
    AssistantMessage,
    Message,
    SystemMessage,
    ToolMessage,
    UserMessage,
)

__all__ = [
    "HISTORY_TRUNCATED",
    "MARKER_SIZE",
    "SUMMARY_PREFIX",
    "CannotFit",
    "CompactionPlan",
    "Envelope",
    "apply",
    "fits",
    "history_bytes",
    "marker_message",
    "message_size",
    "plan",
    "summary_message",
]

HISTORY_TRUNCATED: Final[str] = (
    "[earlier conversation truncated: older messages were removed to stay within the history limit]"
)
"""The text of the fallback message that stands for a span when no summary is available."""

SUMMARY_PREFIX: Final[str] = "[summary of earlier conversation] "
"""Put before a summary's text so the model reads it as a digest, not as a new request."""

_ENCODER: Final = msgspec.json.Encoder()


def message_size(message: Message) -> int:
    """The byte length of ``message`` serialised as JSON, exactly as it is sent."""
    return len(_ENCODER.encode(message))


def summary_message(text: str) -> UserMessage:
    """The user message that replaces a span by its summary: ``SUMMARY_PREFIX + text``."""
    return UserMessage(content=SUMMARY_PREFIX + text)


def marker_message() -> UserMessage:
    """The fixed user message that replaces a span when no summary is available."""
    return UserMessage(content=HISTORY_TRUNCATED)


MARKER_SIZE: Final[int] = message_size(marker_message())
"""The serialised size of :func:`marker_message`; every plan budgets at least this much."""


@dataclass(frozen=True, slots=True)
class Envelope:
    """The bounds a history must stay within, and how much of its end is never compacted.

    ``max_messages`` and ``max_bytes`` bound the message count and the history's JSON
    array size (see :func:`history_bytes`); the last ``keep_recent`` messages, widened to
    whole tool groups, are kept verbatim.
    """

    max_messages: int
    max_bytes: int
    keep_recent: int

    def __post_init__(self) -> None:
        if self.max_messages < 1:
            raise ValueError(f"max_messages must be at least 1, got {self.max_messages}")
        if self.max_bytes < 2:
            raise ValueError(f"max_bytes must be at least 2 (an empty array), got {self.max_bytes}")
        if self.keep_recent < 0:
            raise ValueError(f"keep_recent must not be negative, got {self.keep_recent}")


@dataclass(frozen=True, slots=True)
class CompactionPlan:
    """Replace ``history[start:end]`` (``span``, never empty) by one message.

    The history then fits its envelope provided the replacement's :func:`message_size` is
    at most the ``replacement_budget`` the plan was made with (or :data:`MARKER_SIZE`, if
    larger); :func:`marker_message` always qualifies.
    """

    start: int
    end: int
    span: tuple[Message, ...]

    def __post_init__(self) -> None:
        if not 0 <= self.start < self.end or len(self.span) != self.end - self.start:
            raise ValueError(
                f"invalid plan: start={self.start}, end={self.end}, {len(self.span)} messages"
            )


@dataclass(frozen=True, slots=True)
class CannotFit:
    """No compaction can make the history fit: the pinned head and the kept tail are too big.

    ``messages`` and ``size`` are the least count and :func:`history_bytes` any compaction
    reaches (the head, one replacement of the planned budget if anything is compactable,
    and the tail), to report against the envelope.
    """

    messages: int
    size: int


def history_bytes(sizes: Sequence[int]) -> int:
    """The byte size of the JSON array of messages of these sizes: 2 brackets, n - 1 commas."""
    return sum(sizes) + 2 + max(len(sizes) - 1, 0)


def fits(sizes: Sequence[int], envelope: Envelope) -> bool:
    """Whether a history of messages of these sizes is within ``envelope``'s bounds."""
    return len(sizes) <= envelope.max_messages and history_bytes(sizes) <= envelope.max_bytes


def _starts_group(message: Message) -> bool:
    return isinstance(message, AssistantMessage) and bool(message.tool_calls)


def plan(
    history: Sequence[Message],
    sizes: Sequence[int],
    envelope: Envelope,
    *,
    replacement_budget: int,
) -> CompactionPlan | CannotFit | None:
    """Decide how to bring ``history`` within ``envelope``; see the module docstring.

    ``sizes[i]`` must be ``message_size(history[i])``. ``replacement_budget`` is the most
    bytes the replacement message may serialise to; the plan assumes
    ``max(replacement_budget, MARKER_SIZE)``. Returns ``None`` when the history already
    fits, the oldest shortest whole-group span after the pinned system head and before the
    kept tail whose replacement makes it fit, or :class:`CannotFit` when none does.
    """
    n = len(history)
    if len(sizes) != n:
        raise ValueError(f"{len(sizes)} sizes for {n} messages")
    if replacement_budget < 0:
        raise ValueError(f"replacement_budget must not be negative, got {replacement_budget}")
    if fits(sizes, envelope):
        return None
    total = sum(sizes)

    head = 0
    while head < n and isinstance(history[head], SystemMessage):
        head += 1

    # Group boundaries from the head on: each index where a group begins, then n.
    boundaries: list[int] = []
    i = head
    while i < n:
        boundaries.append(i)
        i += 1
        if _starts_group(history[i - 1]):
            while i < n and isinstance(history[i], ToolMessage):
                i += 1
    boundaries.append(n)

    # The tail starts at the last boundary at or before n - keep_recent (never in the head).
    wanted = max(head, n - envelope.keep_recent)
    tail = head
    for boundary in boundaries:
        if boundary > wanted:
            break
        tail = boundary

    budget = max(replacement_budget, MARKER_SIZE)
    removed = 0
    messages = n
    size = total + 2 + max(n - 1, 0)
    previous = head
    for end in boundaries[1:]:
        if end > tail:
            break
        removed += sum(sizes[previous:end])
        previous = end
        messages = n - (end - head) + 1
        size = total - removed + budget + 2 + (messages - 1)
        if messages <= envelope.max_messages and size <= envelope.max_bytes:
            return CompactionPlan(start=head, end=end, span=tuple(history[head:end]))
    return CannotFit(messages=messages, size=size)


def apply(
    history: Sequence[Message],
    sizes: Sequence[int],
    plan: CompactionPlan,
    replacement: Message,
) -> tuple[tuple[Message, ...], tuple[int, ...]]:
    """The history with ``plan``'s span replaced by ``replacement``, and its sizes.

    Raises :class:`ValueError` if ``plan`` was not made for this history (its span is not
    the very same message objects at ``history[start:end]``).
    """
    if len(sizes) != len(history):
        raise ValueError(f"{len(sizes)} sizes for {len(history)} messages")
    start, end = plan.start, plan.end
    if end > len(history) or any(
        a is not b for a, b in zip(history[start:end], plan.span, strict=True)
    ):
        raise ValueError("the plan does not match this history")
    new_history = (*history[:start], replacement, *history[end:])
    new_sizes = (*sizes[:start], message_size(replacement), *sizes[end:])
    return new_history, new_sizes
