"""``grid-agent tools``: start the configured MCP servers and list their tools.

::

    grid-agent tools [FILE | --config FILE] [--mcp-config FILE] [--json]

For every ``[mcp.servers.NAME]`` of the file: each tool the session would be offered, its
effect and why (the configuration's override, or the server's ``readOnlyHint``), whether
``run --approve`` asks before it runs (every tool not known to be read-only), and each tool
left out with the reason. The servers are started, listed and stopped; no tool is called.
Exit 0 when every server started, 1 when one did not, 2 for a usage or configuration error.
"""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import Sequence
from typing import Any, Final

from metacrate_grid_agent import AgentConfig, Effect, LLMConfig, Secret, ToolLoopConfig
from metacrate_grid_agent.cli import _output as output
from metacrate_grid_agent.cli._common import EXIT_FAILURE, EXIT_OK, UsageError, usage_failure
from metacrate_grid_agent.cli._config import load_agent_config
from metacrate_grid_agent.cli._mcp import McpTools, effect_reason, open_servers
from metacrate_grid_agent.cli._output import Console
from metacrate_grid_agent.config import McpServerSettings
from metacrate_grid_agent.errors import ConfigError, GridAgentError

__all__ = ["cmd_tools", "collect", "tools_json", "tools_report"]

#: The model settings of ``tools --mcp-config FILE`` alone: listing tools sends no request,
#: so no endpoint or key is needed, and these are never used.
UNUSED_ENDPOINT: Final = "https://unused.invalid/v1/chat/completions"
UNUSED_KEY: Final = "unused-no-request-is-sent"


def cmd_tools(args: argparse.Namespace, console: Console) -> int:
    """``grid-agent tools``: the configured servers' tools, or why they could not be listed."""
    if args.file is not None and args.config_option is not None:
        return usage_failure(console, args, "name one configuration file: FILE or --config FILE")
    path = args.file if args.file is not None else args.config_option
    if path is None and args.mcp_config is None:
        return usage_failure(
            console, args, "name the servers: tools FILE, --config FILE or --mcp-config FILE"
        )
    try:
        unused = LLMConfig(endpoint_url=UNUSED_ENDPOINT, api_key=Secret(UNUSED_KEY))
        config = load_agent_config(
            path,
            console.redactor,
            mcp_config=args.mcp_config,
            base=AgentConfig(llm=unused),
            llm_unused=True,
        )
    except ConfigError as exc:
        return usage_failure(console, args, exc.message)
    path = path or args.mcp_config
    if not config.mcp_servers:
        return usage_failure(
            console,
            args,
            f"{path} configures no MCP server ([mcp.servers.NAME]); run uses the built-in "
            "sandbox region's tools",
        )
    return asyncio.run(_tools(config.mcp_servers, config.tool_loop, args, console))


async def _tools(
    servers: Sequence[McpServerSettings],
    tool_loop: ToolLoopConfig,
    args: argparse.Namespace,
    console: Console,
) -> int:
    try:
        data = await collect(servers, tool_loop)
    except UsageError as exc:
        return usage_failure(console, args, str(exc))
    if args.json:
        console.json(data)
    elif data["ok"]:
        console.out(*tools_report(data))
    else:
        console.err(f"grid-agent tools: {data['error']['message']}")
    return EXIT_OK if data["ok"] else EXIT_FAILURE


async def collect(
    servers: Sequence[McpServerSettings], tool_loop: ToolLoopConfig
) -> dict[str, Any]:
    """Start the servers, list their tools (:func:`tools_json`) and stop them; a server that
    did not start gives ``{"ok": false, "error": ...}``. :class:`UsageError` without the
    MCP SDK or when two servers offer one name."""
    try:
        async with open_servers(servers, tool_loop) as mcp:
            return tools_json(mcp)
    except GridAgentError as exc:
        message = f"an MCP server did not start: {exc.kind}: {output.final_message(exc)}"
        return {"ok": False, "error": {"kind": exc.kind, "message": message}}


def tools_json(mcp: McpTools) -> dict[str, Any]:
    """Every server's tools (name, effect, why, approval) and the tools left out."""
    servers: dict[str, Any] = {}
    for name, settings in mcp.settings.items():
        servers[name] = {
            "transport": settings.transport,
            "tools": [
                {
                    "name": tool.name,
                    "effect": tool.effect.value,
                    "why": effect_reason(settings, tool),
                    "approval": tool.effect is not Effect.READ_ONLY,
                }
                for tool in mcp.tools
                if mcp.server_of[tool.name] == name
            ],
            "skipped": [
                {"name": tool, "reason": reason}
                for server, tool, reason in mcp.skipped
                if server == name
            ],
        }
    return {"ok": True, "servers": servers}


def tools_report(data: dict[str, Any]) -> list[str]:
    """The human form of :func:`tools_json`: one block per server."""
    lines: list[str] = []
    for name, server in data["servers"].items():
        count = len(server["tools"])
        lines += [f"{output.printable(name)} ({server['transport']}): {count} tool(s)"]
        for tool in server["tools"]:
            asks = "asks approval" if tool["approval"] else "runs unasked"
            lines.append(
                f"  {output.bounded(output.printable(tool['name']), 64):<28} "
                f"{tool['effect']:<9} {asks:<13} ({tool['why']})"
            )
        for tool in server["skipped"]:
            lines.append(
                f"  left out: {output.bounded(output.printable(tool['name']), 64)}: "
                f"{output.bounded(output.printable(tool['reason']), 300)}"
            )
        lines.append("")
    lines.append("approval: run --approve asks before every tool not known to be read-only")
    return lines
