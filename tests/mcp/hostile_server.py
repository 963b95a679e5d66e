"""A hand-written MCP server over stdio that misbehaves on purpose, one way per mode.

Run as ``python -m tests.mcp.hostile_server MODE [ARG]``. It speaks newline-delimited
JSON-RPC without the SDK, so it can send what the SDK's server side never would. It answers
``initialize`` (echoing the client's protocol version), refuses ``server/discover`` as an
unknown method, and answers ``tools/list`` and ``tools/call`` as the mode says:

* ``coerced``: tools whose ``readOnlyHint`` is ``true``, ``"yes"`` and ``1``, and ``ok``.
* ``hints``: those, one whose ``readOnlyHint`` is ``"maybe"``, one whose ``inputSchema`` is
  ``{"type": "string"}``, and ``ok``.
* ``surrogate``: ``ok`` answers a text holding a lone surrogate.
* ``duplicate``: ``ok`` is listed twice.
* ``no_discover``: ``server/discover`` is never answered (nor refused).
* ``helper``: starts a helper process that sleeps, writes its pid to ``ARG``.
* ``stubborn``: ignores SIGTERM and never answers anything.
* ``big``: ``ok`` answers a text of ``ARG`` bytes.
* ``record``: writes the parameters of ``initialize`` to ``ARG`` as JSON.
* ``stderr``: writes ``ARG`` and an over-long line to stderr before serving.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

_OBJECT: dict[str, Any] = {"type": "object", "properties": {}, "additionalProperties": False}


def _tool(name: str, annotations: dict[str, Any] | None = None, schema: Any = None) -> Any:
    tool: dict[str, Any] = {"name": name, "description": name, "inputSchema": schema or _OBJECT}
    if annotations is not None:
        tool["annotations"] = annotations
    return tool


def _tools(mode: str) -> list[Any]:
    coerced = [
        _tool("ro_true", {"readOnlyHint": True}),
        _tool("ro_yes", {"readOnlyHint": "yes"}),
        _tool("ro_one", {"readOnlyHint": 1}),
    ]
    if mode == "coerced":
        return [*coerced, _tool("ok")]
    if mode == "hints":
        return [
            *coerced,
            _tool("ro_maybe", {"readOnlyHint": "maybe"}),
            _tool("string_schema", schema={"type": "string"}),
            _tool("ok"),
        ]
    if mode == "duplicate":
        return [_tool("ok"), _tool("ok")]
    return [_tool("ok")]


def _send(message: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


def main() -> None:
    """Serve stdin until it closes."""
    mode = sys.argv[1]
    arg = sys.argv[2] if len(sys.argv) > 2 else ""
    if mode == "stubborn":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        while True:
            time.sleep(1)
    if mode == "stderr":
        sys.stderr.write(f"starting with {arg}\n" + "y" * 100_000 + "\n")
        sys.stderr.flush()
    if mode == "helper":
        helper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        Path(arg).write_text(str(helper.pid), encoding="utf-8")
    for line in sys.stdin:
        message = json.loads(line)
        method, ident = message.get("method"), message.get("id")
        if ident is None:
            continue
        if method == "initialize":
            version = message["params"]["protocolVersion"]
            if mode == "record":
                Path(arg).write_text(json.dumps(message["params"]), "utf-8")
            result: Any = {
                "protocolVersion": version,
                "capabilities": {"tools": {}},
                "serverInfo": {"name": "hostile", "version": "0"},
            }
        elif method == "server/discover":
            if mode == "no_discover":
                continue
            _send({"jsonrpc": "2.0", "id": ident, "error": {"code": -32601, "message": "no"}})
            continue
        elif method == "tools/list":
            result = {"tools": _tools(mode)}
        elif method == "tools/call":
            text = "x" * int(arg) if mode == "big" else "fine"
            if mode == "surrogate":
                text = "bad \ud800 text"
            result = {"content": [{"type": "text", "text": text}]}
        else:
            result = {}
        _send({"jsonrpc": "2.0", "id": ident, "result": result})


if __name__ == "__main__":
    main()
