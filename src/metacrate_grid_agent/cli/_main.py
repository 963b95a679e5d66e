"""The ``grid-agent`` entry point: parse the arguments, set up the output, run one command.

Every line the command writes passes the :class:`Redactor` (the key is never printed) and
the library's escaping rule. A broken pipe ends the command quietly, Ctrl-C outside a
session with status 130, and an unexpected exception (a bug) is shown as a redacted,
escaped traceback with status 1.
"""

from __future__ import annotations

import contextlib
import os
import sys
import traceback
from collections.abc import Sequence

from metacrate_grid_agent.cli import _output as output
from metacrate_grid_agent.cli._common import EXIT_FAILURE, EXIT_INTERRUPTED
from metacrate_grid_agent.cli._config import show_config_warnings
from metacrate_grid_agent.cli._output import Console, Redactor
from metacrate_grid_agent.cli._parser import build_parser
from metacrate_grid_agent.cli._process import configure_logging

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``grid-agent`` with ``argv`` (default: the process arguments); return the status."""
    words = list(sys.argv[1:] if argv is None else argv)
    args = build_parser(words).parse_args(words)
    redactor = Redactor()
    console = Console(redactor)
    configure_logging(verbose=bool(args.verbose), redactor=redactor)
    show_config_warnings(console, str(args.command), verbose=bool(args.verbose))
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
