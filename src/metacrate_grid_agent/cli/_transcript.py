"""The transcript side of ``grid-agent``: ``replay``, ``report`` and the ``--transcript`` sink.

::

    grid-agent replay TRANSCRIPT [--config FILE] [--json]
    grid-agent report TRANSCRIPT [--html FILE] [--json]

``replay`` exits 0 when today's library decides as the recording did, 1 when a decision
differs, 2 when the transcript (or the config) cannot be used. ``report`` prints the
timeline; with ``--html FILE`` it also writes one self-contained HTML page (mode 0600, never
through a symbolic link). Like the rest of the command, this module uses only the public API:
:mod:`metacrate_grid_agent.transcript`, and the file rules of :mod:`metacrate_grid_agent.safety`.
"""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import Mapping, Sequence
from typing import IO, Any, Final

from metacrate_grid_agent import LLMConfig, LoopEvent, Message, Tool, ToolLoopConfig
from metacrate_grid_agent.cli._common import EXIT_OK, EXIT_USAGE
from metacrate_grid_agent.cli._config import read_config_document
from metacrate_grid_agent.cli._output import Console, Redactor
from metacrate_grid_agent.errors import ConfigError
from metacrate_grid_agent.safety import open_private
from metacrate_grid_agent.transcript import (
    Transcript,
    TranscriptError,
    TranscriptWriter,
    load,
    replay,
    report,
    report_data,
    report_html,
)

__all__ = ["CLITranscript", "add_commands"]

#: ``replay``: a decision differs from the recording's.
EXIT_DIFFERENT: Final = 1


def add_commands(commands: Any) -> None:
    """Add ``replay`` and ``report`` to the command's sub-parsers."""
    rerun = commands.add_parser(
        "replay",
        allow_abbrev=False,
        help="re-run a recorded session's model side and report changed decisions",
        description="Serve the recorded replies from a loopback fake endpoint, return the "
        "recorded observations, and report every decision the library now makes differently "
        "(exit 0: none, 1: some, 2: unusable transcript). Nothing is executed.",
    )
    rerun.add_argument("transcript", metavar="TRANSCRIPT", help="a --transcript JSON-lines file")
    rerun.add_argument(
        "--config", metavar="FILE", help="TOML file whose [tool_loop] table replaces the recorded"
    )
    rerun.add_argument("--json", action="store_true", help="print one JSON object")
    rerun.set_defaults(handler=_cmd_replay, verbose=False)

    show = commands.add_parser(
        "report",
        allow_abbrev=False,
        help="print a recorded session's timeline (and write it as HTML)",
        description="Turns, requests, calls, latencies, tokens, and where the session ended "
        "and why. --html writes one self-contained page (no script, nothing loaded).",
    )
    show.add_argument("transcript", metavar="TRANSCRIPT", help="a --transcript JSON-lines file")
    show.add_argument("--html", metavar="FILE", help="also write the timeline as HTML here")
    show.add_argument(
        "--json", action="store_true", help="print one JSON object: summary, notes, timeline"
    )
    show.set_defaults(handler=_cmd_report, verbose=False)


def _read(args: argparse.Namespace) -> Transcript:
    return load(args.transcript)


def _tool_loop_config(path: str) -> ToolLoopConfig:
    """The ``[tool_loop]`` table of the configuration file at ``path``, read as ``run`` reads
    its configuration (a regular file, refused whole over the size bound)."""
    table = read_config_document(path).get("tool_loop", {})
    if not isinstance(table, dict):
        raise TranscriptError(f"config {path!r}: [tool_loop] must be a table")
    return ToolLoopConfig.from_mapping(table)


def _cmd_replay(args: argparse.Namespace, console: Console) -> int:
    try:
        transcript = _read(args)
        config = None if args.config is None else _tool_loop_config(args.config)
        found = asyncio.run(replay(transcript, config=config))
    except ConfigError as exc:
        return _fail(console, args, exc.message)
    except TranscriptError as exc:
        return _fail(console, args, str(exc))
    if args.json:
        console.json(
            {
                "same": found.same,
                "outcome": None if found.result is None else found.result.outcome.value,
                "differences": [
                    {"where": d.where, "recorded": d.recorded, "replayed": d.replayed}
                    for d in found.differences
                ],
                "notes": list(found.notes),
            }
        )
    else:
        console.out(*found.lines())
    return EXIT_OK if found.same else EXIT_DIFFERENT


def _cmd_report(args: argparse.Namespace, console: Console) -> int:
    try:
        transcript = _read(args)
    except TranscriptError as exc:
        return _fail(console, args, str(exc))
    if args.html is not None:
        try:
            with open_private(args.html) as page:
                page.write(report_html(transcript))
        except OSError as exc:
            return _fail(console, args, f"cannot write {args.html!r}: {exc.strerror or exc}")
    if args.json:
        console.json(report_data(transcript))
    else:
        console.out(*report(transcript))
    return EXIT_OK


def _fail(console: Console, args: argparse.Namespace, message: str) -> int:
    if getattr(args, "json", False):
        console.json({"outcome": "error", "kind": "transcript", "message": message[:500]})
    else:
        console.err(f"grid-agent {args.command}: error: {message[:500]}")
    return EXIT_USAGE


class CLITranscript:
    """``--transcript FILE`` of ``run``/``demo``: a :class:`TranscriptWriter` once begun.

    A no-op without a file. Each line also passes the command's :class:`Redactor`, like every
    other output of the command.
    """

    def __init__(self, stream: IO[str] | None, redactor: Redactor) -> None:
        self._stream = None if stream is None else _Scrubbed(stream, redactor)
        self._writer: TranscriptWriter | None = None

    @property
    def error(self) -> str | None:
        """Why the transcript stopped early, if it did."""
        return None if self._writer is None else self._writer.error

    def begin(
        self,
        *,
        llm: LLMConfig,
        scripted: bool,
        session_id: str,
        goal: str | Sequence[Message],
        tools: Sequence[Tool],
        config: ToolLoopConfig,
        system_prompt: str | None,
        servers: Mapping[str, str] | None = None,
    ) -> None:
        """Write the header (generation 0, as every CLI session).

        With MCP servers (``servers``: each tool's server), the labels say so and each
        tool's record names the server its calls go to.

        The scripted model's dummy key is no secret: redacting it would cut words such as
        "scripted" that happen to begin it.
        """
        if self._stream is None:
            return
        self._writer = TranscriptWriter(self._stream, secret=None if scripted else llm.api_key)
        self._writer.begin(
            session_id=session_id,
            generation=0,
            goal=goal,
            tools=tools,
            config=config,
            system_prompt=system_prompt,
            llm=llm,
            labels={
                "model": "scripted" if scripted else "endpoint",
                **({} if servers is None else {"tools": "mcp"}),
            },
            servers=servers,
        )

    def __call__(self, event: LoopEvent) -> None:
        """Write one event."""
        if self._writer is not None:
            self._writer(event)


class _Scrubbed:
    """A text stream whose every write passes the command's redactor first."""

    def __init__(self, stream: IO[str], redactor: Redactor) -> None:
        self._stream = stream
        self._redactor = redactor

    def write(self, text: str) -> int:
        return self._stream.write(self._redactor.scrub(text))

    def flush(self) -> None:
        self._stream.flush()
