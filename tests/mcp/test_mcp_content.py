"""An MCP tool result becomes one bounded observation: text inlined, the rest described."""

from __future__ import annotations

import pytest

pytest.importorskip("mcp", reason="the mcp extra is not installed (metacrate-grid-agent[mcp])")

import mcp_types as types

from metacrate_grid_agent.mcp._content import render_result


def result(*blocks: types.ContentBlock, structured: object = None) -> types.CallToolResult:
    """A tool result with ``blocks`` and optional structured content."""
    return types.CallToolResult(content=list(blocks), structured_content=structured)


def test_text_blocks_are_the_observation_joined_by_lines() -> None:
    """Text content is shown to the model as it is, in order.

    Protects: what the server says is what the model reads.
    """
    text = result(types.TextContent(text="a cat"), types.TextContent(text="a bench"))
    assert render_result(text, 1024) == "a cat\na bench"


def test_a_long_text_is_cut_to_the_limit_with_a_marker() -> None:
    """A result larger than the limit is cut on a character boundary and marked.

    Protects: no observation grows past the adapter's bound, whatever the server sends.
    """
    long = result(types.TextContent(text="é" * 10_000))
    observation = render_result(long, 1000)
    assert len(observation.encode("utf-8")) <= 1000
    assert observation.endswith("… [truncated]")


def test_non_text_content_is_described_not_inlined() -> None:
    """Images, audio, resource links and embedded resources are named with size and type.

    Protects: the model never gets base64 or a resource's body pasted into its history.
    """
    data = "QUJD" * 1000
    blocks = result(
        types.ImageContent(data=data, mime_type="image/png"),
        types.AudioContent(data=data, mime_type="audio/wav"),
        types.ResourceLink(name="map", uri="grid://harbour/map"),
        types.EmbeddedResource(
            resource=types.TextResourceContents(
                uri="grid://harbour/notes", mime_type="text/plain", text="secret plans"
            )
        ),
    )
    observation = render_result(blocks, 4096)
    assert observation.splitlines() == [
        "[image: 'image/png', about 3000 bytes]",
        "[audio: 'audio/wav', about 3000 bytes]",
        "[resource link: 'grid://harbour/map']",
        "[embedded resource: 'grid://harbour/notes', 'text/plain', 12 bytes]",
    ]
    assert data not in observation
    assert "secret plans" not in observation


def test_structured_content_alone_is_shown_as_json_and_nothing_is_said() -> None:
    """With no content blocks, structured content is the observation; with neither, a marker.

    Protects: a server that answers only with structured content still tells the model
    something, and an empty result is visible as such.
    """
    assert render_result(result(structured={"x": 3, "y": 4}), 1024) == '{"x":3,"y":4}'
    assert render_result(result(), 1024) == "(no content)"
