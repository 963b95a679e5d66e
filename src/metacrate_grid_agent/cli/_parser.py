"""The arguments of ``grid-agent``: every command's options, its help, and its usage errors.

:func:`build_parser` builds the parser; each command's ``handler`` is the function of its
own module (:mod:`._probe`, :mod:`._run`, :mod:`._check_config`, :mod:`._transcript`). A usage
error exits with status 2 and never echoes a long command-line word (a key typed there by
mistake); every line argparse writes is escaped.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import TYPE_CHECKING, Final, NoReturn

from metacrate_grid_agent import __version__
from metacrate_grid_agent.cli import _output as output
from metacrate_grid_agent.cli._check_config import cmd_check_config
from metacrate_grid_agent.cli._probe import DEFAULT_PROMPT, cmd_probe
from metacrate_grid_agent.cli._run import DEMO_GOAL, cmd_demo, cmd_resume, cmd_run
from metacrate_grid_agent.cli._takeover import DATABASE_ENV, DEFAULT_QUEUE, cmd_takeover
from metacrate_grid_agent.cli._tools import cmd_tools
from metacrate_grid_agent.cli._transcript import add_commands

if TYPE_CHECKING:
    from _typeshed import SupportsWrite

__all__ = ["build_parser"]

#: The exit statuses, as ``--help`` lists them.
EXIT_STATUS_HELP: Final = """exit status:
  0    success (run, demo: the session completed; resume: every session resumed completed)
  1    the endpoint, its response or the session failed
  2    usage or configuration error
  130  interrupted (Ctrl-C): cancelled with reason "operator"
  143  terminated (SIGTERM): cancelled with reason "shutdown"
"""
#: The exit statuses of ``takeover``, as its ``--help`` lists them.
TAKEOVER_EXIT_STATUS_HELP: Final = """exit status:
  0    the pending sessions were handed over (or there were none)
  1    the system database failed (unreachable, not a DBOS system database, no such file)
  2    usage error (no database URL, the dbos extra not installed)
"""
#: Command-line words at least this long are hidden in argparse's error messages.
MIN_HIDDEN_WORD: Final = 8


class _HelpFormatter(argparse.HelpFormatter):
    """Descriptions wrapped as usual; a text of several lines (the exit statuses) kept as is."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        if "\n" in text:
            return "".join(indent + line for line in text.splitlines(keepends=True))
        return super()._fill_text(text, width, indent)


class _Parser(argparse.ArgumentParser):
    """An argument parser whose error messages never echo a long command-line value.

    A key typed on the command line (``--api-key sk-...``, which does not exist) must not
    come back in "unrecognized arguments: ...". Errors still exit with status 2.
    """

    _hide: tuple[str, ...] = ()

    def hide(self, words: Sequence[str]) -> None:
        """Hide these command-line words (the long ones) in error messages."""
        long_words = {w for w in words if len(w) >= MIN_HIDDEN_WORD}
        self._hide = tuple(sorted(long_words, key=len, reverse=True))

    def error(self, message: str) -> NoReturn:
        """Print usage and the message (long values hidden) to stderr; exit 2."""
        for word in self._hide:
            message = message.replace(word, "[hidden]")
        super().error(message)

    def _print_message(self, message: str, file: SupportsWrite[str] | None = None) -> None:
        """Write usage, help or an error with each line escaped: errors echo command words."""
        super()._print_message("\n".join(map(output.printable, message.split("\n"))), file)


def _words(argv: Sequence[str]) -> list[str]:
    """Every value on the command line, including those glued with ``=``."""
    words: list[str] = []
    for arg in argv:
        words.append(arg)
        if arg.startswith("-") and "=" in arg:
            words.append(arg.partition("=")[2])
    return [w for w in words if not (w.startswith("-") and "=" not in w)]


#: The help of --mcp-config (run, tools).
MCP_CONFIG_HELP: Final = (
    "MCP servers from a JSON file in the mcpServers form (Claude Desktop, VS Code's mcp.json), "
    "added to the configuration's [mcp.servers]"
)


def build_parser(argv: Sequence[str] = ()) -> argparse.ArgumentParser:
    """The argument parser of ``grid-agent`` (``argv``: values to hide in its errors)."""
    parser = _Parser(
        prog="grid-agent",
        allow_abbrev=False,
        description="Probe a chat-completions endpoint, or run a grid-agent session with "
        "MCP servers' tools or in an in-memory sandbox region.",
        epilog=EXIT_STATUS_HELP,
        formatter_class=_HelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"grid-agent {__version__}")
    commands = parser.add_subparsers(
        dest="command",
        required=True,
        metavar="COMMAND",
    )

    common = _Parser(add_help=False, allow_abbrev=False)
    common.add_argument(
        "--json", action="store_true", help="print exactly one JSON object on stdout"
    )
    common.add_argument(
        "-v", "--verbose", action="store_true", help="log the library's activity to stderr"
    )
    common.add_argument(
        "-q",
        "--quiet",
        action="store_true",
        help="no heartbeat and no progress lines on stderr (errors and warnings still shown)",
    )

    probe = commands.add_parser(
        "probe",
        allow_abbrev=False,
        parents=[common],
        epilog=EXIT_STATUS_HELP,
        formatter_class=_HelpFormatter,
        help="send one request to an endpoint and report what happened",
        description="Send one request through LLMClient and report the outcome, latency, "
        "attempts, usage, text, tool calls and what the endpoint showed it supports.",
    )
    _endpoint_arguments(probe, "TOML file with an [llm] table")
    probe.add_argument(
        "--prompt",
        metavar="TEXT",
        help=f"user message, or - to read it from stdin (default: {DEFAULT_PROMPT!r})",
    )
    probe.add_argument(
        "--tools", metavar="FILE", help="JSON array of tool definitions to offer the model"
    )
    probe.add_argument("--sample-tool", action="store_true", help="offer a built-in get_time tool")
    probe.add_argument(
        "--image", metavar="FILE", help="PNG, JPEG, GIF or WebP image to send with the prompt"
    )
    probe.set_defaults(handler=cmd_probe)

    run = commands.add_parser(
        "run",
        allow_abbrev=False,
        parents=[common],
        help="run a tool-loop session with MCP servers' tools, or in the sandbox region",
        description="Run one ToolLoop session toward GOAL with the tools of the "
        "configuration's [mcp.servers.NAME], or without any, in the in-memory sandbox "
        "region. Without --config or --endpoint, a built-in SCRIPTED model (not a real "
        "one) plays the model; with --model-script FILE, your own script does, for any "
        "tools.",
        epilog=EXIT_STATUS_HELP,
        formatter_class=_HelpFormatter,
    )
    run.add_argument(
        "--goal",
        required=True,
        metavar="TEXT",
        help="what the agent should do, or - to read it from stdin",
    )
    _endpoint_arguments(run, "TOML file with [llm] and optional [tool_loop] tables")
    run.add_argument("--transcript", metavar="FILE", help="write the session as JSON lines")
    run.add_argument("--mcp-config", metavar="FILE", help=MCP_CONFIG_HELP)
    run.add_argument(
        "--model-script",
        metavar="FILE",
        help='play the model from a JSON array of turns, each {"text": ...} or '
        '{"tool_calls": [{"name": ..., "arguments": {...}}]}, on a loopback endpoint: '
        "no key, no --endpoint; the configuration's [llm] table is not read",
    )
    run.add_argument(
        "--session-id",
        metavar="ID",
        help="the session's id in transcripts, request ids and traces: 1 to 64 letters, "
        "digits, '.', '_' or '-' (default: a new one per run)",
    )
    run.add_argument(
        "--approve",
        action="store_true",
        help="ask on the terminal before each mutating call runs (needs a terminal on stdin)",
    )
    run.add_argument(
        "--journal",
        metavar="DIR",
        help="make the session durable: journal it into DIR (resume it with grid-agent resume)",
    )
    run.set_defaults(handler=cmd_run)

    resume = commands.add_parser(
        "resume",
        allow_abbrev=False,
        parents=[common],
        help="resume the unfinished sessions journaled in DIR (run --journal DIR)",
        description="Resume every unfinished session journaled in DIR, or the one named by "
        "--session-id, with the same configuration and tools as the run that journaled it. "
        "A mutating call the crash cut while it ran is never run again: the session ends "
        "ambiguous_mutation naming it.",
        epilog=EXIT_STATUS_HELP,
        formatter_class=_HelpFormatter,
    )
    resume.add_argument("journal", metavar="DIR", help="the directory given to run --journal")
    resume.add_argument(
        "--session-id",
        metavar="ID",
        help="resume only this session's unfinished runs (or this run id)",
    )
    _endpoint_arguments(resume, "TOML file with [llm] and optional [tool_loop] tables")
    resume.add_argument(
        "--transcript", metavar="FILE", help="write the resumed session as JSON lines (one session)"
    )
    resume.add_argument("--mcp-config", metavar="FILE", help=MCP_CONFIG_HELP)
    resume.add_argument(
        "--approve",
        action="store_true",
        help="ask on the terminal before each mutating call runs (needs a terminal on stdin)",
    )
    resume.set_defaults(handler=cmd_resume)

    takeover = commands.add_parser(
        "takeover",
        allow_abbrev=False,
        epilog=TAKEOVER_EXIT_STATUS_HELP,
        formatter_class=_HelpFormatter,
        help="hand a dead executor's pending durable sessions (DBOS) to the live ones",
        description="Put the pending sessions of DBOS executor EXECUTOR_ID, and their pending "
        "approvals, back on their queue in the fleet's system database: a live executor of "
        "the same application version resumes each from its journal. A mutating call the "
        "dead executor was running is never run again (the session ends ambiguous_mutation). "
        "Safe if that executor is only stopped. Needs the dbos extra.",
    )
    takeover.add_argument(
        "executor_id", metavar="EXECUTOR_ID", help="the dead executor's id (dbos_config's)"
    )
    database = takeover.add_mutually_exclusive_group()
    database.add_argument(
        "--database",
        metavar="URL",
        help="the system database (postgresql://... or sqlite:///path); a password in it is "
        "visible to other users of the host while the command runs: prefer --database-env",
    )
    database.add_argument(
        "--database-env",
        metavar="NAME",
        help=f"environment variable holding the system database's URL (default: {DATABASE_ENV})",
    )
    takeover.add_argument(
        "--queue",
        metavar="NAME",
        default=DEFAULT_QUEUE,
        help=f"the sessions' queue (DurableSessions' queue=; default: {DEFAULT_QUEUE})",
    )
    takeover.add_argument("--json", action="store_true", help="print one JSON object")
    takeover.add_argument(
        "-v", "--verbose", action="store_true", help="show DBOS's log records (redacted)"
    )
    takeover.set_defaults(handler=cmd_takeover, quiet=False)

    demo = commands.add_parser(
        "demo",
        allow_abbrev=False,
        parents=[common],
        epilog=EXIT_STATUS_HELP,
        formatter_class=_HelpFormatter,
        help="run the built-in goal against the built-in scripted model",
        description="A sandbox session with a built-in goal, played by the built-in SCRIPTED "
        "model on a loopback fake endpoint. No network, no key, not a real model.",
    )
    demo.add_argument("--transcript", metavar="FILE", help="write the session as JSON lines")
    demo.set_defaults(
        handler=cmd_demo,
        goal=DEMO_GOAL,
        config=None,
        model_script=None,
        endpoint=None,
        api_key_env=None,
        allow_insecure_http=False,
    )

    check = commands.add_parser(
        "check-config",
        allow_abbrev=False,
        epilog="exit status:\n  0    the configuration is valid\n"
        "  1    an MCP server did not start (--start-servers)\n"
        "  2    usage error, or the configuration is invalid\n",
        formatter_class=_HelpFormatter,
        help="validate a configuration file and print the effective settings",
        description="Validate a configuration file. Prints the effective settings with the "
        "key redacted and where the key came from (exit 0), or every problem found, on "
        "stderr (exit 2).",
    )
    check.add_argument("file", metavar="FILE", nargs="?", help="TOML configuration file")
    check.add_argument(
        "--config", metavar="FILE", dest="config_option", help="the same, as an option"
    )
    check.add_argument(
        "--start-servers",
        action="store_true",
        help="also start the MCP servers and list their tools (otherwise none is started)",
    )
    check.add_argument("--json", action="store_true", help="print one JSON object")
    check.set_defaults(handler=cmd_check_config, verbose=False, quiet=False)
    tools = commands.add_parser(
        "tools",
        allow_abbrev=False,
        epilog="exit status:\n  0    every server started and listed its tools\n"
        "  1    a server did not start\n"
        "  2    usage error, or the configuration is invalid\n",
        formatter_class=_HelpFormatter,
        help="start the configured MCP servers and list their tools",
        description="Start every [mcp.servers.NAME] of the configuration, list each tool with "
        "its effect and why, whether run --approve asks before it, and the tools left out; "
        "then stop them. No tool is called.",
    )
    tools.add_argument("file", metavar="FILE", nargs="?", help="TOML configuration file")
    tools.add_argument(
        "--config", metavar="FILE", dest="config_option", help="the same, as an option"
    )
    tools.add_argument("--mcp-config", metavar="FILE", help=MCP_CONFIG_HELP)
    tools.add_argument("--json", action="store_true", help="print one JSON object")
    tools.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        help="log the library's activity to stderr (each server's stderr lines among it)",
    )
    tools.set_defaults(handler=cmd_tools, quiet=False)
    add_commands(commands)  # replay, report
    for each in (parser, probe, run, resume, takeover, demo, check, tools):
        each.hide(_words(argv))
    return parser


def _endpoint_arguments(parser: argparse.ArgumentParser, config_help: str) -> None:
    """--config FILE, or --endpoint URL with --api-key-env NAME (and --allow-insecure-http)."""
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--config", metavar="FILE", help=config_help)
    source.add_argument("--endpoint", metavar="URL", help="the complete chat-completions URL")
    parser.add_argument(
        "--api-key-env",
        metavar="NAME",
        help="environment variable holding the key (with --endpoint; never the key itself)",
    )
    parser.add_argument(
        "--allow-insecure-http",
        action="store_true",
        help="allow cleartext http to a non-loopback --endpoint (sends the key unencrypted)",
    )
