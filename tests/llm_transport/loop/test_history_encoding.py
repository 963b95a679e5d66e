"""The loop encodes each message of a session once: one ``HistoryEncoder`` per run.

The bodies sent are the same bytes as encoding the whole history on every turn (what the
client does without an encoder); compaction between turns is re-encoded from where the
history changed.
"""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING, Any

from metacrate_grid_agent import (
    Completion,
    HistoryEncoder,
    LLMClient,
    Message,
    Outcome,
    SessionGeneration,
    ToolDefinition,
)
from metacrate_grid_agent._core._request import encode_request
from metacrate_grid_agent.testing import FakeEndpoint
from tests.llm_transport.loop_support import (
    FakeSummarizer,
    RecordingExecutor,
    always_calling,
    loop_config,
    make_loop,
    run_loop,
)
from tests.llm_transport.support import make_config

if TYPE_CHECKING:
    from collections.abc import Sequence


class EncoderNotingClient(LLMClient):
    """A client that notes the encoder and the messages of each request, then sends it."""

    def __init__(self, url: str) -> None:
        super().__init__(make_config(url))
        self.seen: list[tuple[HistoryEncoder | None, tuple[Message, ...]]] = []

    async def complete(
        self, messages: Sequence[Message], tools: Sequence[ToolDefinition] = (), **options: Any
    ) -> Completion:
        """Note, then send as usual."""
        self.seen.append((options.get("encoder"), tuple(messages)))
        return await super().complete(messages, tools, **options)


async def test_each_run_has_one_encoder_and_sends_the_same_bytes() -> None:
    """Every request of a run gets the run's encoder (a new one per run); each body is the
    bytes of encoding its whole history, and each turn encodes only its new messages."""
    async with FakeEndpoint(responder=always_calling()) as ep:
        client = EncoderNotingClient(ep.url)
        try:
            loop = make_loop(client, RecordingExecutor(), config=loop_config(max_turns=4))
            first = await run_loop(loop, generation=SessionGeneration("a"))
            second = await run_loop(loop, generation=SessionGeneration("b"))
        finally:
            await client.aclose()
    assert first.result.outcome is Outcome.BOUND_REACHED
    assert second.result.outcome is Outcome.BOUND_REACHED
    encoders = [encoder for encoder, _ in client.seen]
    assert len(encoders) == 8
    assert all(isinstance(e, HistoryEncoder) for e in encoders)
    assert len({id(e) for e in encoders[:4]}) == len({id(e) for e in encoders[4:]}) == 1
    assert encoders[0] is not encoders[4]
    tools = loop.registry.definitions
    for request, (_, messages) in zip(ep.requests, client.seen, strict=True):
        assert request.body == encode_request(messages, tools)
    last = client.seen[3][1]
    assert encoders[3] is not None
    assert encoders[3].encoded == len(last)  # each message of the session encoded once


async def test_a_compacted_history_is_sent_as_it_now_is() -> None:
    """Compaction replaces the oldest span between turns: the body is still exactly the
    encoding of the history sent."""
    config = loop_config(max_turns=8, max_history_messages=6, keep_recent_messages=2)
    async with FakeEndpoint(responder=always_calling()) as ep:
        client = EncoderNotingClient(ep.url)
        try:
            summarizer = FakeSummarizer()
            loop = make_loop(client, RecordingExecutor(), config=config, summarizer=summarizer)
            await run_loop(loop)
        finally:
            await client.aclose()
    tools = loop.registry.definitions
    assert len(ep.requests) == 8
    histories = [messages for _, messages in client.seen]
    replaced = [later[1] is not earlier[1] for earlier, later in itertools.pairwise(histories)]
    assert any(replaced), "no compaction happened"
    for request, (_, messages) in zip(ep.requests, client.seen, strict=True):
        assert request.body == encode_request(messages, tools)
    encoder = client.seen[-1][0]
    assert encoder is not None
    assert len(encoder) == len(histories[-1])
    # The summaries and what followed them were encoded again; the rest only once.
    assert len(histories[-1]) < encoder.encoded < sum(map(len, histories))
