"""The command's heartbeat: one status line on a terminal while a model request is in flight.

Built on the library's :class:`~metacrate_grid_agent.ProgressEvent` (``LLMClient``'s
``on_progress``), never on guesses: the line says how long the call has taken, which
attempt it is on, and what it waits for (a connection, the response headers, the body, a
retry's delay). A retry also leaves a permanent line saying why and how long it waits.

Shown only when stderr is a terminal, ``--quiet`` is not given and ``TERM`` is not
``dumb``; the status line is cleared before any other stderr line and at the end of each
call, so nothing of it stays in the scrollback. ``NO_COLOR`` (any non-empty value) turns
the dim styling off. Every line passes through the console's redactor, and what it says
is escaped by the command's one rule (:func:`~._output.safe_line`): the only carriage
returns and escape sequences on the terminal are the heartbeat's own.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import AsyncIterator, Callable, Mapping
from typing import IO, Final

from metacrate_grid_agent import ProgressEvent
from metacrate_grid_agent.cli._output import safe_line

__all__ = ["Heartbeat", "wanted"]

#: How often the status line is redrawn while a call is in flight.
TICK_S: Final = 0.25
#: A call younger than this gets no status line (a fast reply should not flicker one).
SHOW_AFTER_S: Final = 0.5
#: Longest status line drawn; it is also kept below the terminal's width, since a line that
#: wraps cannot be redrawn in place.
MAX_LINE_CHARS: Final = 120
#: Terminal width assumed when the terminal does not say.
DEFAULT_COLUMNS: Final = 80

_DIM: Final = "\x1b[2m"
_RESET: Final = "\x1b[0m"
_WAITING_FOR: Final = {
    "attempt": "starting the request",
    "connecting": "connecting",
    "waiting_for_headers": "waiting for response headers",
    "reading_body": "reading the response body",
    "retry": "waiting to retry",
}


def _seconds(value: float) -> str:
    return f"{value:.2f} s" if value < 10 else f"{value:.0f} s"


def wanted(stream: IO[str], *, quiet: bool, environ: Mapping[str, str] | None = None) -> bool:
    """Whether to show a heartbeat on ``stream``: a terminal, not quiet, not TERM=dumb."""
    env = os.environ if environ is None else environ
    if quiet or env.get("TERM") == "dumb":
        return False
    try:
        return stream.isatty()
    except (AttributeError, ValueError, OSError):
        return False


def color_allowed(environ: Mapping[str, str] | None = None) -> bool:
    """False when ``NO_COLOR`` is set to a non-empty value (https://no-color.org)."""
    env = os.environ if environ is None else environ
    return not env.get("NO_COLOR")


class Heartbeat:
    """The status line of the call in flight, redrawn every :data:`TICK_S` by :meth:`running`."""

    def __init__(
        self,
        stream: IO[str],
        *,
        scrub: Callable[[str], str],
        max_attempts: int,
        color: bool,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._stream = stream
        self._scrub = scrub
        self._max_attempts = max_attempts
        self._color = color
        self._clock = clock
        self._drawn = 0  # characters of the status line now on screen
        self._call: tuple[str, int, str, float] | None = None  # rid, attempt, waiting, start

    def on_progress(self, event: ProgressEvent) -> None:
        """Take in one event of the library (the ``on_progress`` hook)."""
        started = self._clock() - event.elapsed_s
        if event.kind == "end":
            self._call = None
            self.clear()
            return
        if event.kind == "retry":
            delay = event.delay_s or 0.0
            self._write_line(
                f"grid-agent: attempt {event.attempt} of {self._max_attempts} failed: "
                f"{event.reason}; retrying in {_seconds(delay)}"
            )
            # The line counts the wait itself, from now: not the call's time so far.
            self._call = (event.request_id, event.attempt, "retry", self._clock())
            return
        what = event.phase if event.kind == "phase" and event.phase else event.kind
        self._call = (event.request_id, event.attempt, what, started)

    def status_line(self) -> str | None:
        """The status line for now, or None when no call is in flight (or it is young)."""
        if self._call is None:
            return None
        rid, attempt, what, started = self._call
        elapsed = self._clock() - started
        if elapsed < SHOW_AFTER_S and attempt == 1:
            return None
        text = (
            f"grid-agent: {_WAITING_FOR.get(what, what)}, {elapsed:.1f} s "
            f"(attempt {attempt} of {self._max_attempts}, {rid})"
        )
        return safe_line(self._scrub, text)[: min(MAX_LINE_CHARS, self._columns() - 1)]

    def _columns(self) -> int:
        try:
            columns = os.get_terminal_size(self._stream.fileno()).columns
        except (AttributeError, ValueError, OSError):
            return DEFAULT_COLUMNS
        return columns if columns > 1 else DEFAULT_COLUMNS

    def draw(self) -> None:
        """Redraw the status line (or clear it when there is none)."""
        line = self.status_line()
        if line is None:
            self.clear()
            return
        pad = " " * max(0, self._drawn - len(line))
        shown = f"{_DIM}{line}{_RESET}" if self._color else line
        self._emit(f"\r{shown}{pad}\r")
        self._drawn = len(line)

    def clear(self) -> None:
        """Remove the status line from the screen, if one is there."""
        if self._drawn:
            self._emit("\r" + " " * self._drawn + "\r")
            self._drawn = 0

    def _write_line(self, text: str) -> None:
        self.clear()
        self._emit(safe_line(self._scrub, text) + "\n")

    def _emit(self, text: str) -> None:
        with contextlib.suppress(OSError, ValueError):  # a closed terminal ends the display
            self._stream.write(text)
            self._stream.flush()

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[Heartbeat]:
        """Redraw the status line every :data:`TICK_S` while the block runs; clear it after."""

        async def tick() -> None:
            while True:
                await asyncio.sleep(TICK_S)
                self.draw()

        task = asyncio.create_task(tick())
        try:
            yield self
        finally:
            task.cancel()
            await asyncio.wait([task])  # never swallows a cancellation of our own task
            self.clear()
