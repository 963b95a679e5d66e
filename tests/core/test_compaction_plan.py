"""Unit and property tests for the pure history compaction planner in ``_compaction``."""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from metacrate_grid_agent._core._compaction import (
    HISTORY_TRUNCATED,
    MARKER_SIZE,
    SUMMARY_PREFIX,
    CannotFit,
    CompactionPlan,
    Envelope,
    apply,
    fits,
    history_bytes,
    marker_message,
    message_size,
    plan,
    summary_message,
)
from metacrate_grid_agent._core._types import (
    AssistantMessage,
    Message,
    SystemMessage,
    ToolCall,
    ToolMessage,
    UserMessage,
)

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

# A budget and envelope no test's history comes near, for tests not about bytes.
ROOMY_BYTES = 10**9
EMPTY_USER_SIZE = message_size(UserMessage(content=""))


def user(text: str = "u") -> UserMessage:
    """A user message with this text."""
    return UserMessage(content=text)


def said(text: str = "a") -> AssistantMessage:
    """An assistant message with text and no tool calls."""
    return AssistantMessage(content=text)


def group(*ids: str, text: str = "r") -> list[Message]:
    """An assistant message calling the tools ``ids``, followed by one result per call."""
    calls = tuple(ToolCall.create(call_id, "look", "{}") for call_id in ids)
    results = [ToolMessage(tool_call_id=call_id, content=text) for call_id in ids]
    return [AssistantMessage(tool_calls=calls), *results]


def sizes_of(history: Sequence[Message]) -> list[int]:
    """The cached sizes the driver would pass in."""
    return [message_size(m) for m in history]


def sized_user(size: int) -> UserMessage:
    """A user message whose serialised size is exactly ``size`` bytes."""
    message = UserMessage(content="x" * (size - EMPTY_USER_SIZE))
    assert message_size(message) == size
    return message


def by_count(max_messages: int, keep_recent: int = 0) -> Envelope:
    """An envelope bounded only by message count."""
    return Envelope(max_messages=max_messages, max_bytes=ROOMY_BYTES, keep_recent=keep_recent)


def planned(history: Sequence[Message], envelope: Envelope, budget: int = 0) -> CompactionPlan:
    """The plan for ``history``, which the test expects to be a :class:`CompactionPlan`."""
    decision = plan(history, sizes_of(history), envelope, replacement_budget=budget)
    assert isinstance(decision, CompactionPlan)
    return decision


# --- sizes and fitting ----------------------------------------------------------------------


def test_message_size_is_the_json_encoding_length() -> None:
    """A message's size is exactly the bytes it adds to the request body."""
    message = group("c1")[0]
    assert message_size(message) == len(msgspec.json.encode(message))
    assert message_size(user('é"\n')) == len('{"role":"user","content":"é\\"\\n"}'.encode())


@pytest.mark.parametrize(
    ("sizes", "expected"),
    [([], 2), ([10], 12), ([10, 20], 33), ([1, 1, 1], 7)],
)
def test_history_bytes_counts_brackets_and_commas(sizes: list[int], expected: int) -> None:
    """The array overhead is 2 brackets plus one comma between each two messages."""
    assert history_bytes(sizes) == expected
    messages = [sized_user(s + EMPTY_USER_SIZE) for s in sizes]
    assert history_bytes(sizes_of(messages)) == len(msgspec.json.encode(messages))


def test_fits_is_inclusive_on_both_bounds() -> None:
    """A history exactly at the count and byte limits fits; one over either does not."""
    sizes = [10, 20]
    assert fits(sizes, Envelope(max_messages=2, max_bytes=33, keep_recent=0))
    assert not fits(sizes, Envelope(max_messages=1, max_bytes=33, keep_recent=0))
    assert not fits(sizes, Envelope(max_messages=2, max_bytes=32, keep_recent=0))


def test_plan_is_none_when_the_history_fits() -> None:
    """Nothing is compacted (and nothing summarised) while the history is within bounds."""
    history: list[Message] = [SystemMessage(content="s"), user(), said()]
    assert plan(history, sizes_of(history), by_count(3), replacement_budget=0) is None


# --- rule 1: the system head is pinned ------------------------------------------------------


def test_leading_system_messages_are_never_in_the_span() -> None:
    """The leading run of system messages stays; the span starts right after it."""
    history: list[Message] = [
        SystemMessage(content="s1"),
        SystemMessage(content="s2"),
        user(),
        said(),
        user(),
    ]
    decision = planned(history, by_count(4))
    assert (decision.start, decision.end) == (2, 4)
    assert decision.span == (history[2], history[3])


def test_a_system_message_after_the_head_is_compactable() -> None:
    """Only the leading run is pinned; a later system message is an ordinary message."""
    history: list[Message] = [user(), SystemMessage(content="late"), said(), user()]
    decision = planned(history, by_count(2))
    assert decision.span == tuple(history[:3])


# --- rule 2: the recent tail stays verbatim -------------------------------------------------


def test_the_last_keep_recent_messages_are_never_in_the_span() -> None:
    """With keep_recent=2 the last two messages stay even if a longer span would be smaller."""
    history: list[Message] = [user("1"), said("2"), user("3"), said("4"), user("5")]
    decision = planned(history, by_count(3, keep_recent=2))
    assert (decision.start, decision.end) == (0, 3)


def test_the_tail_widens_backwards_to_the_start_of_a_tool_group() -> None:
    """A tail that would start on a tool result starts at its assistant message instead."""
    history: list[Message] = [user("1"), said("2"), *group("a", "b"), user("end")]
    sizes = sizes_of(history)
    # keep_recent=2 would start the tail at the result of "b"; the whole group is kept, so
    # the least reachable is 1 replacement + 3 group messages + 1, over a limit of 4.
    decision = plan(history, sizes, by_count(4, keep_recent=2), replacement_budget=0)
    assert isinstance(decision, CannotFit)
    assert decision.messages == 5
    decision = planned(history, by_count(5, keep_recent=2))
    assert (decision.start, decision.end) == (0, 2)


def test_keep_recent_larger_than_the_history_leaves_nothing_to_compact() -> None:
    """A tail covering everything after the head means no span can be proposed."""
    history: list[Message] = [SystemMessage(content="s"), user(), said()]
    decision = plan(history, sizes_of(history), by_count(2, keep_recent=10), replacement_budget=0)
    assert decision == CannotFit(messages=3, size=history_bytes(sizes_of(history)))


# --- rule 3: tool groups are never split ----------------------------------------------------


def test_a_span_ending_in_a_tool_group_takes_all_its_results() -> None:
    """The span boundary falls after the last tool result, never between call and result."""
    history: list[Message] = [*group("a", "b", "c"), user("1"), said("2"), user("3")]
    decision = planned(history, by_count(6))
    assert (decision.start, decision.end) == (0, 4)


def test_orphan_tool_messages_at_the_start_are_compacted_one_by_one() -> None:
    """Tool results with no assistant before them are single messages, so they compact."""
    history: list[Message] = [
        SystemMessage(content="s"),
        ToolMessage(tool_call_id="gone1", content="r"),
        ToolMessage(tool_call_id="gone2", content="r"),
        user(),
        said(),
    ]
    decision = planned(history, by_count(4))
    assert (decision.start, decision.end) == (1, 3)


def test_tool_results_after_a_text_only_assistant_are_not_grouped_with_it() -> None:
    """Only an assistant message with tool calls starts a group."""
    history: list[Message] = [said("no calls"), ToolMessage(tool_call_id="x", content="r"), user()]
    decision = planned(history, by_count(2))
    assert (decision.start, decision.end) == (0, 2)


# --- rule 4: the oldest, shortest span ------------------------------------------------------


def test_the_span_is_the_shortest_prefix_that_fits_by_bytes() -> None:
    """Only as many old messages are replaced as the byte limit requires."""
    budget = MARKER_SIZE
    history: list[Message] = [SystemMessage(content="s"), *(sized_user(budget) for _ in range(6))]
    sizes = sizes_of(history)
    # Replacing two messages by one of the same size saves that size plus one comma.
    limit = history_bytes(sizes) - budget - 1
    envelope = Envelope(max_messages=100, max_bytes=limit, keep_recent=0)
    decision = plan(history, sizes, envelope, replacement_budget=budget)
    assert isinstance(decision, CompactionPlan)
    assert (decision.start, decision.end) == (1, 3)
    envelope = Envelope(max_messages=100, max_bytes=limit - 1, keep_recent=0)
    decision = plan(history, sizes, envelope, replacement_budget=budget)
    assert isinstance(decision, CompactionPlan)
    assert (decision.start, decision.end) == (1, 4)


def test_the_span_is_the_shortest_prefix_that_fits_by_count() -> None:
    """Replacing k messages by one removes k - 1 from the count, and no more are taken."""
    history: list[Message] = [user(str(i)) for i in range(10)]
    decision = planned(history, by_count(7))
    assert (decision.start, decision.end) == (0, 4)


def test_a_previous_summary_is_resummarised_first() -> None:
    """The summary from an earlier compaction sits right after the head and goes first."""
    earlier = summary_message("they met at the fountain")
    history: list[Message] = [SystemMessage(content="s"), earlier, user(), said(), user()]
    decision = planned(history, by_count(4))
    assert decision.span == (earlier, history[2])


def test_a_larger_replacement_budget_needs_a_longer_span() -> None:
    """The plan accounts for the replacement's bytes, not only the messages removed."""
    history: list[Message] = [sized_user(200) for _ in range(5)]
    sizes = sizes_of(history)
    envelope = Envelope(max_messages=10, max_bytes=history_bytes(sizes) - 200, keep_recent=0)
    small = plan(history, sizes, envelope, replacement_budget=MARKER_SIZE)
    large = plan(history, sizes, envelope, replacement_budget=250)
    assert isinstance(small, CompactionPlan)
    assert isinstance(large, CompactionPlan)
    assert (small.end, large.end) == (2, 3)


def test_a_budget_below_the_marker_size_still_leaves_room_for_the_marker() -> None:
    """Every plan can be completed with the marker, whatever budget was passed."""
    history: list[Message] = [sized_user(MARKER_SIZE) for _ in range(4)]
    sizes = sizes_of(history)
    envelope = Envelope(max_messages=10, max_bytes=history_bytes(sizes) - 1, keep_recent=0)
    decision = plan(history, sizes, envelope, replacement_budget=0)
    assert isinstance(decision, CompactionPlan)
    _, new_sizes = apply(history, sizes, decision, marker_message())
    assert fits(new_sizes, envelope)


def test_plan_uses_the_cached_sizes_and_never_reserialises() -> None:
    """Sizes come from the driver's cache, so planning is one O(n) pass with no encoding."""
    history: list[Message] = [user(str(i)) for i in range(6)]
    # Pretend the first two messages are huge: the plan follows the sizes passed in, and
    # dropping the first one is enough.
    sizes = [5000, 5000, *sizes_of(history[2:])]
    envelope = Envelope(max_messages=10, max_bytes=9000, keep_recent=0)
    decision = plan(history, sizes, envelope, replacement_budget=MARKER_SIZE)
    assert isinstance(decision, CompactionPlan)
    assert (decision.start, decision.end) == (0, 1)
    assert plan(history, sizes_of(history), envelope, replacement_budget=MARKER_SIZE) is None


# --- rule 5: reporting that nothing can fit -------------------------------------------------


def test_cannot_fit_when_head_and_tail_alone_are_too_big() -> None:
    """The driver learns before summarising that no compaction reaches the bounds."""
    history: list[Message] = [SystemMessage(content="s" * 500), user(), said(), user("last" * 100)]
    sizes = sizes_of(history)
    envelope = Envelope(max_messages=10, max_bytes=sizes[0] + sizes[3], keep_recent=1)
    decision = plan(history, sizes, envelope, replacement_budget=MARKER_SIZE)
    least = [sizes[0], MARKER_SIZE, sizes[3]]
    assert decision == CannotFit(messages=3, size=history_bytes(least))


def test_cannot_fit_when_the_count_limit_is_below_head_plus_tail() -> None:
    """A count limit smaller than head + replacement + tail is reported, not planned."""
    history: list[Message] = [SystemMessage(content="s"), user(), said(), user(), said()]
    decision = plan(history, sizes_of(history), by_count(3, keep_recent=2), replacement_budget=0)
    assert isinstance(decision, CannotFit)
    assert decision.messages == 4


def test_a_summary_that_cannot_fit_may_still_leave_room_for_the_marker() -> None:
    """Planning again with MARKER_SIZE finds the span when only a full summary is too big."""
    history: list[Message] = [sized_user(300) for _ in range(3)]
    sizes = sizes_of(history)
    envelope = Envelope(max_messages=10, max_bytes=MARKER_SIZE + 303, keep_recent=1)
    assert isinstance(plan(history, sizes, envelope, replacement_budget=1000), CannotFit)
    decision = plan(history, sizes, envelope, replacement_budget=MARKER_SIZE)
    assert isinstance(decision, CompactionPlan)
    _, new_sizes = apply(history, sizes, decision, marker_message())
    assert fits(new_sizes, envelope)


# --- apply and the replacement messages -----------------------------------------------------


def test_apply_replaces_the_span_and_sizes_the_replacement() -> None:
    """The new history keeps everything outside the span, in order, with matching sizes."""
    history: list[Message] = [
        SystemMessage(content="s"),
        user("1"),
        said("2"),
        *group("a"),
        user("3"),
    ]
    sizes = sizes_of(history)
    decision = planned(history, by_count(5, keep_recent=1))
    summary = summary_message("short")
    new_history, new_sizes = apply(history, sizes, decision, summary)
    assert new_history == (history[0], summary, history[3], history[4], history[5])
    assert new_sizes == tuple(sizes_of(new_history))


def test_apply_rejects_a_plan_made_for_another_history() -> None:
    """A stale plan is refused rather than splicing the wrong messages out."""
    history: list[Message] = [user("1"), said("2"), user("3")]
    decision = planned(history, by_count(2))
    other: list[Message] = [user("1"), said("2"), user("3")]
    with pytest.raises(ValueError, match="does not match"):
        apply(other, sizes_of(other), decision, marker_message())
    with pytest.raises(ValueError, match="does not match"):
        apply(history[:1], sizes_of(history[:1]), decision, marker_message())


def test_summary_and_marker_messages_have_the_fixed_texts() -> None:
    """The model can tell a digest and a truncation from a real user turn."""
    assert summary_message("done").content == SUMMARY_PREFIX + "done"
    assert marker_message().content == HISTORY_TRUNCATED
    assert message_size(marker_message()) == MARKER_SIZE


@pytest.mark.parametrize(
    "build",
    [
        lambda: Envelope(max_messages=0, max_bytes=100, keep_recent=0),
        lambda: Envelope(max_messages=1, max_bytes=1, keep_recent=0),
        lambda: Envelope(max_messages=1, max_bytes=100, keep_recent=-1),
        lambda: CompactionPlan(start=1, end=1, span=()),
        lambda: CompactionPlan(start=0, end=2, span=(user(),)),
    ],
)
def test_invalid_envelopes_and_plans_are_refused(build: Callable[[], object]) -> None:
    """No envelope without room for a message, and no empty or inconsistent span."""
    with pytest.raises(ValueError, match=r"must|invalid plan"):
        build()


def test_plan_refuses_sizes_that_do_not_match_the_history() -> None:
    """Sizes are the driver's cache; a cache out of step is a bug, reported at once."""
    with pytest.raises(ValueError, match="sizes for"):
        plan([user()], [], by_count(1), replacement_budget=0)
    with pytest.raises(ValueError, match="negative"):
        plan([user()], [1], by_count(1), replacement_budget=-1)


# --- properties: any history compacts within bounds -----------------------------------------

texts = st.text(alphabet='ab "\\\né🙂', max_size=150)


@st.composite
def histories(draw: st.DrawFn) -> list[Message]:
    """0-2 system messages, maybe orphan results, then users, assistants and tool groups."""
    ids = itertools.count()
    history: list[Message] = [
        SystemMessage(content=draw(texts)) for _ in range(draw(st.integers(0, 2)))
    ]
    history.extend(
        ToolMessage(tool_call_id=f"orphan{next(ids)}", content=draw(texts))
        for _ in range(draw(st.integers(0, 2)))
    )
    for _ in range(draw(st.integers(0, 12))):
        kind = draw(st.sampled_from(["user", "text", "tools"]))
        if kind == "user":
            history.append(user(draw(texts)))
        elif kind == "text":
            history.append(said(draw(texts)))
        else:
            calls = [f"call{next(ids)}" for _ in range(draw(st.integers(1, 3)))]
            history.extend(group(*calls, text=draw(texts)))
    return history


def group_starts(history: Sequence[Message]) -> set[int]:
    """Reference grouping: every index except a tool result inside an assistant's run."""
    inside: set[int] = set()
    owner: int | None = None
    for index, message in enumerate(history):
        if isinstance(message, ToolMessage):
            if owner is not None:
                inside.add(index)
        else:
            owner = index if isinstance(message, AssistantMessage) and message.tool_calls else None
    return set(range(len(history) + 1)) - inside


def check_tool_results_follow_their_calls(result: Sequence[Message], orphans: set[str]) -> None:
    """Every non-orphan tool result sits in the run after the assistant that called it."""
    called: set[str] = set()
    for message in result:
        if isinstance(message, ToolMessage):
            assert message.tool_call_id in called or message.tool_call_id in orphans
        elif isinstance(message, AssistantMessage):
            called = {call.id for call in message.tool_calls}
        else:
            called = set()


@settings(max_examples=200, deadline=None)
@given(
    history=histories(),
    message_fraction=st.floats(0.1, 1.2),
    byte_fraction=st.floats(0.1, 1.2),
    keep_recent=st.integers(0, 8),
    budget=st.integers(EMPTY_USER_SIZE, 400),
)
def test_any_history_compacts_within_bounds(
    history: list[Message],
    message_fraction: float,
    byte_fraction: float,
    keep_recent: int,
    budget: int,
) -> None:
    """Plans keep the head, tail and groups intact, are minimal, and make the history fit."""
    sizes = sizes_of(history)
    max_messages = max(1, int(len(history) * message_fraction))
    max_bytes = max(2, int(history_bytes(sizes) * byte_fraction))
    envelope = Envelope(max_messages=max_messages, max_bytes=max_bytes, keep_recent=keep_recent)
    decision = plan(history, sizes, envelope, replacement_budget=budget)

    if decision is None:
        assert fits(sizes, envelope)
        return
    assert not fits(sizes, envelope)

    n = len(history)
    head = next((i for i, m in enumerate(history) if not isinstance(m, SystemMessage)), n)
    starts = group_starts(history)
    tail = max(s for s in starts if s <= max(head, n - keep_recent))
    effective = max(budget, MARKER_SIZE)

    def fits_replacing(end: int) -> bool:
        return fits([*sizes[:head], effective, *sizes[end:]], envelope)

    ends = [e for e in sorted(starts) if head < e <= tail]
    if isinstance(decision, CannotFit):
        assert not any(fits_replacing(e) for e in ends)
        least = [*sizes[:head], *([effective] if ends else []), *sizes[tail:]]
        assert decision == CannotFit(messages=len(least), size=history_bytes(least))
        return

    # Pinned head, kept tail, whole groups, and the oldest shortest span.
    assert decision.start == head
    assert decision.end <= tail
    assert decision.end in starts
    assert decision.span == tuple(history[head : decision.end])
    assert decision.end == next(e for e in ends if fits_replacing(e))

    replacement = sized_user(budget)
    orphans = {
        m.tool_call_id for i, m in enumerate(history) if isinstance(m, ToolMessage) and i in starts
    }
    for candidate in (replacement, marker_message()):
        new_history, new_sizes = apply(history, sizes, decision, candidate)
        assert fits(new_sizes, envelope)
        assert new_sizes == tuple(sizes_of(new_history))
        kept = [m for m in new_history if m is not candidate]
        assert kept == [*history[:head], *history[decision.end :]]
        check_tool_results_follow_their_calls(new_history, orphans)
