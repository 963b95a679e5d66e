"""What surrounds a running probe or session: the log handler, the stop signals, the heartbeat.

``--verbose`` sends the library's log records to stderr through the command's redacting
formatter (:func:`configure_logging`); without it they are dropped, as the command reports
failures itself. While a probe or a session runs, Ctrl-C cancels its :class:`CancelToken`
with reason "operator" and SIGTERM with reason "shutdown"; a second signal quits at once
(:func:`operator_interrupts`). On a terminal, a heartbeat on stderr shows what a slow
request waits for (:func:`heartbeat`, :func:`beating`).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
import sys
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Final, TextIO

from metacrate_grid_agent import CancelToken, LLMConfig
from metacrate_grid_agent.cli import _output as output
from metacrate_grid_agent.cli._common import EXIT_INTERRUPTED, EXIT_TERMINATED
from metacrate_grid_agent.cli._heartbeat import Heartbeat, color_allowed
from metacrate_grid_agent.cli._heartbeat import wanted as heartbeat_wanted
from metacrate_grid_agent.cli._output import Console, Redactor

__all__ = [
    "OPERATOR",
    "SHUTDOWN",
    "beating",
    "cancel_status",
    "configure_logging",
    "heartbeat",
    "operator_interrupts",
]

LOGGER_NAME: Final = "metacrate_grid_agent"
#: Reason given to the session's cancellation token on Ctrl-C.
OPERATOR: Final = "operator"
#: Reason given to the session's cancellation token on SIGTERM (a service manager stopping us).
SHUTDOWN: Final = "shutdown"


def configure_logging(*, verbose: bool, redactor: Redactor) -> None:
    """Send the library's log records to stderr, redacted (``--verbose``), or nowhere."""
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


#: Per signal: the cancellation reason, the exit status, and the words said on receipt.
_STOP_SIGNALS: Final = (
    (signal.SIGINT, OPERATOR, EXIT_INTERRUPTED, "interrupted", "press Ctrl-C again"),
    (signal.SIGTERM, SHUTDOWN, EXIT_TERMINATED, "terminated (SIGTERM)", "send it again"),
)


def cancel_status(reason: str | None) -> int:
    """The exit status of a session or probe cancelled for ``reason``."""
    return EXIT_TERMINATED if reason == SHUTDOWN else EXIT_INTERRUPTED


@contextlib.contextmanager
def operator_interrupts(cancel: CancelToken, console: Console) -> Iterator[None]:
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


def heartbeat(args: argparse.Namespace, console: Console, config: LLMConfig) -> Heartbeat | None:
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
async def beating(beat: Heartbeat | None) -> AsyncIterator[None]:
    """Keep ``beat`` redrawn while the block runs (nothing without one)."""
    if beat is None:
        yield
        return
    async with beat.running():
        yield
