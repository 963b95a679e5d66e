"""The ``grid-agent`` command line: probe an endpoint, run a sandbox session, check a config.

::

    grid-agent probe (--config FILE | --endpoint URL --api-key-env NAME) [--prompt TEXT|-]
                     [--tools FILE] [--sample-tool] [--image FILE] [--json] [--verbose]
    grid-agent run --goal TEXT|- [--config FILE | --endpoint URL --api-key-env NAME]
                   [--approve] [--json] [--transcript FILE] [--verbose] [--quiet]
    grid-agent demo [--json] [--transcript FILE] [--verbose]
    grid-agent check-config (FILE | --config FILE) [--json]
    grid-agent replay TRANSCRIPT [--config FILE] [--json]
    grid-agent report TRANSCRIPT [--html FILE]
    grid-agent --version

Exit status: 0 success (``run``/``demo``: outcome "completed"), 1 endpoint, response or
session failure, 2 usage or configuration error, 130 interrupted (Ctrl-C), 143 terminated
(SIGTERM).

The key is never taken on the command line (only from the environment or the config file)
and never printed: every output line is scrubbed by :class:`~._output.Redactor`. Ctrl-C
cancels the session's :class:`CancelToken` with reason "operator", SIGTERM with reason
"shutdown" (a second signal quits at once). On a terminal, a heartbeat on stderr
(:mod:`._heartbeat`) shows what a slow request waits for. Like any application, this
module uses only the public API of the package; the sandbox world and the scripted model
live in :mod:`._sandbox` and :mod:`._scripted_model`.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import dataclasses
import json
import logging
import os
import re
import signal
import sys
import tomllib
import traceback
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Final, NoReturn, TextIO

from metacrate_grid_agent import (
    AgentConfig,
    CancelToken,
    ImagePart,
    LLMClient,
    LLMConfig,
    LoopEvent,
    LoopResult,
    Message,
    Outcome,
    Secret,
    SessionGeneration,
    TextPart,
    ToolDefinition,
    ToolLoop,
    ToolLoopConfig,
    UserMessage,
    __version__,
)
from metacrate_grid_agent.cli import _output as output
from metacrate_grid_agent.cli._approve import NO_TERMINAL, TerminalApprover
from metacrate_grid_agent.cli._heartbeat import Heartbeat, color_allowed
from metacrate_grid_agent.cli._heartbeat import wanted as heartbeat_wanted
from metacrate_grid_agent.cli._output import Console, Redactor
from metacrate_grid_agent.cli._sandbox import SandboxWorld, build_sandbox
from metacrate_grid_agent.cli._scripted_model import respond
from metacrate_grid_agent.cli._transcript import CLITranscript, add_commands
from metacrate_grid_agent.config import (
    LLM_SETTINGS,
    MAX_CONFIG_FILE_BYTES,
    TOOL_LOOP_SETTINGS,
    shown_url,
)
from metacrate_grid_agent.errors import (
    ConfigError,
    ConfigProblem,
    GridAgentError,
    InvalidMessageError,
)
from metacrate_grid_agent.safety import open_private, read_regular
from metacrate_grid_agent.testing import FakeEndpoint

if TYPE_CHECKING:
    from _typeshed import SupportsWrite

__all__ = ["main"]

EXIT_OK: Final = 0
EXIT_FAILURE: Final = 1
EXIT_USAGE: Final = 2
EXIT_INTERRUPTED: Final = 130
#: 128 + SIGTERM, as a shell reports a process ended by it.
EXIT_TERMINATED: Final = 143

LOGGER_NAME: Final = "metacrate_grid_agent"
#: Reason given to the session's cancellation token on Ctrl-C.
OPERATOR: Final = "operator"
#: Reason given to the session's cancellation token on SIGTERM (a service manager stopping us).
SHUTDOWN: Final = "shutdown"
SESSION_ID: Final = "cli-session"
PROBE_CORRELATION_ID: Final = "grid-agent-probe"
DEFAULT_PROMPT: Final = "Reply with one short sentence."
SAMPLE_TOOL_PROMPT: Final = "What time is it? Call the get_time tool to find out."
DEMO_GOAL: Final = (
    "Look around the plaza, walk over to the sign, and greet whoever is nearby. "
    "Finish with a short summary of what you did."
)
SYSTEM_PROMPT: Final = (
    "You drive an avatar in a virtual-world region through the tools you are given. Act one "
    "step at a time, and finish with a short plain-text summary of what you did."
)
#: The dummy key of the built-in scripted endpoint (it checks nothing).
SCRIPTED_KEY: Final = "scripted-model-no-key"
#: Extra lifetime of the built-in fake endpoint beyond the session's own wall-clock bound.
SCRIPTED_ENDPOINT_MARGIN_S: Final = 30.0

#: Largest --tools file read: far above any real tool list.
MAX_TOOLS_FILE_BYTES: Final = 256 * 1024
#: Most tools accepted from a --tools file.
MAX_TOOLS: Final = 64
#: Largest --image file: base64 makes it a third larger, within the default prompt cap.
MAX_IMAGE_BYTES: Final = 2 * 1024 * 1024
#: Longest --prompt or --goal text.
MAX_PROMPT_CHARS: Final = 16 * 1024

_ENV_NAME: Final = re.compile(r"\A[A-Za-z_][A-Za-z0-9_]{0,127}\Z", re.ASCII)
_IMAGE_MAGIC: Final = (
    (b"\x89PNG\r\n\x1a\n", "png"),
    (b"\xff\xd8\xff", "jpeg"),
    (b"GIF87a", "gif"),
    (b"GIF89a", "gif"),
)
_SAMPLE_TOOL: Final = ToolDefinition.create(
    "get_time",
    "Return the current time of day in the grid, as HH:MM.",
    {"type": "object", "properties": {}, "additionalProperties": False},
)


#: The exit statuses, as ``--help`` lists them.
EXIT_STATUS_HELP: Final = """exit status:
  0    success (run, demo: the session completed)
  1    the endpoint, its response or the session failed
  2    usage or configuration error
  130  interrupted (Ctrl-C): cancelled with reason "operator"
  143  terminated (SIGTERM): cancelled with reason "shutdown"
"""


class _HelpFormatter(argparse.HelpFormatter):
    """Descriptions wrapped as usual; a text of several lines (the exit statuses) kept as is."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        if "\n" in text:
            return "".join(indent + line for line in text.splitlines(keepends=True))
        return super()._fill_text(text, width, indent)


class UsageError(Exception):
    """A problem with the command line or the files it names (exit status 2)."""


#: Command-line words at least this long are hidden in argparse's error messages.
MIN_HIDDEN_WORD: Final = 8


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


# --- argument parsing ----------------------------------------------------------------------


def build_parser(argv: Sequence[str] = ()) -> argparse.ArgumentParser:
    """The argument parser of ``grid-agent`` (``argv``: values to hide in its errors)."""
    parser = _Parser(
        prog="grid-agent",
        allow_abbrev=False,
        description="Probe a chat-completions endpoint, or run a grid-agent session in an "
        "in-memory sandbox region.",
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
    probe.set_defaults(handler=_cmd_probe)

    run = commands.add_parser(
        "run",
        allow_abbrev=False,
        parents=[common],
        help="run a tool-loop session in the in-memory sandbox region",
        description="Run one ToolLoop session toward GOAL in the in-memory sandbox region. "
        "Without --config or --endpoint, a built-in SCRIPTED model (not a real one) plays "
        "the model.",
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
    run.add_argument(
        "--approve",
        action="store_true",
        help="ask on the terminal before each mutating call runs (needs a terminal on stdin)",
    )
    run.set_defaults(handler=_cmd_run)

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
        handler=_cmd_demo,
        goal=DEMO_GOAL,
        config=None,
        endpoint=None,
        api_key_env=None,
        allow_insecure_http=False,
    )

    check = commands.add_parser(
        "check-config",
        allow_abbrev=False,
        epilog="exit status:\n  0    the configuration is valid\n"
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
    check.add_argument("--json", action="store_true", help="print one JSON object")
    check.set_defaults(handler=_cmd_check_config, verbose=False, quiet=False)
    add_commands(commands)  # replay, report
    for each in (parser, probe, run, demo, check):
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


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``grid-agent`` with ``argv`` (default: the process arguments); return the status."""
    words = list(sys.argv[1:] if argv is None else argv)
    args = build_parser(words).parse_args(words)
    redactor = Redactor()
    console = Console(redactor)
    _configure_logging(verbose=bool(args.verbose), redactor=redactor)
    _show_config_warnings(console, str(args.command), verbose=bool(args.verbose))
    try:
        status: int = args.handler(args, console)
    except KeyboardInterrupt:
        console.err("grid-agent: interrupted")
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        # The reader went away (``grid-agent ... | head``): nothing more can be said.
        with contextlib.suppress(OSError):
            sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - silence the flush at exit
        return EXIT_FAILURE
    except Exception as exc:  # noqa: BLE001 - a bug: shown like any output, then status 1
        _report_crash(console, exc)
        return EXIT_FAILURE
    return status


def _report_crash(console: Console, exc: Exception) -> None:
    """An unexpected exception's traceback, through the console like every other line (it may
    quote a value from a model, an endpoint or a file), indented under one line saying so."""
    text = console.redactor.scrub("".join(traceback.format_exception(exc)))
    console.err(
        "grid-agent: internal error (a bug: please report it with this traceback)",
        *(output.DETAIL_INDENT + line for line in text.rstrip("\n").split("\n")),
    )


def _configure_logging(*, verbose: bool, redactor: Redactor) -> None:
    logger = logging.getLogger(LOGGER_NAME)
    for old in [h for h in logger.handlers if isinstance(h, _CLIHandler | _CLINullHandler)]:
        logger.removeHandler(old)
    if verbose:
        handler: logging.Handler = _CLIHandler(sys.stderr)
        handler.setFormatter(output.RedactingFormatter(redactor))
        logger.setLevel(logging.DEBUG)
    else:
        # The CLI reports failures itself; keep Python's last-resort handler quiet.
        handler = _CLINullHandler()
    logger.addHandler(handler)


class _CLIHandler(logging.StreamHandler[TextIO]):
    """The --verbose handler (a class of its own, so it is found and replaced on re-entry)."""

    #: Called before each record is written (the heartbeat clears its status line there).
    before_emit: Callable[[], None] | None = None

    def emit(self, record: logging.LogRecord) -> None:
        """Clear the heartbeat's line, then write the record."""
        if self.before_emit is not None:
            self.before_emit()
        super().emit(record)


class _CLINullHandler(logging.NullHandler):
    """The quiet handler of a run without --verbose."""


#: The library's logger for warnings about a configuration that loaded (a shared key file).
CONFIG_LOGGER_NAME: Final = "metacrate_grid_agent.config"


def _show_config_warnings(console: Console, command: str, *, verbose: bool) -> None:
    """Print the configuration's warnings as the command's own lines (with --verbose, the
    log handler prints them already)."""
    logger = logging.getLogger(CONFIG_LOGGER_NAME)
    for old in [h for h in logger.handlers if isinstance(h, _WarningLines)]:
        logger.removeHandler(old)
    if not verbose:
        logger.addHandler(_WarningLines(console, command))


class _WarningLines(logging.Handler):
    """Writes each warning record as ``grid-agent COMMAND: warning: ...`` on stderr."""

    def __init__(self, console: Console, command: str) -> None:
        super().__init__(logging.WARNING)
        self._console = console
        self._command = command

    def emit(self, record: logging.LogRecord) -> None:
        """Write the record's message as a warning line."""
        message = output.printable(record.getMessage())
        self._console.err(f"grid-agent {self._command}: warning: {message}")


class _Collected(logging.Handler):
    """Keeps each warning record's message (for check-config's JSON)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        """Keep the record's message."""
        self.messages.append(record.getMessage())


@contextlib.contextmanager
def _config_warnings() -> Iterator[list[str]]:
    """The configuration's warnings given while the block runs."""
    collected = _Collected()
    logger = logging.getLogger(CONFIG_LOGGER_NAME)
    logger.addHandler(collected)
    try:
        yield collected.messages
    finally:
        logger.removeHandler(collected)


# --- shared helpers ------------------------------------------------------------------------


def _read_bounded(path: str, limit: int, what: str) -> bytes:
    try:
        data = read_regular(path, limit).data
    except OSError as exc:
        raise UsageError(f"cannot read {what} {path!r}: {exc.strerror or exc}") from None
    if len(data) > limit:
        raise UsageError(f"{what} {path!r} is larger than {limit} bytes")
    return data


def _text_arg(value: str) -> str:
    """The value of --prompt or --goal: the text itself, or stdin's text for ``-``."""
    if value != "-":
        return value
    try:
        return sys.stdin.read(MAX_PROMPT_CHARS + 1)
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"cannot read the text from stdin ({type(exc).__name__})") from None


def _check_text(text: str, what: str) -> str:
    if not text.strip():
        raise UsageError(f"{what} must not be empty")
    if len(text) > MAX_PROMPT_CHARS:
        raise UsageError(f"{what} is {len(text)} characters; the limit is {MAX_PROMPT_CHARS}")
    return text


def _read_config(path: str) -> dict[str, Any]:
    """The TOML document of the configuration file at ``path``, read and parsed once.

    Read as the library reads it (a regular file only, at most
    :data:`~metacrate_grid_agent.config.MAX_CONFIG_FILE_BYTES`); a file that cannot be read
    or parsed is reported in the words of :meth:`AgentConfig.from_toml`.
    """
    try:
        data = read_regular(path, MAX_CONFIG_FILE_BYTES).data
    except OSError as exc:
        raise ConfigError([ConfigProblem(path, f"cannot read: {exc.strerror}")]) from None
    if len(data) > MAX_CONFIG_FILE_BYTES:
        raise ConfigError([ConfigProblem(path, f"is larger than {MAX_CONFIG_FILE_BYTES} bytes")])
    try:
        return tomllib.loads(data.decode("utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError([ConfigProblem(path, f"is not valid TOML: {exc}")]) from None


def _config_secrets(document: Mapping[str, Any]) -> list[str]:
    """The key a configuration document names (inline or through the environment).

    Taken before validation: an invalid file may still hold a key worth hiding.
    """
    llm = document.get("llm")
    if not isinstance(llm, dict):
        return []
    found = []
    if isinstance(llm.get("api_key"), str):
        found.append(llm["api_key"])
    if isinstance(llm.get("api_key_env"), str):
        found.append(os.environ.get(llm["api_key_env"], ""))
    return found


def _load_agent_config(path: str, redactor: Redactor) -> AgentConfig:
    """The configuration file at ``path``, its secrets registered with ``redactor`` first:
    one read and one parse give both."""
    document = _read_config(path)
    for secret in _config_secrets(document):
        redactor.add(secret)
    config = AgentConfig.from_mapping(document, base_dir=Path(path).absolute().parent)
    redactor.add(config.llm.api_key.reveal())
    return config


#: Per signal: the cancellation reason, the exit status, and the words said on receipt.
_STOP_SIGNALS: Final = (
    (signal.SIGINT, OPERATOR, EXIT_INTERRUPTED, "interrupted", "press Ctrl-C again"),
    (signal.SIGTERM, SHUTDOWN, EXIT_TERMINATED, "terminated (SIGTERM)", "send it again"),
)


def _cancel_status(reason: str | None) -> int:
    """The exit status of a session or probe cancelled for ``reason``."""
    return EXIT_TERMINATED if reason == SHUTDOWN else EXIT_INTERRUPTED


@contextlib.contextmanager
def _operator_interrupts(cancel: CancelToken, console: Console) -> Iterator[None]:
    """While the block runs, Ctrl-C cancels ``cancel`` ("operator") and SIGTERM does the same
    with "shutdown"; a second signal of either kind quits at once."""
    loop = asyncio.get_running_loop()
    received = 0

    def on_signal(reason: str, status: int, what: str, again: str) -> None:
        nonlocal received
        received += 1
        if received == 1:
            console.err(f"grid-agent: {what}; cancelling ({again} to quit now)")
            cancel.cancel(reason)
        else:
            console.err(f"grid-agent: {what} again; quitting now")
            os._exit(status)

    installed = []
    for signum, reason, status, what, again in _STOP_SIGNALS:
        try:
            loop.add_signal_handler(signum, on_signal, reason, status, what, again)
            installed.append(signum)
        except (NotImplementedError, RuntimeError, ValueError):  # no signals (Windows, thread)
            pass
    try:
        yield
    finally:
        for signum in installed:
            loop.remove_signal_handler(signum)


def _heartbeat(args: argparse.Namespace, console: Console, config: LLMConfig) -> Heartbeat | None:
    """The heartbeat on stderr, when stderr is a terminal and --quiet was not given."""
    if not heartbeat_wanted(sys.stderr, quiet=bool(args.quiet)):
        return None
    beat = Heartbeat(
        sys.stderr,
        scrub=console.redactor.scrub,
        max_attempts=config.max_retries + 1,
        color=color_allowed(),
    )
    console.before_write = beat.clear
    for handler in logging.getLogger(LOGGER_NAME).handlers:
        if isinstance(handler, _CLIHandler):
            handler.before_emit = beat.clear
    return beat


@contextlib.asynccontextmanager
async def _beating(beat: Heartbeat | None) -> AsyncIterator[None]:
    """Keep ``beat`` redrawn while the block runs (nothing without one)."""
    if beat is None:
        yield
        return
    async with beat.running():
        yield


def _usage_failure(console: Console, args: argparse.Namespace, message: str) -> int:
    if getattr(args, "json", False):
        console.json(output.error_json("configuration", message))
    else:
        console.err(f"grid-agent {args.command}: error: {output.printable(message)}")
    return EXIT_USAGE


# --- probe ---------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class _ProbePlan:
    config: LLMConfig
    messages: tuple[Message, ...]
    tools: tuple[ToolDefinition, ...]
    sent_image: bool


def _probe_config(args: argparse.Namespace, redactor: Redactor) -> LLMConfig:
    if args.config is None and args.endpoint is None:
        raise UsageError("name the endpoint: --config FILE, or --endpoint URL --api-key-env NAME")
    config = _agent_config(args, redactor)
    assert config is not None  # noqa: S101 - one of the two sources was given
    return config.llm


def _agent_config(args: argparse.Namespace, redactor: Redactor) -> AgentConfig | None:
    """The configuration named by --config or by --endpoint and --api-key-env (or None)."""
    if args.config is not None:
        if args.api_key_env is not None or args.allow_insecure_http:
            raise UsageError(
                "--api-key-env and --allow-insecure-http go with --endpoint; a --config file "
                "names its own key and settings"
            )
        return _load_agent_config(args.config, redactor)
    if args.endpoint is None:
        if args.api_key_env is not None or args.allow_insecure_http:
            raise UsageError("--api-key-env and --allow-insecure-http go with --endpoint URL")
        return None
    return AgentConfig(llm=_endpoint_llm_config(args, redactor))


def _endpoint_llm_config(args: argparse.Namespace, redactor: Redactor) -> LLMConfig:
    """The [llm] settings of --endpoint URL --api-key-env NAME (defaults for the rest)."""
    if not args.api_key_env:
        raise UsageError(
            "--endpoint needs --api-key-env NAME (the environment variable holding the key; "
            "the key itself is never taken on the command line)"
        )
    if _ENV_NAME.match(args.api_key_env) is None:
        # Not echoed: a key pasted here by mistake must not be printed back.
        raise UsageError(
            "--api-key-env takes the NAME of an environment variable (letters, digits and "
            "underscores), not the key itself"
        )
    redactor.add(os.environ.get(args.api_key_env))
    table: dict[str, Any] = {"endpoint_url": args.endpoint, "api_key_env": args.api_key_env}
    if args.allow_insecure_http:
        table["allow_insecure_http"] = True
    config = LLMConfig.from_mapping(table)
    redactor.add(config.api_key.reveal())
    return config


def load_tools_file(path: str) -> tuple[ToolDefinition, ...]:
    """Tool definitions from a JSON array in the standard envelope; every problem reported."""
    data = _read_bounded(path, MAX_TOOLS_FILE_BYTES, "tools file")
    try:
        document = json.loads(data)
    except (ValueError, RecursionError) as exc:
        raise UsageError(f"tools file {path!r} is not valid JSON ({exc})") from None
    if not isinstance(document, list) or not document:
        raise UsageError(f"tools file {path!r} must hold a non-empty JSON array of tools")
    if len(document) > MAX_TOOLS:
        raise UsageError(f"tools file {path!r} has {len(document)} tools; the limit is {MAX_TOOLS}")
    problems: list[str] = []
    tools: list[ToolDefinition] = []
    for index, item in enumerate(document):
        where = f"[{index}]"
        if not isinstance(item, dict):
            problems.append(f"{where}: must be an object")
            continue
        problems += [
            f"{where}.{k}: unknown member" for k in sorted(set(item) - {"type", "function"})
        ]
        if item.get("type") != "function":
            problems.append(f'{where}.type: must be "function"')
        function = item.get("function")
        if not isinstance(function, dict):
            problems.append(f"{where}.function: must be an object")
            continue
        known = {"name", "description", "parameters"}
        problems += [f"{where}.function.{k}: unknown member" for k in sorted(set(function) - known)]
        name, description = function.get("name"), function.get("description", "")
        parameters = function.get("parameters", {"type": "object", "properties": {}})
        if not isinstance(name, str):
            problems.append(f"{where}.function.name: must be a string")
            continue
        if not isinstance(description, str):
            problems.append(f"{where}.function.description: must be a string")
            continue
        if not isinstance(parameters, dict):
            problems.append(f"{where}.function.parameters: must be a JSON object (a schema)")
            continue
        try:
            tools.append(ToolDefinition.create(name, description, parameters))
        except InvalidMessageError as exc:
            problems.append(f"{where}.function: {exc}")
    names = [t.name for t in tools]
    twice = sorted({n for n in names if names.count(n) > 1})
    problems += [f"tool name {n!r} appears twice" for n in twice]
    if problems:
        shown = "; ".join(problems[:10]) + ("; …" if len(problems) > 10 else "")
        raise UsageError(f"tools file {path!r} is invalid: {shown}")
    return tuple(tools)


def sniff_image(data: bytes) -> str | None:
    """The image type (png, jpeg, gif, webp) from the first bytes, or None."""
    for magic, kind in _IMAGE_MAGIC:
        if data.startswith(magic):
            return kind
    if len(data) >= 12 and data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "webp"
    return None


def load_image(path: str) -> ImagePart:
    """An image part carrying the file as a ``data:image/<type>;base64,...`` URL."""
    data = _read_bounded(path, MAX_IMAGE_BYTES, "image")
    kind = sniff_image(data)
    if kind is None:
        raise UsageError(f"image {path!r} is not a PNG, JPEG, GIF or WebP file (by its content)")
    encoded = base64.b64encode(data).decode("ascii")
    return ImagePart.of(f"data:image/{kind};base64,{encoded}")


def _plan_probe(args: argparse.Namespace, redactor: Redactor) -> _ProbePlan:
    config = _probe_config(args, redactor)
    tools: list[ToolDefinition] = []
    if args.tools is not None:
        tools.extend(load_tools_file(args.tools))
    if args.sample_tool:
        if any(t.name == _SAMPLE_TOOL.name for t in tools):
            raise UsageError(f"--sample-tool: the tools file already has {_SAMPLE_TOOL.name!r}")
        tools.append(_SAMPLE_TOOL)
    default = SAMPLE_TOOL_PROMPT if args.sample_tool else DEFAULT_PROMPT
    prompt = _check_text(default if args.prompt is None else _text_arg(args.prompt), "--prompt")
    message: UserMessage
    if args.image is not None:
        message = UserMessage(content=(TextPart(text=prompt), load_image(args.image)))
    else:
        message = UserMessage(content=prompt)
    return _ProbePlan(config, (message,), tuple(tools), sent_image=args.image is not None)


def _cmd_probe(args: argparse.Namespace, console: Console) -> int:
    try:
        plan = _plan_probe(args, console.redactor)
    except ConfigError as exc:
        return _usage_failure(console, args, exc.message)
    except UsageError as exc:
        return _usage_failure(console, args, str(exc))
    return asyncio.run(_probe(plan, args, console))


async def _probe(plan: _ProbePlan, args: argparse.Namespace, console: Console) -> int:
    cancel = CancelToken()
    beat = _heartbeat(args, console, plan.config)
    with _operator_interrupts(cancel, console):
        async with (
            LLMClient(
                plan.config,
                correlation_id=PROBE_CORRELATION_ID,
                on_progress=None if beat is None else beat.on_progress,
            ) as client,
            _beating(beat),
        ):
            request_id = client.next_request_id()
            summary = output.ProbeSummary(
                endpoint=shown_url(plan.config.endpoint_url),
                asked_tools=bool(plan.tools),
                sent_image=plan.sent_image,
                request_id=request_id,
            )
            try:
                completion = await client.complete(
                    plan.messages, plan.tools, request_id=request_id, cancel=cancel
                )
            except GridAgentError as exc:
                summary = dataclasses.replace(summary, error=exc)
            else:
                summary = dataclasses.replace(summary, completion=completion)
    if args.json:
        console.json(output.probe_json(summary))
    else:
        console.out(*output.probe_report(summary))
    if summary.error is None:
        return EXIT_OK
    return _cancel_status(cancel.reason) if cancel.cancelled else EXIT_FAILURE


# --- run and demo --------------------------------------------------------------------------


@dataclasses.dataclass(slots=True)
class _RunPlan:
    goal: str
    config: AgentConfig | None
    transcript: IO[str] | None


def _cmd_demo(args: argparse.Namespace, console: Console) -> int:
    return _cmd_run(args, console)


def _cmd_run(args: argparse.Namespace, console: Console) -> int:
    if getattr(args, "approve", False) and not sys.stdin.isatty():
        return _usage_failure(console, args, NO_TERMINAL)
    try:
        goal = _check_text(_text_arg(args.goal), "--goal")
        config = _agent_config(args, console.redactor)
        transcript = None
        if args.transcript is not None:
            try:
                transcript = open_private(args.transcript)
            except OSError as exc:
                raise UsageError(
                    f"cannot write transcript {args.transcript!r}: {exc.strerror or exc}"
                ) from None
    except ConfigError as exc:
        return _usage_failure(console, args, exc.message)
    except UsageError as exc:
        return _usage_failure(console, args, str(exc))
    try:
        return asyncio.run(_run(_RunPlan(goal, config, transcript), args, console))
    finally:
        if transcript is not None:
            transcript.close()


async def _run(plan: _RunPlan, args: argparse.Namespace, console: Console) -> int:
    cancel = CancelToken()
    writer = CLITranscript(plan.transcript, console.redactor)
    stats = output.SessionStats()
    tools, executor = build_sandbox()
    scripted = plan.config is None
    tool_loop_config = ToolLoopConfig() if plan.config is None else plan.config.tool_loop

    def on_event(event: LoopEvent) -> None:
        stats.observe(event)
        if not args.quiet:
            console.err(*output.progress_lines(event))
        writer(event)

    with _operator_interrupts(cancel, console):
        async with contextlib.AsyncExitStack() as stack:
            endpoint: FakeEndpoint | None = None
            if plan.config is None:
                endpoint = FakeEndpoint(
                    responder=respond,
                    lifetime_s=tool_loop_config.max_session_s + SCRIPTED_ENDPOINT_MARGIN_S,
                    strict=False,
                )
                await stack.enter_async_context(endpoint)
                llm = LLMConfig(endpoint_url=endpoint.url, api_key=Secret(SCRIPTED_KEY))
                console.err(
                    "grid-agent: using the built-in SCRIPTED model on a loopback fake endpoint "
                    f"({endpoint.url}): a fixed script, not a real language model"
                )
            else:
                llm = plan.config.llm
                console.err(f"grid-agent: model endpoint {shown_url(llm.endpoint_url)}")
            console.err(f"grid-agent: goal: {output.bounded(output.printable(plan.goal), 500)}")
            beat = _heartbeat(args, console, llm)
            client = await stack.enter_async_context(
                LLMClient(
                    llm,
                    correlation_id=SESSION_ID,
                    on_progress=None if beat is None else beat.on_progress,
                )
            )
            await stack.enter_async_context(_beating(beat))
            writer.begin(
                llm=llm,
                scripted=scripted,
                session_id=SESSION_ID,
                goal=plan.goal,
                tools=tools,
                config=tool_loop_config,
                system_prompt=SYSTEM_PROMPT,
            )
            try:
                approve = getattr(args, "approve", False)
                approver = TerminalApprover(console, sys.stdin) if approve else None
                loop = ToolLoop(
                    client,
                    tools,
                    executor,
                    config=tool_loop_config,
                    system_prompt=SYSTEM_PROMPT,
                    approver=approver,
                )
            except GridAgentError as exc:
                console.err(f"grid-agent: the sandbox tools were refused: {exc.kind}: {exc}")
                return EXIT_FAILURE
            result = await loop.run(
                plan.goal,
                generation=SessionGeneration(SESSION_ID),
                cancel=cancel,
                on_event=on_event,
            )
        if endpoint is not None and endpoint.failures:
            console.err(f"grid-agent: the built-in endpoint reported: {endpoint.failures[:5]}")
    if writer.error is not None:
        console.err(f"grid-agent: the transcript stopped early: {writer.error}")
    _print_result(console, result, stats, executor.world, scripted=scripted, as_json=args.json)
    if result.outcome is Outcome.COMPLETED:
        return EXIT_OK
    if result.outcome is Outcome.CANCELLED and result.cancel_reason in (OPERATOR, SHUTDOWN):
        return _cancel_status(result.cancel_reason)
    return EXIT_FAILURE


def _print_result(
    console: Console,
    result: LoopResult,
    stats: output.SessionStats,
    world: SandboxWorld,
    *,
    scripted: bool,
    as_json: bool,
) -> None:
    model = "scripted" if scripted else "endpoint"
    if as_json:
        console.json({**output.result_json(result, model=model), "world": output.world_json(world)})
    else:
        console.out(*output.run_report(result, stats, world, scripted=scripted))


# --- check-config --------------------------------------------------------------------------


#: What check-config says when the file allows cleartext http.
INSECURE_HTTP_WARNING: Final = (
    "allow_insecure_http = true: to a non-loopback http endpoint the key travels "
    "unencrypted; prefer https"
)


def _cmd_check_config(args: argparse.Namespace, console: Console) -> int:
    if (args.file is None) == (args.config_option is None):
        return _usage_failure(
            console, args, "name one configuration file: check-config FILE or --config FILE"
        )
    path = args.file if args.file is not None else args.config_option
    try:
        with _config_warnings() as shown:
            config = _load_agent_config(path, console.redactor)
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
    if args.json:
        console.json(
            {
                "valid": True,
                "file": path,
                "api_key_source": source,
                "warnings": warnings,
                "llm": llm,
                "tool_loop": tool_loop,
            }
        )
        return EXIT_OK
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
    return EXIT_OK
