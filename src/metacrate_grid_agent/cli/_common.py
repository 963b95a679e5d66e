"""What every command of ``grid-agent`` shares: the exit statuses and usage errors.

A problem with the command line or a file it names is a :class:`UsageError`, reported by
:func:`usage_failure` (exit status 2) in the command's words, as a line on stderr or, with
``--json``, as one JSON object. ``--prompt`` and ``--goal`` take a text or ``-`` for stdin
(:func:`text_arg`), bounded by :func:`check_text`.
"""

from __future__ import annotations

import argparse
import sys
from typing import Final

from metacrate_grid_agent.cli import _output as output
from metacrate_grid_agent.cli._output import Console

__all__ = [
    "EXIT_FAILURE",
    "EXIT_INTERRUPTED",
    "EXIT_OK",
    "EXIT_TERMINATED",
    "EXIT_USAGE",
    "UsageError",
    "check_text",
    "text_arg",
    "usage_failure",
]

EXIT_OK: Final = 0
EXIT_FAILURE: Final = 1
EXIT_USAGE: Final = 2
EXIT_INTERRUPTED: Final = 130
#: 128 + SIGTERM, as a shell reports a process ended by it.
EXIT_TERMINATED: Final = 143
#: Longest --prompt or --goal text.
MAX_PROMPT_CHARS: Final = 16 * 1024


class UsageError(Exception):
    """A problem with the command line or the files it names (exit status 2)."""


def text_arg(value: str) -> str:
    """The value of --prompt or --goal: the text itself, or stdin's text for ``-``."""
    if value != "-":
        return value
    try:
        return sys.stdin.read(MAX_PROMPT_CHARS + 1)
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"cannot read the text from stdin ({type(exc).__name__})") from None


def check_text(text: str, what: str) -> str:
    """``text`` if it is neither blank nor longer than :data:`MAX_PROMPT_CHARS`."""
    if not text.strip():
        raise UsageError(f"{what} must not be empty")
    if len(text) > MAX_PROMPT_CHARS:
        raise UsageError(f"{what} is {len(text)} characters; the limit is {MAX_PROMPT_CHARS}")
    return text


def usage_failure(console: Console, args: argparse.Namespace, message: str) -> int:
    """Report a usage or configuration error (as JSON with ``--json``); return status 2."""
    if getattr(args, "json", False):
        console.json(output.error_json("configuration", message))
    else:
        console.err(f"grid-agent {args.command}: error: {output.printable(message)}")
    return EXIT_USAGE
