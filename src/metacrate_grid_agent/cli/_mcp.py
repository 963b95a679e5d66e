"""The configuration's MCP servers, for ``run`` and ``tools``: one toolset per server.

Each ``[mcp.servers.NAME]`` table becomes an :class:`~metacrate_grid_agent.mcp.McpServer`
opened in a :class:`~metacrate_grid_agent.mcp.McpToolset` of its own (with the table's
start-up timeout), so every tool is known by the server it came from: the approval
question, the transcript and the end summary name it. A call is routed to its server's
executor by the tool's name. Two servers offering one name are refused before the session
starts, naming both and the fix (a ``tool_prefix``). A tool that ``allow_tools`` does not
name, or ``block_tools`` names, is left out by the server's own filter (before the loop's
tool ceiling is checked), listed with the configuration's reason; one the server does not
list at all is a usage error (a typo), with the nearest name it lists. The MCP SDK (the ``mcp``
extra) is imported only when a server is configured. Only the public API of the package is used.
"""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

from metacrate_grid_agent import (
    CallRecord,
    CancelToken,
    Effect,
    Tool,
    ToolExecutor,
    ToolOutcome,
    ValidatedCall,
)
from metacrate_grid_agent.cli._common import UsageError
from metacrate_grid_agent.config import McpServerSettings
from metacrate_grid_agent.errors import ConfigError, ConfigProblem

if TYPE_CHECKING:
    from metacrate_grid_agent import ToolLoopConfig

__all__ = ["MISSING_EXTRA", "McpTools", "effect_reason", "open_servers"]

#: What the command says when servers are configured but the MCP SDK is not installed.
MISSING_EXTRA: Final = (
    "the configuration names MCP servers, which need the MCP SDK: install the mcp extra "
    "(pip install '.[mcp]', or uv sync --extra mcp from a clone)"
)


@dataclass(frozen=True, slots=True)
class McpTools:
    """The tools of every configured server, and which server each one belongs to."""

    tools: tuple[Tool, ...]
    server_of: Mapping[str, str]
    #: (server, tool, reason) of each tool a server offered and the loop could not take.
    skipped: tuple[tuple[str, str, str], ...]
    executor: ToolExecutor
    #: The settings of each server, by name (for ``tools``: the overrides).
    settings: Mapping[str, McpServerSettings] = field(default_factory=dict)

    def calls_by_server(self, calls: Sequence[CallRecord]) -> dict[str, dict[str, int]]:
        """How many calls went to each server, and to which of its tools (in order)."""
        counts: dict[str, Counter[str]] = {name: Counter() for name in self.settings}
        for record in calls:
            server = self.server_of.get(record.name)
            if server is not None:
                counts[server][record.name] += 1
        return {name: dict(counter) for name, counter in counts.items()}


class _Routed:
    """A :class:`ToolExecutor` that hands each call to its server's executor."""

    def __init__(self, routes: Mapping[str, ToolExecutor]) -> None:
        self._routes = routes

    async def execute(self, call: ValidatedCall, cancel: CancelToken) -> ToolOutcome:
        """Run ``call`` on the server that offers its tool."""
        return await self._routes[call.name].execute(call, cancel)


def effect_reason(settings: McpServerSettings, tool: Tool) -> str:
    """Why ``tool`` has its effect: the configuration's override, or the server's hint."""
    remote = tool.name.removeprefix(settings.tool_prefix)
    if remote in settings.effects:
        return f"override in [mcp.servers.{settings.name}] effects"
    if tool.effect is Effect.READ_ONLY:
        return "the server's readOnlyHint: true"
    return "no readOnlyHint: true from the server; mutating by default"


def _server(settings: McpServerSettings) -> Any:
    from metacrate_grid_agent.mcp import McpServer  # noqa: PLC0415 - the optional extra

    effects = {name: Effect(value) for name, value in settings.effects.items()}
    if settings.transport == "stdio":
        assert settings.command is not None  # noqa: S101 - checked with the configuration
        return McpServer.stdio(
            settings.name,
            settings.command,
            settings.args,
            env=settings.revealed("env") or None,
            inherit_env=settings.inherit_env,
            cwd=settings.cwd,
            prefix=settings.tool_prefix,
            effects=effects,
            tool_timeout_s=settings.tool_timeout_s,
            allow_tools=settings.allow_tools,
            block_tools=settings.block_tools,
        )
    assert settings.url is not None  # noqa: S101 - checked with the configuration
    return McpServer.http(
        settings.name,
        settings.url,
        headers=settings.revealed("headers") or None,
        prefix=settings.tool_prefix,
        effects=effects,
        tool_timeout_s=settings.tool_timeout_s,
        allow_tools=settings.allow_tools,
        block_tools=settings.block_tools,
    )


def _skipped_reason(settings: McpServerSettings, name: str, reason: str) -> str:
    """The reason a tool was left out, naming the configuration's filter when it was that."""
    for remote in (name.removeprefix(settings.tool_prefix), name):
        why_not = settings.filtered_out(remote)
        if why_not is not None:
            return why_not
    return reason


def _in_table_words(error: ConfigError, name: str) -> str:
    """The toolset's configuration problems (``mcp.NAME.effects.TOOL``: a tool policy naming
    a tool the server does not list) under the configuration's own keys."""
    ours, theirs = f"mcp.servers.{name}.", f"mcp.{name}."
    problems = [
        ConfigProblem(ours + p.key.removeprefix(theirs) if p.key.startswith(theirs) else p.key,
                      p.problem)
        for p in error.problems
    ]  # fmt: skip
    return ConfigError(problems).message


@contextlib.asynccontextmanager
async def open_servers(
    servers: Sequence[McpServerSettings], config: ToolLoopConfig
) -> AsyncIterator[McpTools]:
    """Start every server and list its tools; stop them all when the block ends.

    Raises :class:`UsageError` without the MCP SDK, when two servers offer one tool name or
    when a server's tool policy names a tool it does not list;
    a server that cannot be started raises the library's error (a ``ConnectError``).
    """
    try:
        from metacrate_grid_agent.mcp import McpLimits, McpToolset  # noqa: PLC0415
    except ImportError:
        raise UsageError(MISSING_EXTRA) from None
    async with contextlib.AsyncExitStack() as stack:
        tools: list[Tool] = []
        server_of: dict[str, str] = {}
        routes: dict[str, ToolExecutor] = {}
        skipped: list[tuple[str, str, str]] = []
        for settings in servers:
            try:
                toolset = await stack.enter_async_context(
                    McpToolset(
                        [_server(settings)],
                        config=config,
                        limits=McpLimits(startup_timeout_s=settings.startup_timeout_s),
                    )
                )
            except ConfigError as exc:
                raise UsageError(_in_table_words(exc, settings.name)) from None
            for tool in toolset.tools:
                if tool.name in server_of:
                    raise UsageError(
                        f"MCP servers {server_of[tool.name]!r} and {settings.name!r} both offer "
                        f"a tool {tool.name!r}: give one of them a tool_prefix"
                    )
                server_of[tool.name] = settings.name
                routes[tool.name] = toolset.executor
                tools.append(tool)
            skipped += [
                (s.server, s.name, _skipped_reason(settings, s.name, s.reason))
                for s in toolset.skipped
            ]
        yield McpTools(
            tools=tuple(tools),
            server_of=server_of,
            skipped=tuple(skipped),
            executor=_Routed(routes),
            settings={s.name: s for s in servers},
        )
