"""The public API of ``metacrate_grid_agent.mcp`` is exactly what its sorted ``__all__`` says."""

from __future__ import annotations

import pytest

pytest.importorskip("mcp", reason="the mcp extra is not installed (metacrate-grid-agent[mcp])")

PUBLIC = ["McpExecutor", "McpLimits", "McpServer", "McpToolset", "SkippedTool"]


def test_all_is_pinned_and_sorted() -> None:
    """Adding or removing a public name of the MCP adapter is a deliberate change here."""
    import metacrate_grid_agent.mcp as module

    assert module.__all__ == PUBLIC
    for name in module.__all__:
        assert hasattr(module, name), name
