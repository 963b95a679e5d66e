"""Without a ``HistoryEncoder`` of the caller's, the client keeps the last request's
message bytes: the same message objects sent again are not serialised again.

A caller that sends its history on every request (the same frozen messages, a few new ones
at the end) pays for the new ones only, as a tool loop with its own encoder does; the body
is byte for byte what encoding the whole history makes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from metacrate_grid_agent import AssistantMessage, SystemMessage, ToolMessage, UserMessage
from metacrate_grid_agent._core import _request
from metacrate_grid_agent.testing import FakeEndpoint, Reply

if TYPE_CHECKING:
    import pytest

    from metacrate_grid_agent import Message
    from tests.llm_transport.conftest import ClientFactory


class CountingEncoder:
    """Wraps the module's encoder and notes every message object it serialises."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.messages: list[object] = []

    def encode(self, obj: Any) -> bytes:
        """Note the messages in ``obj``, then encode it as the real encoder does."""
        items = obj if isinstance(obj, (list, tuple)) else [obj]
        self.messages += [item for item in items if isinstance(item, _MESSAGE_TYPES)]
        if isinstance(obj, _request._RequestBody):
            self.messages += list(obj.messages)
        encoded: bytes = self.inner.encode(obj)
        return encoded


_MESSAGE_TYPES = (SystemMessage, UserMessage, AssistantMessage, ToolMessage)


async def test_repeated_messages_are_serialised_once(
    client_factory: ClientFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Three requests growing one history, no encoder passed: each message object is
    serialised once, and every body is exactly ``encode_request`` of its history."""
    counting = CountingEncoder(_request._ENCODER)
    monkeypatch.setattr(_request, "_ENCODER", counting)
    history: list[Message] = [SystemMessage(content="be brief"), UserMessage(content="hello")]
    sent: list[tuple[Message, ...]] = []
    async with FakeEndpoint([Reply.completion("ok")] * 3) as ep:
        client = client_factory(ep.url)
        for turn in range(3):
            sent.append(tuple(history))
            await client.complete(history)
            history += [AssistantMessage(content=f"turn {turn}"), UserMessage(content="and?")]
    monkeypatch.undo()
    for request, messages in zip(ep.requests, sent, strict=True):
        assert request.body == _request.encode_request(messages, ())
    assert len(counting.messages) == len(sent[-1])
    assert len({id(message) for message in counting.messages}) == len(sent[-1])
