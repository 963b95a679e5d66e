"""``HistoryEncoder``'s pieces: the body made of the kept bytes themselves, few of them.

A long history's body is joined from a few pieces (the block of older messages, the newer
ones, the end): the pieces make exactly the body :func:`encode_request` makes, their
length is the body's, and the bytes already joined are the same object the next turn.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from metacrate_grid_agent._core import _request
from metacrate_grid_agent._core._request import HistoryEncoder, encode_request, encode_tools
from metacrate_grid_agent._core._types import Message, ToolDefinition, UserMessage
from tests.core.test_history_encoder import TOOLS, _sessions


@pytest.mark.parametrize("loose", [0, 1, 2, _request.MAX_LOOSE_PARTS])
@given(requests=_sessions(), tools=st.sampled_from([(), TOOLS, list(TOOLS)]))
def test_the_pieces_are_the_body(
    requests: list[list[Message]], tools: tuple[ToolDefinition, ...], loose: int
) -> None:
    """For any succession of histories (grown, edited inside the joined block or after it,
    compacted, rewritten), the pieces joined are ``encode_request``'s body and the length
    given is theirs, with the tools encoded or spliced in, whatever the block's size."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(_request, "MAX_LOOSE_PARTS", loose)
        encoder = HistoryEncoder()
        for history in requests:
            expected = encode_request(history, tools)
            pieces, size = encoder.body_pieces(history, tools)
            assert (b"".join(pieces), size) == (expected, len(expected))
            spliced, size = encoder.body_pieces(history, tools, tools_json=encode_tools(tools))
            assert (b"".join(spliced), size) == (expected, len(expected))


def test_a_turn_copies_none_of_the_history_sent_before() -> None:
    """A long history's next turn writes the very bytes objects kept from the last one (the
    joined block, then the few newer messages), never a new copy of the whole history."""
    encoder = HistoryEncoder()
    history: list[Message] = [UserMessage(content=f"turn {n}") for n in range(200)]
    first, _ = encoder.body_pieces(history, TOOLS)
    history += [UserMessage(content="one more")]
    second, _ = encoder.body_pieces(history, TOOLS)
    assert first[0] is second[0]  # the block of the 200 messages, as it was
    assert len(second) <= 1 + _request.MAX_LOOSE_PARTS + 3
    assert encoder.encoded == 201


def test_the_tools_json_given_is_written_as_it_is() -> None:
    """``tools_json``, the tools' JSON kept from an earlier request, is written as given and
    not serialised again (a marker stands in for it here), by ``encode`` and by
    ``body_pieces``; with no tools nothing of it is written."""
    history = [UserMessage(content="hi")]
    marker = b'[{"kept":1}]'
    body = HistoryEncoder().encode(history, TOOLS, tools_json=marker)
    assert body.endswith(b'],"tools":' + marker + b"}")
    pieces, size = HistoryEncoder().body_pieces(history, TOOLS, tools_json=marker)
    assert pieces[-2:] == [marker, b"}"]
    assert size == len(b"".join(pieces))
    assert HistoryEncoder().encode(history, (), tools_json=marker) == encode_request(history, ())


def test_newer_messages_stay_loose_up_to_the_bound_then_join_the_block() -> None:
    """Up to :data:`MAX_LOOSE_PARTS` newer messages are pieces of their own (one piece each,
    no block yet, no empty piece); one more and they are joined into the block."""
    encoder = HistoryEncoder()
    history: list[Message] = []
    for n in range(_request.MAX_LOOSE_PARTS):
        history.append(UserMessage(content=f"m{n}"))
        pieces, _ = encoder.body_pieces(history, ())
        assert len(pieces) == len(history) + 1  # each message, then the end
        assert all(pieces)
    history.append(UserMessage(content="one past the bound"))
    pieces, _ = encoder.body_pieces(history, ())
    assert len(pieces) == 2  # the block, then the end
    assert b"".join(pieces) == encode_request(history, ())


def test_a_tuple_history_reuses_its_prefix_like_a_list() -> None:
    """A history given as a tuple (or any sequence) is compared with what was sent like a
    list: only its new messages are encoded."""
    encoder = HistoryEncoder()
    history: tuple[Message, ...] = tuple(UserMessage(content=f"m{n}") for n in range(3))
    encoder.encode(history, ())
    history += (UserMessage(content="new"),)
    assert encoder.encode(history, ()) == encode_request(history, ())
    assert encoder.encoded == 4
