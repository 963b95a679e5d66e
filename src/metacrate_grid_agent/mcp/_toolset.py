"""Tools from MCP servers for a ``ToolLoop``: :class:`McpToolset` and :class:`McpExecutor`.

:class:`McpToolset` starts one connection per configured server (a subprocess over stdio,
or one exact URL over streamable HTTP), lists each server's tools, and turns them into the
loop's :class:`Tool` values; :class:`McpExecutor` is the :class:`ToolExecutor` that sends a
validated call to the server that offered the tool.

Choices made here, and why:

* Each connection lives in a task of its own, owned by the toolset. The SDK runs a
  connection inside a task group; a transport that breaks would otherwise cancel whatever
  task opened it (the caller's, which may be running a ``ToolLoop``). Calls are awaited in
  the caller's task and get their answer, or ``CONNECTION_CLOSED``, from that connection.
* A listing is read raw and parsed tool by tool (``_listing``: the SDK would refuse a
  whole listing for one bad tool): a tool that does not parse is left out with the field
  at fault. The server's tool filter (``allow_tools``, ``block_tools``) applies next.
* Every schema goes through ``ToolRegistry`` alone first: a tool that fails (a bad or
  remote-referencing schema, a name outside the loop's alphabet, an oversized
  description) is left out and logged, never a crash. A tool policy (``effects``,
  ``allow_tools``, ``block_tools``) naming a tool the server does not list is a
  configuration error, not a warning: a typo would leave the real tool as declared. Two
  tools that end up with one name are an error at start-up: a server's ``prefix`` tells
  them apart (one server listing a name twice is an error a prefix cannot help).
* Effect fails closed: only a JSON ``readOnlyHint: true`` in the raw listing (not the SDK's
  model, which coerces ``"yes"`` and ``1``) makes a tool read-only, unless the operator's
  per-tool override says otherwise.
* A stdio server runs behind this package's own transport (``_stdio``): bounded lines, a
  process group of its own, stderr logged; an HTTP server behind ``_http``'s client.
* A call is sent with ``ClientSession.call_tool`` itself, not the SDK's convenience
  wrapper: that wrapper may send the call again (after a ``HEADER_MISMATCH``, or with
  answers to a server's input request), and a mutating call is sent at most once.
* Outcomes: ``isError`` is a failure with the server's text; a result is a success with
  its text. A protocol error that says the call was refused (unknown method, invalid
  params, header mismatch) is a failure; anything else that leaves the effect unknown (a
  broken or closed connection, a timeout, a crash, an unreadable result, a request for
  input this adapter cannot give) is ambiguous for a mutating tool and a failure for a
  read-only one.
* Cancellation (the ``CancelToken`` given to ``execute``, or a plain asyncio cancellation
  such as the loop's tool timeout) interrupts the SDK's wait, and the SDK sends the
  protocol's ``notifications/cancelled`` for the request before the cancellation goes on.
  A call whose token is already cancelled, or whose connection is gone, is never sent.
* The executor decides nothing about whether a call may run: the loop's ``Approver`` (or
  any ``ToolExecutor`` in front of this one) sees every call before anything is sent.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType, TracebackType
from typing import Any, Final

import httpx2
import mcp_types
from mcp.client import Client, ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

from metacrate_grid_agent._aio._cancel import CancelToken
from metacrate_grid_agent._core._redact import NO_KEY, TRUNCATION_MARKER, bounded_text, scrub
from metacrate_grid_agent._core._schema import ToolRegistry
from metacrate_grid_agent._core._tools import (
    Ambiguous,
    Effect,
    Failure,
    Success,
    Tool,
    ToolOutcome,
    ValidatedCall,
)
from metacrate_grid_agent._version import __version__
from metacrate_grid_agent.config import ToolLoopConfig
from metacrate_grid_agent.errors import (
    CancelledByCallerError,
    ConfigError,
    ConnectError,
    ToolDefinitionError,
)
from metacrate_grid_agent.mcp._content import render_result
from metacrate_grid_agent.mcp._credentials import CredentialError, request_headers
from metacrate_grid_agent.mcp._http import HttpTrace, exact_url_client
from metacrate_grid_agent.mcp._listing import Listing, StartupError, list_tools, policy_problems
from metacrate_grid_agent.mcp._servers import McpLimits, McpServer
from metacrate_grid_agent.mcp._stdio import StdioTrace, stdio_transport

__all__ = ["McpExecutor", "McpToolset", "SkippedTool"]

logger = logging.getLogger("metacrate_grid_agent.mcp")

#: Protocol errors that mean the server refused the call before running it.
_REFUSED: Final = frozenset(
    {mcp_types.METHOD_NOT_FOUND, mcp_types.INVALID_PARAMS, mcp_types.HEADER_MISMATCH}
)
#: Characters of a server's error message kept in an observation.
_MESSAGE_CHARS: Final = 200
#: Longest wait for a connection to wind down when the toolset closes (the stdio transport
#: bounds its shutdown at about 5 s: close stdin, terminate, kill).
_CLOSE_S: Final = 10.0
_UNCLEAR: Final = "its effect may or may not have happened"
#: How much longer than the tool timeout an HTTP response may stay silent.
_READ_MARGIN_S: Final = 5.0
#: Share of the start-up limit the protocol probe may take before the handshake falls back
#: to ``initialize`` (which, with the listing, gets the rest).
_PROBE_SHARE: Final = 0.25
#: How this client names itself to a server (``initialize``'s ``clientInfo``).
_CLIENT_INFO: Final = mcp_types.Implementation(name="metacrate-grid-agent", version=__version__)


@dataclass(frozen=True, slots=True)
class SkippedTool:
    """A tool a server offered that the toolset left out, and why."""

    server: str
    name: str
    reason: str


def _leaves(exc: BaseException) -> list[BaseException]:
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for inner in exc.exceptions for leaf in _leaves(inner)]
    return [exc]


def _cause(exc: BaseException, refused_status: int | None) -> str:
    """What made start-up fail, in words: never a header, a token or a request.

    ``refused_status`` is the last HTTP status of 300 or over the server answered: the SDK
    turns a refusal into a JSON-RPC error that no longer says which.
    """
    leaves = _leaves(exc)
    for leaf in leaves:
        if isinstance(leaf, StartupError):
            return str(leaf)
    status = refused_status
    for leaf in leaves:
        if isinstance(leaf, httpx2.HTTPStatusError):
            status = leaf.response.status_code
    if status is not None:
        if 300 <= status < 400:
            return f"HTTP status {status}: redirect refused"
        return f"HTTP status {status}"
    for leaf in leaves:
        if isinstance(leaf, MCPError):
            detail = scrub(leaf.error.message, redactor=NO_KEY, limit=_MESSAGE_CHARS)
            return f"MCP error {leaf.error.code}: {detail}"
        if isinstance(leaf, httpx2.TransportError):
            detail = scrub(str(leaf), redactor=NO_KEY, limit=_MESSAGE_CHARS)
            return f"{type(leaf).__name__}: {detail}"
        if isinstance(leaf, OSError):
            return f"{type(leaf).__name__}: {leaf.strerror or 'the command could not be run'}"
    return type(leaves[0]).__name__ if leaves else type(exc).__name__


class _Connection:
    """One server's connection, held open by a task of its own until :meth:`close`."""

    def __init__(self, server: McpServer, limits: McpLimits, tool_timeout_s: float) -> None:
        self.server = server
        self._limits = limits
        # A call's own silence must be ended by the loop's tool timeout (a clean cancel of
        # one request), not by the HTTP read timeout (which tears the connection down).
        self._read_timeout_s = max(limits.http_read_timeout_s, tool_timeout_s + _READ_MARGIN_S)
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._ready: asyncio.Future[Listing] | None = None
        self.session: ClientSession | None = None
        self.alive = False
        #: The answer start-up waits for, named when the start-up limit runs out.
        self._phase = "initialize"
        self._http_trace = HttpTrace()
        #: A stdio server's exit and last stderr lines, said when start-up fails.
        self._stdio_trace = StdioTrace()
        #: The request headers, the bearer token read from its source (at start).
        self._headers: dict[str, str] = {}

    async def start(self) -> Listing:
        """Connect and list the tools, within ``startup_timeout_s``."""
        label = self.server.label
        try:
            self._headers = request_headers(self.server, os.environ)
        except CredentialError as exc:
            raise ConnectError(f"MCP server {label!r} could not be started ({exc})") from None
        self._ready = asyncio.get_running_loop().create_future()
        self._task = asyncio.create_task(self._hold(), name=f"mcp server {self.server.label}")
        try:
            async with asyncio.timeout(self._limits.startup_timeout_s):
                return await asyncio.shield(self._ready)
        except TimeoutError:
            problem = (
                f"did not start and list its tools: no {self._phase} answer within "
                f"{self._limits.startup_timeout_s:g} s"
            )
        except Exception as exc:  # noqa: BLE001 - any start-up failure means not started
            problem = f"could not be started ({_cause(exc, self._http_trace.refused_status)})"
        # Raised outside the handler, so no context chain keeps the SDK's exception (an HTTP
        # error holds the request, and the request holds the configured headers).
        await self.close()
        problem += self._stdio_trace.describe()  # complete once the transport has closed
        ready, self._ready = self._ready, None
        if ready.done() and not ready.cancelled():
            ready.exception()  # retrieved: asyncio would otherwise log it as never retrieved
        raise ConnectError(f"MCP server {label!r} {problem}")

    async def _hold(self) -> None:
        ready = self._ready
        assert ready is not None  # noqa: S101 - set by start
        try:
            async with contextlib.AsyncExitStack() as stack:
                if self.server.transport == "http":
                    assert self.server.url is not None  # noqa: S101 - checked when built
                    http = await stack.enter_async_context(
                        exact_url_client(
                            self.server.url,
                            headers=self._headers,
                            connect_timeout_s=self._limits.http_connect_timeout_s,
                            read_timeout_s=self._read_timeout_s,
                            max_response_bytes=self._limits.max_response_bytes,
                            trace=self._http_trace,
                        )
                    )
                    transport = streamable_http_client(
                        self.server.url,
                        http_client=http,
                        max_sse_event_size=self._limits.max_response_bytes,
                    )
                    client = await stack.enter_async_context(
                        Client(transport, cache=None, client_info=_CLIENT_INFO)
                    )
                else:
                    assert self.server.command is not None  # noqa: S101 - checked when built
                    stdio = stdio_transport(
                        label=self.server.label,
                        command=self.server.command,
                        args=self.server.args,
                        env=self.server.env,
                        inherit_env=self.server.inherit_env,
                        cwd=self.server.cwd,
                        max_message_bytes=self._limits.max_response_bytes,
                        probe_s=self._limits.startup_timeout_s * _PROBE_SHARE,
                        trace=self._stdio_trace,
                    )
                    client = await stack.enter_async_context(
                        Client(stdio, cache=None, client_info=_CLIENT_INFO)
                    )
                self._phase = "tools/list"
                tools = await list_tools(
                    client.session,
                    label=self.server.label,
                    max_pages=self._limits.max_list_pages,
                )
                self.session = client.session
                self.alive = True
                if not ready.done():
                    ready.set_result(tools)
                await self._stop.wait()
        except BaseException as exc:
            if not ready.done():
                ready.set_exception(
                    exc if isinstance(exc, Exception) else ConnectionError("start-up cancelled")
                )
            elif not self._stop.is_set():
                logger.warning(
                    "MCP server %r: connection lost (%s)", self.server.label, type(exc).__name__
                )
            if not isinstance(exc, Exception):
                raise
        finally:
            self.alive = False

    async def close(self) -> None:
        """Stop the connection (and a stdio server's process); bounded, idempotent."""
        self._stop.set()
        self.alive = False
        task = self._task
        if task is None or task.done():
            return
        starting = self._ready is not None and not self._ready.done()
        done = set() if starting else (await asyncio.wait({task}, timeout=_CLOSE_S))[0]
        if not done:  # still starting (nothing to wind down in order), or stuck
            task.cancel()
            await asyncio.wait({task}, timeout=_CLOSE_S)


@dataclass(frozen=True, slots=True)
class _Route:
    connection: _Connection
    remote_name: str


class McpExecutor:
    """The :class:`~metacrate_grid_agent.ToolExecutor` for tools from MCP servers.

    Sends each validated call, once, to the server that offered the tool; see the module
    documentation for how results and failures become outcomes. It comes from
    :attr:`McpToolset.executor`; it is not built directly.
    """

    __slots__ = ("_limits", "_routes")

    _routes: Mapping[str, _Route]
    _limits: McpLimits

    def __init__(self) -> None:
        raise TypeError("an McpExecutor comes from McpToolset.executor; it is not built directly")

    @classmethod
    def _over(cls, routes: Mapping[str, _Route], limits: McpLimits) -> McpExecutor:
        """The executor sending each call along ``routes``, within ``limits``."""
        executor = object.__new__(cls)
        executor._routes = routes
        executor._limits = limits
        return executor

    async def execute(self, call: ValidatedCall, cancel: CancelToken) -> ToolOutcome:
        """Send ``call`` to its server and report the outcome."""
        route = self._routes.get(call.name)
        if route is None:
            return Failure(f"no MCP tool is called {call.name!r}; the call was not sent")
        connection = route.connection
        label = connection.server.label
        if cancel.cancelled:
            return Failure(f"tool {call.name!r} was cancelled before it was sent")
        session = connection.session
        if session is None or not connection.alive:
            return Failure(f"MCP server {label!r} is not connected; the call was not sent")
        mutating = call.effect is Effect.MUTATING
        try:
            with cancel.bound(f"MCP tool {call.name!r}"):
                result = await session.call_tool(
                    route.remote_name,
                    dict(call.arguments),
                    allow_input_required=True,
                    allow_claimed=True,
                )
        except CancelledByCallerError:
            raise
        except MCPError as exc:
            detail = bounded_text(exc.error.message, _MESSAGE_CHARS, marker=TRUNCATION_MARKER)
            text = f"tool {call.name!r}: MCP error {exc.error.code} ({detail})"
            if exc.error.code in _REFUSED:
                return Failure(f"{text}; the server refused the call")
            return self._unclear(text, mutating, label)
        except Exception as exc:  # noqa: BLE001 - SDK, transport and validation errors alike
            return self._unclear(
                f"tool {call.name!r} failed ({type(exc).__name__})", mutating, label
            )
        limit = self._limits.max_observation_bytes
        if isinstance(result, mcp_types.CallToolResult):
            observation = render_result(result, limit)
            return Failure(observation) if result.is_error else Success(observation)
        kind = (
            "asked for input"
            if isinstance(result, mcp_types.InputRequiredResult)
            else (f"returned a {type(result).__name__}")
        )
        return self._unclear(
            f"tool {call.name!r} {kind}, which this client does not handle", mutating, label
        )

    @staticmethod
    def _unclear(text: str, mutating: bool, label: str) -> ToolOutcome:
        logger.warning("MCP server %r: %s", label, text)
        return Ambiguous(f"{text}; {_UNCLEAR}") if mutating else Failure(text)


class McpToolset:
    """Tools from MCP servers, open for as long as the ``async with`` block runs.

    ::

        async with McpToolset([McpServer.stdio("world", "world-mcp")]) as toolset:
            loop = ToolLoop(client, toolset.tools, toolset.executor, config=config)
            result = await loop.run(goal, generation=generation)

    Entering starts every server and lists its tools (each within
    ``limits.startup_timeout_s``; :class:`ConnectError` if one cannot be started), checks
    every tool as the loop will (``config``: the loop's :class:`ToolLoopConfig`), leaves out
    and logs the ones that fail (:attr:`skipped`), and raises
    :class:`ToolDefinitionError` when two tools end up with one name, and
    :class:`ConfigError` when a server's ``effects``, ``allow_tools`` or ``block_tools`` names
    a tool that server does not list (each, with the nearest listed name). Leaving stops every
    connection, and every stdio server's process.
    """

    def __init__(
        self,
        servers: Sequence[McpServer],
        *,
        config: ToolLoopConfig | None = None,
        limits: McpLimits | None = None,
    ) -> None:
        self._servers = tuple(servers)
        for server in self._servers:
            if not isinstance(server, McpServer):
                raise TypeError(f"servers must be McpServer values, got {type(server).__name__}")
        labels = [server.label for server in self._servers]
        if len(set(labels)) != len(labels):
            raise ValueError("every MCP server needs a label of its own")
        self._config = ToolLoopConfig() if config is None else config
        self._limits = McpLimits() if limits is None else limits
        self._connections: list[_Connection] = []
        self._tools: tuple[Tool, ...] = ()
        self._skipped: tuple[SkippedTool, ...] = ()
        # An executor is built only here (its constructor refuses): the private route map.
        self._executor = McpExecutor._over(MappingProxyType({}), self._limits)  # noqa: SLF001
        self._entered = False

    @property
    def tools(self) -> tuple[Tool, ...]:
        """The tools to give the loop, in server order, then each server's order."""
        return self._tools

    @property
    def skipped(self) -> tuple[SkippedTool, ...]:
        """The tools left out, and why (each was also logged)."""
        return self._skipped

    @property
    def executor(self) -> McpExecutor:
        """The executor that calls :attr:`tools`."""
        return self._executor

    async def __aenter__(self) -> McpToolset:
        if self._entered:
            raise RuntimeError("an McpToolset can be entered once")
        self._entered = True
        try:
            listings: list[tuple[_Connection, Listing]] = []
            for server in self._servers:
                timeout = server.tool_timeout_s or self._config.tool_timeout_s
                connection = _Connection(server, self._limits, timeout)
                self._connections.append(connection)
                listings.append((connection, await connection.start()))
            self._build(listings)
        except BaseException:
            await self.aclose()
            raise
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Stop every connection (in reverse order of starting); idempotent."""
        connections, self._connections = self._connections, []
        for connection in reversed(connections):
            await connection.close()

    def _build(self, listings: list[tuple[_Connection, Listing]]) -> None:
        tools: list[Tool] = []
        routes: dict[str, _Route] = {}
        owners: dict[str, str] = {}
        skipped: list[SkippedTool] = []
        clashes: list[str] = []
        typos = [
            problem
            for connection, listing in listings
            for problem in policy_problems(
                connection.server.label,
                listing,
                {
                    "effects": connection.server.effects,
                    "allow_tools": connection.server.allow_tools or (),
                    "block_tools": connection.server.block_tools,
                },
            )
        ]
        if typos:
            raise ConfigError(typos)
        for connection, listing in listings:
            server = connection.server
            # The filter comes first: a tool the operator left out is reported as such (not
            # logged), whatever else is wrong with it, and never counts against max_tools.
            for name, reason in listing.rejected:
                unwanted = server.filtered_out(name)
                skipped.append(SkippedTool(server.label, name, unwanted or reason))
                if unwanted is None:
                    logger.warning(
                        "MCP server %r: tool %r left out: %s", server.label, name, reason
                    )
            wanted: list[tuple[mcp_types.Tool, Mapping[str, Any]]] = []
            for remote, raw in listing.tools:
                unwanted = server.filtered_out(remote.name)
                if unwanted is None:
                    wanted.append((remote, raw))
                else:
                    skipped.append(
                        SkippedTool(server.label, (server.prefix + remote.name)[:64], unwanted)
                    )
            counts = Counter(remote.name for remote, _ in wanted)
            twice = sorted(name for name, count in counts.items() if count > 1)
            if twice:
                raise ToolDefinitionError(
                    f"MCP server {server.label!r} lists tool {twice[0][:64]!r} more than once, "
                    "so a call by that name could reach either definition; fix the server's "
                    "listing, or leave the tool out with the server's block_tools="
                )
            for remote, raw in wanted:
                tool = self._tool(server, remote, raw)
                try:
                    ToolRegistry.build([tool], self._config)
                except ToolDefinitionError as exc:
                    reason = str(exc)
                    skipped.append(SkippedTool(server.label, tool.name[:64], reason))
                    logger.warning(
                        "MCP server %r: tool %r left out: %s", server.label, tool.name[:64], reason
                    )
                    continue
                if tool.name in owners:
                    clashes.append(
                        f"tool {tool.name!r} is offered by MCP servers {owners[tool.name]!r} "
                        f"and {server.label!r}"
                    )
                    continue
                owners[tool.name] = server.label
                routes[tool.name] = _Route(connection, remote.name)
                tools.append(tool)
        if clashes:
            raise ToolDefinitionError(
                "tool names collide between MCP servers: "
                + "; ".join(clashes[:20])
                + "; give one of the servers a prefix"
            )
        ToolRegistry.build(tools, self._config)  # the whole set: max_tools and the like
        self._tools = tuple(tools)
        self._skipped = tuple(skipped)
        self._executor = McpExecutor._over(MappingProxyType(routes), self._limits)  # noqa: SLF001

    @staticmethod
    def _tool(server: McpServer, remote: mcp_types.Tool, raw: Mapping[str, Any]) -> Tool:
        effect = server.effects.get(remote.name)
        if effect is None:
            # The raw annotation, not the model's field: the model coerces "yes" and 1 to
            # True, and only a JSON true makes a tool read-only.
            hints = raw.get("annotations")
            read_only = isinstance(hints, dict) and hints.get("readOnlyHint") is True
            effect = Effect.READ_ONLY if read_only else Effect.MUTATING
        schema: Any = remote.input_schema
        return Tool(
            name=server.prefix + remote.name,
            description=remote.description or "",
            parameters=schema,
            effect=effect,
            timeout_s=server.tool_timeout_s,
        )
