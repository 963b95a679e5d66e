"""The raw tool listing rests on three private members of the MCP SDK: a version gate.

The SDK validates a ``tools/list`` answer as a whole (one bad tool refuses them all) and its
model coerces ``readOnlyHint: "yes"`` to true, so the toolset reads the listing raw. The SDK
(2.3) has no public way to do that: its ``send_request`` validates the whole result, and
``list_tools`` both validates and coerces. So the toolset uses ``ClientSession._stamp``,
``ClientSession._dispatcher.send_raw_request`` and ``ClientSession._absorb_tool_listing``.
These tests trip when the SDK changes under it.
"""

from __future__ import annotations

import importlib.metadata
from typing import TYPE_CHECKING

import pytest

pytest.importorskip("mcp", reason="the mcp extra is not installed (metacrate-grid-agent[mcp])")

from mcp.client import ClientSession

from metacrate_grid_agent.errors import ConnectError
from metacrate_grid_agent.mcp import McpLimits, McpToolset
from metacrate_grid_agent.mcp._listing import SDK_CHECKED
from tests.mcp.support import WAIT_S, EventLog, stdio_server

if TYPE_CHECKING:
    from pathlib import Path


def test_the_sdk_is_the_release_the_raw_listing_was_checked_against() -> None:
    """The installed SDK is the minor release the private members were checked in; a new
    one fails here, to look again for a public way (and then move ``SDK_CHECKED``)."""
    installed = importlib.metadata.version("mcp")
    assert installed.split(".")[:2] == SDK_CHECKED.split(".")
    assert callable(ClientSession._absorb_tool_listing)


async def test_an_sdk_without_the_private_members_fails_start_up_saying_so(
    log_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An SDK that lacks one of the members is a start-up error that says which SDK and
    what to install, not an ``AttributeError`` from deep inside."""
    monkeypatch.delattr(ClientSession, "_absorb_tool_listing")
    with pytest.raises(ConnectError) as caught:
        async with McpToolset(
            [stdio_server(EventLog(log_path))], limits=McpLimits(startup_timeout_s=WAIT_S)
        ):
            pass  # pragma: no cover - start-up fails
    text = str(caught.value)
    assert f"MCP SDK {importlib.metadata.version('mcp')}" in text
    assert f"install mcp {SDK_CHECKED}.x" in text
