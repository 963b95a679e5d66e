"""Safe history compaction, checked on the request bodies the endpoint received.

With small history bounds the oldest span after the pinned system message is replaced by
one summary (or, if the summarizer fails, by the fixed truncation marker), the recent tail
is sent verbatim, an assistant message is never separated from its tool results, and a
history that cannot fit is refused with nothing sent.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import msgspec
import pytest

from metacrate_grid_agent import CancelToken, LoopEvent, Message, Outcome, Success
from metacrate_grid_agent._core._compaction import HISTORY_TRUNCATED, SUMMARY_PREFIX
from metacrate_grid_agent.errors import HistoryOverflowError
from metacrate_grid_agent.testing import FakeEndpoint, Reply
from tests.llm_transport.loop_support import (
    GOAL,
    SYSTEM,
    FakeSummarizer,
    RecordingExecutor,
    Step,
    SummaryMode,
    assistant,
    bodies,
    call,
    calls_reply,
    loop_config,
    make_loop,
    run_loop,
    system,
    tool,
    unpaired_tool_messages,
    user,
)

if TYPE_CHECKING:
    from collections.abc import Sequence

    from tests.llm_transport.conftest import ClientFactory

FINAL = Reply.completion("done")
LOOK_OK = "look ok: {}"


def wire(messages: Any) -> list[dict[str, Any]]:
    """Messages (library structs) as the JSON dicts they are sent as."""
    decoded: list[dict[str, Any]] = msgspec.json.decode(msgspec.json.encode(list(messages)))
    return decoded


def history_bytes(messages: list[dict[str, Any]]) -> int:
    """The serialised size of a request's messages array."""
    return len(msgspec.json.encode(messages))


def look_turns(count: int) -> list[Reply]:
    """``count`` replies each calling ``look`` once (ids c1, c2, ...), then the final answer."""
    return [*(calls_reply(call(f"c{n}", "look")) for n in range(1, count + 1)), FINAL]


def look_round(n: int) -> list[dict[str, Any]]:
    """The assistant message and tool message of look call ``c<n>``, as sent."""
    return [assistant((f"c{n}", "look", "{}")), tool(f"c{n}", LOOK_OK)]


async def test_summary_replaces_the_oldest_span(client_factory: ClientFactory) -> None:
    """Over ``max_history_messages``: system pinned, then one summary, then the verbatim tail.

    Protects: compaction replaces the oldest messages (an earlier summary included) and
    only those, keeps the system message first and the recent tail byte for byte, and the
    summarizer sees exactly the span it replaces.
    """
    summarizer = FakeSummarizer()
    executor = RecordingExecutor()
    config = loop_config(max_history_messages=6, keep_recent_messages=2)
    async with FakeEndpoint(look_turns(4)) as ep:
        loop = make_loop(client_factory(ep.url), executor, config=config, summarizer=summarizer)
        run = await run_loop(loop)

    roles = "UserMessage, AssistantMessage, ToolMessage"
    summary_1 = user(f"{SUMMARY_PREFIX}summary 1 of 3 messages: {roles}")
    summary_2 = user(f"{SUMMARY_PREFIX}summary 2 of 3 messages: {roles}")
    expected = [
        [system(SYSTEM), user(GOAL)],
        [system(SYSTEM), user(GOAL), *look_round(1)],
        [system(SYSTEM), user(GOAL), *look_round(1), *look_round(2)],
        [system(SYSTEM), summary_1, *look_round(2), *look_round(3)],
        [system(SYSTEM), summary_2, *look_round(3), *look_round(4)],
    ]
    assert expected == [body["messages"] for body in bodies(ep)]
    spans = [[user(GOAL), *look_round(1)], [summary_1, *look_round(2)]]
    assert spans == [wire(span) for span in summarizer.spans]
    assert run.result.outcome is Outcome.COMPLETED
    assert run.result.compactions == 2
    assert run.event_kinds.count("compaction") == 2
    assert executor.call_ids == ["c1", "c2", "c3", "c4"]


async def test_tool_group_is_kept_whole(client_factory: ClientFactory) -> None:
    """When the kept tail would split an assistant from its tool results, the tail grows.

    Protects: a tool message is never sent without the assistant message that asked for
    it (the API rejects that), even when ``keep_recent_messages`` falls inside a group.
    """
    summarizer = FakeSummarizer()
    script = [
        calls_reply(call("c1", "look")),
        calls_reply(call("c2a", "look"), call("c2b", "move", '{"x": 1, "y": 2}')),
        FINAL,
    ]
    config = loop_config(max_history_messages=5, keep_recent_messages=2)
    async with FakeEndpoint(script) as ep:
        loop = make_loop(
            client_factory(ep.url), RecordingExecutor(), config=config, summarizer=summarizer
        )
        run = await run_loop(loop)

    summary = user(
        SUMMARY_PREFIX + "summary 1 of 3 messages: UserMessage, AssistantMessage, ToolMessage"
    )
    group = [
        assistant(("c2a", "look", "{}"), ("c2b", "move", '{"x": 1, "y": 2}')),
        tool("c2a", LOOK_OK),
        tool("c2b", 'move ok: {"x": 1, "y": 2}'),
    ]
    assert [system(SYSTEM), summary, *group] == bodies(ep)[2]["messages"]
    assert [[user(GOAL), *look_round(1)]] == [wire(span) for span in summarizer.spans]
    assert run.result.outcome is Outcome.COMPLETED


async def test_pairs_stay_intact_under_pressure(client_factory: ClientFactory) -> None:
    """Over many turns of 1 to 3 calls each, every request keeps every pair intact and fits.

    Protects: whatever the mix of groups, each request body is within both history bounds,
    starts with the system message, pairs every tool message with its assistant, and
    every summarized span is made of whole groups.
    """
    summarizer = FakeSummarizer()
    sizes = [1, 3, 2, 1, 3, 2, 1]
    script = [
        calls_reply(*(call(f"t{turn}-{i}", "look") for i in range(size)))
        for turn, size in enumerate(sizes, start=1)
    ]
    config = loop_config(
        max_history_messages=8,
        keep_recent_messages=3,
        max_history_bytes=2048,
        max_summary_bytes=256,
    )
    executor = RecordingExecutor(default=Step(outcome=Success("a bench, a tree, " * 8)))
    async with FakeEndpoint([*script, FINAL]) as ep:
        loop = make_loop(client_factory(ep.url), executor, config=config, summarizer=summarizer)
        run = await run_loop(loop)

    assert run.result.outcome is Outcome.COMPLETED
    assert len(ep.requests) == len(sizes) + 1
    assert run.result.compactions >= 3
    for body in bodies(ep):
        messages = body["messages"]
        assert messages[0] == system(SYSTEM)
        assert unpaired_tool_messages(messages) == []
        assert len(messages) <= 8
        assert history_bytes(messages) <= 2048
    for span in summarizer.spans:
        assert unpaired_tool_messages(wire(span)) == []
    assert sum(sizes) == len(executor.calls)


async def test_byte_bound_compacts_and_keeps_the_tail_verbatim(
    client_factory: ClientFactory,
) -> None:
    """Over ``max_history_bytes``: each compacted body is system, summary, then a verbatim tail.

    Protects: the byte bound holds for every request, and what follows the summary is
    exactly the most recent part of the full history, unchanged.
    """
    big = "rubble " * 85  # about 600 bytes per observation
    executor = RecordingExecutor(default=Step(outcome=Success(big)))
    summarizer = FakeSummarizer(limit=256)
    config = loop_config(max_history_bytes=2048, max_summary_bytes=256, keep_recent_messages=2)
    async with FakeEndpoint(look_turns(5)) as ep:
        loop = make_loop(client_factory(ep.url), executor, config=config, summarizer=summarizer)
        run = await run_loop(loop)

    full = [system(SYSTEM), user(GOAL)]
    compacted = 0
    for n, body in enumerate(bodies(ep), start=1):
        messages = body["messages"]
        assert history_bytes(messages) <= 2048
        if messages != full:
            compacted += 1
            assert messages[0] == system(SYSTEM)
            assert messages[1]["role"] == "user"
            assert messages[1]["content"].startswith(SUMMARY_PREFIX)
            tail = messages[2:]
            assert tail == full[len(full) - len(tail) :]
            assert unpaired_tool_messages(messages) == []
        full += [assistant((f"c{n}", "look", "{}")), tool(f"c{n}", big)]
    assert compacted >= 2
    assert run.result.outcome is Outcome.COMPLETED
    assert run.result.compactions == len(summarizer.spans)


@pytest.mark.parametrize("mode", ["raises", "stalls", "too_large", "escapes", "not_a_str"])
async def test_summarizer_failure_gives_the_truncation_marker(
    client_factory: ClientFactory, mode: SummaryMode
) -> None:
    """A summarizer that raises, times out or returns too much is replaced by the fixed marker.

    Protects: compaction never depends on the summarizer behaving; the history still fits,
    the marker (a fixed text, never anything the summarizer made) takes the span's place,
    and the session goes on.
    """
    summarizer = FakeSummarizer(mode, limit=256)
    config = loop_config(
        max_history_messages=6,
        keep_recent_messages=2,
        max_summary_bytes=256,
        summarizer_timeout_s=0.05,
    )
    executor = RecordingExecutor()
    async with FakeEndpoint(look_turns(4)) as ep:
        loop = make_loop(client_factory(ep.url), executor, config=config, summarizer=summarizer)
        run = await run_loop(loop)

    marker = user(HISTORY_TRUNCATED)
    assert HISTORY_TRUNCATED.startswith("[earlier conversation truncated")
    expected_tails = [
        [system(SYSTEM), marker, *look_round(2), *look_round(3)],
        [system(SYSTEM), marker, *look_round(3), *look_round(4)],
    ]
    assert expected_tails == [body["messages"] for body in bodies(ep)[3:]]
    assert [[user(GOAL), *look_round(1)], [marker, *look_round(2)]] == [
        wire(span) for span in summarizer.spans
    ]
    assert run.result.outcome is Outcome.COMPLETED
    assert run.result.compactions == 2
    assert summarizer.cancelled == (2 if mode == "stalls" else 0)
    assert len(ep.requests) == 5


async def test_a_summary_cut_at_its_timeout_sees_its_token_cancelled_with_the_reason(
    client_factory: ClientFactory,
) -> None:
    """At ``summarizer_timeout_s`` the summarizer's own token is cancelled with
    ``summarizer_timeout`` before the cut reaches it, as an approver's or executor's is.

    Protects: a summarizer can tell why it was stopped (and stop work it started elsewhere)
    from the token the loop gave it; the session's own token is left alone and the session
    goes on with the marker.
    """
    summarizer = FakeSummarizer("stalls", limit=256)
    config = loop_config(
        max_history_messages=6,
        keep_recent_messages=2,
        max_summary_bytes=256,
        summarizer_timeout_s=0.05,
    )
    async with FakeEndpoint(look_turns(4)) as ep:
        loop = make_loop(
            client_factory(ep.url), RecordingExecutor(), config=config, summarizer=summarizer
        )
        run = await run_loop(loop)

    assert summarizer.cut_reasons == ["summarizer_timeout", "summarizer_timeout"]
    assert run.result.outcome is Outcome.COMPLETED
    assert run.result.cancel_reason is None
    assert run.result.compactions == 2
    assert len(ep.requests) == 5


class OneArgumentSummarizer:
    """A summarizer written before ``summarize`` took a token: ``summarize(messages)``."""

    def __init__(self) -> None:
        self.spans: list[tuple[Message, ...]] = []

    async def summarize(self, messages: Sequence[Message]) -> str:
        """Record the span; a summary naming its length."""
        self.spans.append(tuple(messages))
        return f"old-style summary of {len(messages)} messages"


async def test_a_one_argument_summarizer_still_works(client_factory: ClientFactory) -> None:
    """A summarizer whose ``summarize`` takes only the messages (the deprecated form) is
    called without a token, and its summary is used.

    Protects: adding ``cancel`` to the protocol breaks no summarizer written against the
    one-argument form.
    """
    summarizer = OneArgumentSummarizer()
    config = loop_config(max_history_messages=6, keep_recent_messages=2)
    async with FakeEndpoint(look_turns(3)) as ep:
        loop = make_loop(
            client_factory(ep.url),
            RecordingExecutor(),
            config=config,
            summarizer=summarizer,  # type: ignore[arg-type]  # the deprecated form, on purpose
        )
        run = await run_loop(loop)

    summary = user(f"{SUMMARY_PREFIX}old-style summary of 3 messages")
    assert [system(SYSTEM), summary, *look_round(2), *look_round(3)] == bodies(ep)[3]["messages"]
    assert [[user(GOAL), *look_round(1)]] == [wire(span) for span in summarizer.spans]
    assert run.result.outcome is Outcome.COMPLETED
    assert run.result.compactions == 1


async def test_no_summarizer_gives_the_truncation_marker(client_factory: ClientFactory) -> None:
    """Without a summarizer the span is replaced by the marker, and the session goes on.

    Protects: compaction works for applications that configure no summarizer.
    """
    config = loop_config(max_history_messages=6, keep_recent_messages=2)
    async with FakeEndpoint(look_turns(3)) as ep:
        loop = make_loop(client_factory(ep.url), RecordingExecutor(), config=config)
        run = await run_loop(loop)

    expected = [system(SYSTEM), user(HISTORY_TRUNCATED), *look_round(2), *look_round(3)]
    assert expected == bodies(ep)[3]["messages"]
    assert run.result.outcome is Outcome.COMPLETED


async def test_overflowing_system_prompt_sends_nothing(client_factory: ClientFactory) -> None:
    """A pinned head too large for ``max_history_bytes`` ends as history_overflow, nothing sent.

    Protects: an over-limit prompt is refused before any byte leaves (no request, no
    connection), with a typed error, and neither summarizer nor executor is involved.
    """
    summarizer = FakeSummarizer()
    executor = RecordingExecutor()
    config = loop_config(max_history_bytes=1024, max_summary_bytes=256)
    async with FakeEndpoint([FINAL]) as ep:
        loop = make_loop(
            client_factory(ep.url),
            executor,
            config=config,
            summarizer=summarizer,
            system_prompt="rules " * 400,
        )
        run = await run_loop(loop)

    assert run.result.outcome is Outcome.HISTORY_OVERFLOW
    assert isinstance(run.result.error, HistoryOverflowError)
    assert ep.requests == []
    assert ep.connections == []
    assert summarizer.spans == []
    assert executor.calls == []


async def test_overflowing_tail_stops_before_the_next_request(
    client_factory: ClientFactory,
) -> None:
    """A recent tail too large to compact ends the session with no request for that turn.

    Protects: history_overflow is checked before every request, not only the first: the
    loop never sends an over-limit history, even mid-session.
    """
    executor = RecordingExecutor(default=Step(outcome=Success("x" * 1500)))
    config = loop_config(max_history_bytes=1024, max_summary_bytes=256, max_observation_bytes=2048)
    async with FakeEndpoint([calls_reply(call("c1", "look")), FINAL]) as ep:
        loop = make_loop(client_factory(ep.url), executor, config=config)
        run = await run_loop(loop)

    assert run.result.outcome is Outcome.HISTORY_OVERFLOW
    assert isinstance(run.result.error, HistoryOverflowError)
    assert len(ep.requests) == 1
    assert executor.call_ids == ["c1"]


class SurrogateSummarizer:
    """Returns text with a lone surrogate, as a summarizer decoding leniently might."""

    async def summarize(self, messages: Sequence[Message], cancel: CancelToken) -> str:
        """A summary that is not valid UTF-8."""
        return f"x\ud800 summary of {len(messages)} messages"


async def test_a_summary_with_a_lone_surrogate_is_made_valid(client_factory: ClientFactory) -> None:
    """A summary holding a lone surrogate is made valid UTF-8 ("?"), and the session goes on.

    Protects: application text is made valid at the boundary, so a lenient summarizer can
    neither crash ``run`` nor put text on the wire that cannot be encoded.
    """
    config = loop_config(max_history_messages=6, keep_recent_messages=2)
    events: list[LoopEvent] = []
    async with FakeEndpoint(look_turns(3)) as ep:
        loop = make_loop(
            client_factory(ep.url),
            RecordingExecutor(),
            config=config,
            summarizer=SurrogateSummarizer(),
        )
        run = await run_loop(loop, on_event=events.append)

    assert run.result.outcome is Outcome.COMPLETED
    assert run.result.compactions == 1
    sent = bodies(ep)[3]["messages"]
    assert sent[1] == user(f"{SUMMARY_PREFIX}x? summary of 3 messages")
    for request in ep.requests:
        request.body.decode("utf-8")  # every body is valid UTF-8
    finish = events[-1].result  # what the event sink got holds valid text only
    assert finish is not None
    for message in finish.messages:
        str(getattr(message, "content", "")).encode("utf-8")
