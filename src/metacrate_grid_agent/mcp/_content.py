"""An MCP tool result as one bounded observation: text inlined, everything else described.

Text blocks are the observation, joined by newlines. An image, audio clip, embedded
resource or resource link is named by kind, media type and size, never inlined (the model
gets words, not base64). With no content blocks, structured content is shown as JSON.
"""

from __future__ import annotations

from typing import Any, Final

import mcp_types
import msgspec

from metacrate_grid_agent._core._redact import TRUNCATION_MARKER, bounded_text

__all__ = ["render_result"]

#: Characters of a server-supplied name or URI quoted in a description.
_QUOTED_CHARS: Final = 120


def _quoted(value: object) -> str:
    return repr(str(value)[:_QUOTED_CHARS])


def _base64_bytes(data: str) -> int:
    return len(data) * 3 // 4


def _describe(block: Any) -> str:
    if isinstance(block, mcp_types.ImageContent):
        return f"[image: {_quoted(block.mime_type)}, about {_base64_bytes(block.data)} bytes]"
    if isinstance(block, mcp_types.AudioContent):
        return f"[audio: {_quoted(block.mime_type)}, about {_base64_bytes(block.data)} bytes]"
    if isinstance(block, mcp_types.ResourceLink):
        return f"[resource link: {_quoted(block.uri)}]"
    if isinstance(block, mcp_types.EmbeddedResource):
        resource = block.resource
        mime = resource.mime_type or "unknown type"
        if isinstance(resource, mcp_types.TextResourceContents):
            size = len(resource.text.encode("utf-8", "replace"))
        else:
            size = _base64_bytes(resource.blob)
        return f"[embedded resource: {_quoted(resource.uri)}, {_quoted(mime)}, {size} bytes]"
    return f"[content of type {_quoted(getattr(block, 'type', type(block).__name__))}]"


def render_result(result: mcp_types.CallToolResult, limit: int) -> str:
    """The observation for ``result``: at most ``limit`` bytes of UTF-8."""
    parts: list[str] = []
    size = 0
    for block in result.content:
        text = block.text if isinstance(block, mcp_types.TextContent) else _describe(block)
        parts.append(text)
        size += len(text)
        if size > limit:  # characters >= bytes / 4: enough to fill the limit
            break
    if not parts and result.structured_content is not None:
        try:
            parts.append(msgspec.json.encode(result.structured_content).decode("utf-8"))
        except (TypeError, ValueError):
            parts.append("[structured content that is not JSON]")
    if not parts:
        return "(no content)"
    return bounded_text("\n".join(parts), limit, marker=TRUNCATION_MARKER)
