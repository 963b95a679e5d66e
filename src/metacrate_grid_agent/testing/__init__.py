"""Test helpers: a scripted, fault-injecting OpenAI-compatible endpoint on loopback.

`FakeEndpoint` is a real HTTP/1.1 server bound to ``127.0.0.1`` on an ephemeral port, driven by
a script of `Reply` values (or responders that build a reply from the `RecordedRequest`). A
`Reply` carries its own faults: split or dripped writes, stalls, lying or missing lengths,
chunked framing, endless bodies, resets and closes at any byte. The endpoint records every
request and connection, and fails the test loudly when it cannot do its job::

    from metacrate_grid_agent.testing import FakeEndpoint, Reply

    async def test_answers() -> None:
        script = [Reply.error(503, "busy"), Reply.completion("hello")]
        async with FakeEndpoint(script) as ep:
            ...  # point the client at ep.url and call it
        assert [r.target for r in ep.requests] == ["/v1/chat/completions"] * 2

Nothing here makes a network call beyond the loopback interface.
"""

from metacrate_grid_agent import _public
from metacrate_grid_agent.testing._fake_endpoint import FakeEndpoint
from metacrate_grid_agent.testing._fake_wire import (
    ConnectionRecord,
    RecordedRequest,
    Reply,
    Responder,
    ScriptItem,
    ToolCallSpec,
)

__all__ = [
    "ConnectionRecord",
    "FakeEndpoint",
    "RecordedRequest",
    "Reply",
    "Responder",
    "ScriptItem",
    "ToolCallSpec",
]

_public.claim(globals())
