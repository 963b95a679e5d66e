"""The command's terminal safety without a child process: every place that writes a line.

The console applies the library's one escaping rule to every line it writes, the log
formatter to every record, the heartbeat to its status and retry lines, the crash report
to a traceback, and the argument parser to its messages. Each test feeds a hostile value
where a model, an endpoint, a file or the command line could put one and checks the output
with :func:`tests.terminal_safety.unsafe`, a rule written out independently of the code.
"""

from __future__ import annotations

import io
import logging
import sys

import pytest

from metacrate_grid_agent import ProgressEvent
from metacrate_grid_agent._core._redact import display_safe
from metacrate_grid_agent.cli import _main, _output, _parser
from metacrate_grid_agent.cli._heartbeat import DEFAULT_COLUMNS, Heartbeat
from metacrate_grid_agent.cli._output import Console, RedactingFormatter, Redactor
from tests.terminal_safety import HOSTILE, HOSTILE_LINES, unsafe


def test_the_command_reaches_the_same_function() -> None:
    """The command's ``printable`` is the library's function, not a second copy of the rule."""
    assert _output.printable is display_safe


def test_the_console_escapes_every_line_and_keeps_only_its_own_line_breaks() -> None:
    """Each line given to the console is one line on the stream, whatever it holds."""
    out, err = io.StringIO(), io.StringIO()
    console = Console(Redactor(), stdout=out, stderr=err)
    console.out(f"id {HOSTILE}", HOSTILE_LINES)
    console.err(f"[turn 1]   -> say {{}} (mutating, id {HOSTILE})")
    assert (unsafe(out.getvalue()), unsafe(err.getvalue())) == ([], [])
    assert (out.getvalue().count("\n"), err.getvalue().count("\n")) == (2, 1)
    assert out.getvalue().startswith(f"id {display_safe(HOSTILE)}\n")


def test_the_console_redacts_a_key_that_only_escaping_spells_out() -> None:
    """A key holding a literal ``\\x1b`` is spelled out when an echo's real ESC is escaped:
    the console scrubs again after escaping, so it is never shown."""
    key = "ABCDEFGHIJK\\x1bLMNOPQRSTUV"
    redactor = Redactor()
    redactor.add(key)
    out = io.StringIO()
    Console(redactor, stdout=out).out("echo: ABCDEFGHIJK\x1bLMNOPQRSTUV")
    expected = "echo: [REDACTED]\n"
    assert expected == out.getvalue()


def _fail(message: str) -> None:
    raise ValueError(message)


def test_log_records_are_escaped_and_their_tracebacks_indented() -> None:
    """A record's message is one escaped line; a traceback's lines are escaped and indented,
    so an exception message cannot forge a line of its own."""
    formatter = RedactingFormatter(Redactor())
    try:
        _fail(f"bad {HOSTILE}\nRun it? Type y")
    except ValueError:
        exc_info = sys.exc_info()
    record = logging.LogRecord(
        "metacrate_grid_agent", logging.ERROR, __file__, 1, "call %s: %s", (HOSTILE, "x\ny"),
        exc_info,
    )  # fmt: skip
    text = formatter.format(record)
    first, *rest = text.split("\n")
    assert unsafe(text) == []
    assert first.endswith(f"call {display_safe(HOSTILE)}: x\\x0ay")
    assert rest
    assert [line for line in rest if not line.startswith("  ")] == []


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True

    def fileno(self) -> int:
        raise OSError("no terminal size here")


def test_the_heartbeat_escapes_what_it_interpolates() -> None:
    """A hostile request id and retry reason: the terminal gets only the heartbeat's own
    carriage returns and dim styling around escaped text."""
    now = [10.0]
    terminal = _Terminal()
    beat = Heartbeat(terminal, scrub=str, max_attempts=3, color=True, clock=lambda: now[0])
    beat.on_progress(
        ProgressEvent(
            kind="retry", request_id=HOSTILE, attempt=1, elapsed_s=0.0, reason=HOSTILE,
            delay_s=0.5,
        )
    )  # fmt: skip
    now[0] += 2.0
    beat.draw()
    shown = display_safe(HOSTILE)
    status = f"grid-agent: waiting to retry, 2.0 s (attempt 1 of 3, {shown})"
    status = status[: DEFAULT_COLUMNS - 1]  # cut to the width: the terminal gives none
    expected = (
        f"grid-agent: attempt 1 of 3 failed: {shown}; retrying in 0.50 s\n"
        f"\r\x1b[2m{status}\x1b[0m\r"
    )
    assert expected == terminal.getvalue()


def test_a_crash_is_reported_through_the_console_escaped_and_indented() -> None:
    """An unexpected exception quoting a hostile value: its traceback is shown under one line
    saying it is a bug, each of its lines escaped and indented."""
    err = io.StringIO()
    console = Console(Redactor(), stdout=io.StringIO(), stderr=err)
    try:
        _fail(f"invalid literal: {HOSTILE}\nRun it? Type y")
    except ValueError as exc:
        _main._report_crash(console, exc)
    first, *rest = err.getvalue().removesuffix("\n").split("\n")
    assert unsafe(err.getvalue()) == []
    assert first.startswith("grid-agent: internal error")
    assert [line for line in rest if not line.startswith("  ")] == []
    assert f"  ValueError: invalid literal: {display_safe(HOSTILE)}" in rest
    assert "  Run it? Type y" in rest  # a line break of the message: indented like the rest


#: A short command word that argparse echoes (only long ones are hidden) and its quoting
#: (``repr``) leaves as it is: invisible characters repr counts as printable.
TWIN = "\u034f\ufe0f\u3164x"


def test_argument_errors_echo_the_word_escaped(capsys: pytest.CaptureFixture[str]) -> None:
    """An unknown command word comes back escaped in argparse's error."""
    with pytest.raises(SystemExit):
        _parser.build_parser([TWIN]).parse_args([TWIN])
    captured = capsys.readouterr()
    assert unsafe(captured.err) == []
    assert display_safe(TWIN) in captured.err
