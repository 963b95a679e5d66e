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


def test_an_executor_is_not_built_by_hand() -> None:
    """An ``McpExecutor`` comes only from ``McpToolset.executor``; building one directly says
    where to get it instead of making an executor with no servers behind it."""
    from metacrate_grid_agent.mcp import McpExecutor

    with pytest.raises(TypeError, match=r"comes from McpToolset\.executor"):
        McpExecutor()
