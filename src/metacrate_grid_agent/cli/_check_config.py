"""``grid-agent check-config``: validate a configuration file, show the effective settings.

::

    grid-agent check-config (FILE | --config FILE) [--start-servers] [--json]

A valid file: every effective setting (defaults included) with the key redacted, where the
key came from, the configuration's warnings, and each ``[mcp.servers.NAME]`` table with its
secrets redacted (no server is started unless ``--start-servers``: then each server's tools
are listed as ``grid-agent tools`` lists them, and a server that does not start is exit 1);
exit 0. An invalid one: every problem,
each with its key path, on stderr (or in the JSON object); exit 2.
"""

from __future__ import annotations

import argparse
import asyncio
from typing import Any, Final

from metacrate_grid_agent.cli import _output as output
from metacrate_grid_agent.cli._common import (
    EXIT_FAILURE,
    EXIT_OK,
    EXIT_USAGE,
    UsageError,
    usage_failure,
)
from metacrate_grid_agent.cli._config import config_warnings, load_agent_config
from metacrate_grid_agent.cli._output import Console
from metacrate_grid_agent.cli._tools import collect, tools_report
from metacrate_grid_agent.config import LLM_SETTINGS, TOOL_LOOP_SETTINGS, shown_url
from metacrate_grid_agent.errors import ConfigError

__all__ = ["cmd_check_config"]

#: What check-config says under the MCP servers it read: it starts none of them.
NOT_STARTED: Final = (
    "# MCP servers are read, not started: --start-servers (or `grid-agent tools FILE`) "
    "starts them and lists their tools"
)
#: What check-config says when the file allows cleartext http.
INSECURE_HTTP_WARNING: Final = (
    "allow_insecure_http = true: to a non-loopback http endpoint the key travels "
    "unencrypted; prefer https"
)


def cmd_check_config(args: argparse.Namespace, console: Console) -> int:
    """``grid-agent check-config``: report the effective settings or every problem."""
    if (args.file is None) == (args.config_option is None):
        return usage_failure(
            console, args, "name one configuration file: check-config FILE or --config FILE"
        )
    path = args.file if args.file is not None else args.config_option
    try:
        with config_warnings() as shown:
            config = load_agent_config(path, console.redactor)
    except ConfigError as exc:
        problems = [{"key": p.key, "problem": p.problem} for p in exc.problems]
        if args.json:
            console.json({"valid": False, "file": path, "problems": problems})
        else:
            count = len(problems)
            console.err(f"{path}: invalid configuration ({count} problem{'s' * (count != 1)})")
            console.err(*(f"  {output.printable(p['key'])}: {output.printable(p['problem'])}"
                          for p in problems))  # fmt: skip
        return EXIT_USAGE
    llm, tool_loop = config.llm.to_redacted_dict(), config.tool_loop.to_dict()
    source = config.llm.api_key.origin or "unknown"
    warnings = [*shown, *([INSECURE_HTTP_WARNING] if config.llm.allow_insecure_http else [])]
    if config.llm.allow_insecure_http:
        console.err(f"grid-agent check-config: warning: {INSECURE_HTTP_WARNING}")
    servers = {s.name: s.to_redacted_dict(shown_url) for s in config.mcp_servers}
    started: dict[str, Any] | None = None
    if args.start_servers and config.mcp_servers:
        try:
            started = asyncio.run(collect(config.mcp_servers, config.tool_loop))
        except UsageError as exc:
            return usage_failure(console, args, str(exc))
    status = EXIT_OK if started is None or started["ok"] else EXIT_FAILURE
    if args.json:
        console.json(
            {
                "valid": True,
                "file": path,
                "api_key_source": source,
                "warnings": warnings,
                "llm": llm,
                "tool_loop": tool_loop,
                "mcp_servers": servers,
                **({} if started is None else {"mcp_tools": started}),
            }
        )
        return status
    console.out(
        f"{path}: valid configuration (effective settings; the key is redacted)",
        f"key from: {output.printable(source)}",
        "",
        "[llm]",
        *output.setting_lines(llm, LLM_SETTINGS),
        "",
        "[tool_loop]",
        *output.setting_lines(tool_loop, TOOL_LOOP_SETTINGS),
    )
    for name, table in servers.items():
        console.out("", *output.mcp_server_lines(name, table))
    if started is None and servers:
        console.out("", NOT_STARTED)
    elif started is not None and started["ok"]:
        console.out("", "# the MCP servers, started and listed:", *tools_report(started))
    elif started is not None:
        console.err(f"grid-agent check-config: {started['error']['message']}")
    return status
