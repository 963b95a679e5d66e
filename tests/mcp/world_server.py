"""A small MCP server for the adapter's tests, written with the SDK's server side.

Run as ``python -m tests.mcp.world_server stdio LOG`` (over stdin/stdout) or
``python -m tests.mcp.world_server http LOG`` (streamable HTTP on a loopback port it
prints as ``PORT <n>`` on stdout). ``LOG`` is a file the server appends one line to for
every event the tests look at: ``start <tool> <arguments>``, ``done <tool>``,
``cancelled <tool>``.

Tools: ``look`` (read-only), ``move`` (mutating: no annotation), ``say`` (mutating:
``readOnlyHint: false``), ``remote_ref`` (a schema with a remote ``$ref``) and
``bad_schema`` (invalid against its meta-schema), both to be left out, ``bad_name.v2`` (a
name outside the loop's alphabet), ``fail`` (read-only, answers ``isError``), ``crash``
(mutating: the process dies mid-call), ``hang`` (mutating) and ``stare`` (read-only),
which never answer until cancelled, ``picture`` (read-only, image content only) and
``panorama`` (read-only, a text of some 300 KB).
"""

from __future__ import annotations

import json
import os
import socket
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
import mcp_types as types
from mcp.server.lowlevel import Server
from mcp.server.stdio import stdio_server

if TYPE_CHECKING:
    from mcp.server.context import ServerRequestContext

_OBJECT: dict[str, Any] = {"type": "object", "properties": {}, "additionalProperties": False}
_POINT: dict[str, Any] = {
    "type": "object",
    "properties": {
        "x": {"type": "number", "minimum": 0, "maximum": 256},
        "y": {"type": "number", "minimum": 0, "maximum": 256},
    },
    "required": ["x", "y"],
    "additionalProperties": False,
}
READ_ONLY = types.ToolAnnotations(read_only_hint=True)
#: ``panorama`` answers this many words: well over the tests' small response bound.
PANORAMA_REPEAT = 40_000

TOOLS = [
    types.Tool(
        name="look",
        description="Describe what the avatar sees.",
        input_schema=_OBJECT,
        annotations=READ_ONLY,
    ),
    types.Tool(name="move", description="Walk to (x, y).", input_schema=_POINT),
    types.Tool(
        name="say",
        description="Say something aloud.",
        input_schema={
            "type": "object",
            "properties": {"text": {"type": "string", "maxLength": 200}},
            "required": ["text"],
        },
        annotations=types.ToolAnnotations(read_only_hint=False),
    ),
    types.Tool(
        name="remote_ref",
        description="A schema that points at the network.",
        input_schema={
            "type": "object",
            "properties": {"where": {"$ref": "https://schemas.invalid/where.json"}},
        },
        annotations=READ_ONLY,
    ),
    types.Tool(
        name="bad_schema",
        description="A schema its meta-schema rejects.",
        input_schema={"type": "object", "properties": {"x": {"type": "nonsense"}}},
    ),
    types.Tool(name="bad_name.v2", description="A dotted name.", input_schema=_OBJECT),
    types.Tool(
        name="fail", description="Always fails.", input_schema=_OBJECT, annotations=READ_ONLY
    ),
    types.Tool(name="crash", description="Kills the server.", input_schema=_OBJECT),
    types.Tool(name="hang", description="Never answers.", input_schema=_OBJECT),
    types.Tool(
        name="stare",
        description="Never answers, read-only.",
        input_schema=_OBJECT,
        annotations=READ_ONLY,
    ),
    types.Tool(
        name="picture",
        description="An image of the view.",
        input_schema=_OBJECT,
        annotations=READ_ONLY,
    ),
    types.Tool(
        name="panorama",
        description="A very long description of the view.",
        input_schema=_OBJECT,
        annotations=READ_ONLY,
    ),
]


def _log(line: str) -> None:
    with Path(sys.argv[2]).open("a", encoding="utf-8") as log:
        log.write(line + "\n")
        log.flush()
        os.fsync(log.fileno())


def _text(text: str, *, error: bool = False) -> types.CallToolResult:
    return types.CallToolResult(content=[types.TextContent(text=text)], is_error=error)


async def list_tools(
    ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
) -> types.ListToolsResult:
    """Every tool, in one page."""
    return types.ListToolsResult(tools=TOOLS)


async def call_tool(
    ctx: ServerRequestContext[Any], params: types.CallToolRequestParams
) -> types.CallToolResult:
    """Run one tool; every call is logged before it does anything."""
    name, arguments = params.name, params.arguments or {}
    _log(f"start {name} {json.dumps(arguments, sort_keys=True)}")
    try:
        if name == "look":
            return _text("a fountain, two benches and a cat")
        if name == "move":
            return _text(f"moved to ({arguments['x']}, {arguments['y']})")
        if name == "say":
            return _text(f"said {arguments['text']!r}")
        if name == "fail":
            return _text("the lamp is out of reach", error=True)
        if name == "crash":
            os._exit(3)
        if name in ("hang", "stare"):
            await anyio.sleep_forever()
        if name == "picture":
            return types.CallToolResult(
                content=[types.ImageContent(data="iVBORw0KGgo=" * 100, mime_type="image/png")]
            )
        if name == "panorama":
            return _text("a bench " * PANORAMA_REPEAT)
        return _text(f"unknown tool {name}", error=True)
    except anyio.get_cancelled_exc_class():
        _log(f"cancelled {name}")
        raise
    finally:
        _log(f"done {name}")


def build() -> Server[Any]:
    """The server with its two handlers."""
    return Server("test-world", on_list_tools=list_tools, on_call_tool=call_tool)


async def serve_stdio() -> None:
    """Serve one connection over stdin/stdout."""
    server = build()
    async with stdio_server() as (read, write):
        await server.run(read, write, server.create_initialization_options())


def serve_http() -> None:
    """Serve streamable HTTP on a loopback port; print it for the test to read."""
    import uvicorn

    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    port = listener.getsockname()[1]
    app = build().streamable_http_app(host="127.0.0.1")
    config = uvicorn.Config(app, log_level="warning", lifespan="on")
    sys.stdout.write(f"PORT {port}\n")
    sys.stdout.flush()
    uvicorn.Server(config).run(sockets=[listener])


if __name__ == "__main__":
    if sys.argv[1] == "stdio":
        anyio.run(serve_stdio)
    else:
        serve_http()
