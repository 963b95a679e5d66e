"""Tools from Model Context Protocol servers, for a ``ToolLoop`` (the ``mcp`` extra).

Install with ``pip install 'metacrate-grid-agent[mcp]'``. The core library never imports
this package; importing it without the extra raises an ImportError that says so.
"""

from __future__ import annotations

try:
    import mcp as _sdk  # noqa: F401 - only to fail early with a clear message
except ImportError as exc:  # pragma: no cover - exercised by the import tidy test
    raise ImportError(
        "metacrate_grid_agent.mcp needs the optional MCP SDK: install metacrate-grid-agent[mcp]"
    ) from exc

from metacrate_grid_agent import _public
from metacrate_grid_agent.mcp._servers import McpLimits, McpServer
from metacrate_grid_agent.mcp._toolset import McpExecutor, McpToolset, SkippedTool

__all__ = ["McpExecutor", "McpLimits", "McpServer", "McpToolset", "SkippedTool"]

_public.claim(globals())
