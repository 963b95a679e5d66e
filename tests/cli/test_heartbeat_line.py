"""When the heartbeat shows, and what its status line says, without a terminal or a clock."""

from __future__ import annotations

import io

from metacrate_grid_agent import ProgressEvent
from metacrate_grid_agent.cli._heartbeat import Heartbeat, color_allowed, wanted


class FakeTerminal(io.StringIO):
    """A StringIO that says it is a terminal."""

    def isatty(self) -> bool:
        return True


def test_the_heartbeat_shows_only_on_a_terminal_without_quiet_or_dumb_term() -> None:
    """A terminal shows it; --quiet, TERM=dumb and a non-terminal stream do not."""
    tty, plain = FakeTerminal(), io.StringIO()
    assert wanted(tty, quiet=False, environ={"TERM": "xterm"})
    assert not wanted(tty, quiet=True, environ={"TERM": "xterm"})
    assert not wanted(tty, quiet=False, environ={"TERM": "dumb"})
    assert not wanted(plain, quiet=False, environ={"TERM": "xterm"})


def test_no_color_is_respected() -> None:
    """NO_COLOR with any non-empty value turns styling off; empty or unset leaves it on."""
    assert (
        color_allowed({}),
        color_allowed({"NO_COLOR": ""}),
        color_allowed({"NO_COLOR": "1"}),
    ) == (
        True,
        True,
        False,
    )


def test_the_status_line_follows_the_events_and_clears_at_the_end() -> None:
    """Phase by phase, the line names what the call waits for; the end clears the screen line."""
    now = [100.0]
    terminal = FakeTerminal()
    beat = Heartbeat(terminal, scrub=str, max_attempts=3, color=False, clock=lambda: now[0])

    def event(kind: str, **fields: object) -> ProgressEvent:
        """An event of call r-1, which started at 100.0."""
        elapsed = now[0] - 100.0
        return ProgressEvent(kind=kind, request_id="r-1", attempt=1, elapsed_s=elapsed, **fields)  # type: ignore[arg-type]

    beat.on_progress(event("attempt"))
    assert beat.status_line() is None  # a young first attempt draws nothing
    beat.on_progress(event("phase", phase="connecting"))
    now[0] += 2.0
    assert beat.status_line() == "grid-agent: connecting, 2.0 s (attempt 1 of 3, r-1)"
    beat.on_progress(event("phase", phase="reading_body"))
    beat.draw()
    assert "reading the response body" in terminal.getvalue()
    beat.on_progress(event("end"))
    assert beat.status_line() is None
    assert terminal.getvalue().endswith("\r")
