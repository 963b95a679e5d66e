"""The interactive approver of ``grid-agent run --approve``: one question per call, on a terminal.

Before each call that asks for approval (in the sandbox: ``move_to``, ``say``, ``give``,
its mutating tools; with MCP servers, every tool not known to be read-only) the operator
sees, on stderr, the MCP server it goes to (if any), the tool, its effect, its description, its
arguments and how long they have to answer, and answers on the terminal: ``y`` (or ``yes``)
runs the call; anything else refuses it, and what follows ``n`` / ``no`` is the reason the
model reads. An empty line, the end of input, no answer within ``approval_timeout_s``
(reported on stderr, ``-q`` or not) or Ctrl-C never run the call.

The arguments shown are the request's text, the JSON of the very value the executor would
receive, whole, with control and format characters escaped and nothing else changed. When
that does not fit in :data:`MAX_SHOWN_ARGUMENTS` characters nobody is asked: the call is
refused as too long to approve, never approved on a view of its beginning.

Input typed before the question was shown is discarded (a key pressed early is not an
answer), and only the terminal is asked: without one on stdin, ``--approve`` is refused up
front (exit status 2). It reads the terminal with the event loop's reader, not a thread, so
a cancelled question leaves nothing behind. Only the public API of the package is used.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
from collections.abc import Callable, Mapping
from typing import Final, TextIO

from metacrate_grid_agent import ApprovalRequest, Approved, CancelToken, Denied
from metacrate_grid_agent.cli._output import Console, bounded, printable, safe_line

__all__ = [
    "HIDDEN",
    "NO_TERMINAL",
    "TerminalApprover",
    "hidden",
    "parse_answer",
    "question_lines",
    "too_long",
]

#: Why ``--approve`` is refused when stdin is not a terminal.
NO_TERMINAL: Final = (
    "--approve asks on the terminal before each mutating call, but stdin is not a terminal; "
    "run it interactively, or without --approve"
)
#: Longest arguments text a question shows (characters, once escaped): about 25 lines of a
#: terminal, still readable before answering. Longer arguments are refused, never cut.
MAX_SHOWN_ARGUMENTS: Final = 2000
#: Longest description shown in a question (characters).
MAX_SHOWN_DESCRIPTION: Final = 300
#: Longest reason taken from an answer (characters); the loop bounds it again.
MAX_REASON_CHARS: Final = 500
#: Largest answer line read; the rest of a longer line is ignored.
MAX_ANSWER_BYTES: Final = 4096
#: The reason given when the operator refuses without saying why.
REFUSED: Final = "refused at the terminal"
#: The reason the loop gives a question's token when ``approval_timeout_s`` runs out (as
#: documented on :class:`~metacrate_grid_agent.Approver`).
APPROVAL_TIMEOUT: Final = "approval_timeout"
_YES: Final = frozenset({"y", "yes"})
_NO: Final = ("no", "n")


def _one_line(text: str, limit: int) -> str:
    return bounded(printable(" ".join(text.split())), limit)


def _seconds(timeout_s: float) -> str:
    """A time to answer as the operator reads it: whole seconds from 10 s, else two digits."""
    return f"{timeout_s:.0f}" if timeout_s >= 10 else f"{timeout_s:.2g}"


def _header_lines(request: ApprovalRequest, server: str | None = None) -> list[str]:
    call, tool = request.call, request.tool
    return [
        "",
        f"grid-agent: approval needed (turn {request.turn}, call {_one_line(call.id, 80)})",
        *([] if server is None else [f"  MCP server:  {_one_line(server, 64)}"]),
        f"  tool:        {_one_line(call.name, 64)} ({tool.effect.value})",
        f"  description: {_one_line(tool.description, MAX_SHOWN_DESCRIPTION)}",
    ]


def too_long(request: ApprovalRequest) -> Denied | None:
    """The refusal of a call whose escaped arguments do not fit a question whole, or None."""
    length = len(printable(request.arguments))
    if length <= MAX_SHOWN_ARGUMENTS:
        return None
    return Denied(
        f"too long to approve: the arguments are {length} characters once escaped, more than "
        f"the {MAX_SHOWN_ARGUMENTS} a question shows whole"
    )


#: Why a call whose arguments hold the endpoint's key (or a slice of it) is not asked about.
HIDDEN: Final = (
    "cannot be approved: part of the arguments would be shown hidden as a credential, and a "
    "call is approved only on the arguments shown whole"
)


def hidden(request: ApprovalRequest, scrub: Callable[[str], str]) -> Denied | None:
    """The refusal of a call whose arguments line the console would redact, or None.

    The console hides every secret it knows in whatever it prints; an arguments line it
    would change is not the text that runs, so the operator is not asked to approve it.
    """
    line = _arguments_line(request)
    return None if safe_line(scrub, line) == line else Denied(HIDDEN)


def _arguments_line(request: ApprovalRequest) -> str:
    return f"  arguments:   {printable(request.arguments)}"


def question_lines(request: ApprovalRequest, server: str | None = None) -> list[str]:
    """What the operator is shown about one call (before scrubbing); see :func:`too_long`.

    The arguments line is the request's arguments text whole, only escaped; ``server`` is
    the MCP server the call would go to, when it goes to one.
    """
    told = "" if request.timeout_s is None else f" (you have {_seconds(request.timeout_s)} s)"
    return [
        *_header_lines(request, server),
        _arguments_line(request),
        f"Run it? Type y to run it; n and a reason (or just Enter) to refuse it{told}:",
    ]


def parse_answer(line: str) -> Approved | Denied:
    """An answer line as a verdict: ``y``/``yes`` approve; anything else refuses."""
    text = " ".join(line.split())
    if text.lower() in _YES:
        return Approved()
    lowered = text.lower()
    for word in _NO:
        if lowered == word or lowered.startswith((word + " ", word + ":", word + ",")):
            text = text[len(word) :].lstrip(" :,")
            break
    reason = bounded(printable(text), MAX_REASON_CHARS)
    return Denied(reason or REFUSED)


def _discard_typeahead(fd: int) -> None:
    """Drop input typed before the question: a key pressed early is not an answer."""
    if sys.platform == "win32":  # pragma: no cover - no termios there
        return
    import termios  # noqa: PLC0415 - POSIX only

    with contextlib.suppress(termios.error):
        termios.tcflush(fd, termios.TCIFLUSH)


class TerminalApprover:
    """An :class:`~metacrate_grid_agent.Approver` that asks on the terminal given as stdin."""

    def __init__(
        self, console: Console, stdin: TextIO, server_of: Mapping[str, str] | None = None
    ) -> None:
        self._console = console
        self._fd = stdin.fileno()
        self._server_of = server_of or {}

    async def approve(self, request: ApprovalRequest, cancel: CancelToken) -> Approved | Denied:
        """Show the call, wait for one answer line, and turn it into a verdict.

        Arguments too long to show whole are refused without a question. A question cut by
        its timeout says so on stderr before the cut goes on.
        """
        server = self._server_of.get(request.call.name)
        refused = too_long(request) or hidden(request, self._console.redactor.scrub)
        if refused is not None:
            self._console.err(
                *_header_lines(request, server),
                f"grid-agent: {refused.reason}; the call is refused",
            )
            return refused
        _discard_typeahead(self._fd)
        self._console.err(*question_lines(request, server))
        try:
            line = await self._read_line()
        except asyncio.CancelledError:
            if cancel.reason == APPROVAL_TIMEOUT:
                waited = (
                    "" if request.timeout_s is None else f" within {_seconds(request.timeout_s)} s"
                )
                self._console.err(
                    f"grid-agent: no answer{waited}: the approval timed out; the call is refused"
                )
            raise
        if line is None:
            self._console.err("grid-agent: no answer (end of input); the call is refused")
            return Denied("no answer at the terminal")
        verdict = parse_answer(line)
        shown = "approved" if isinstance(verdict, Approved) else f"refused: {verdict.reason}"
        self._console.err(f"grid-agent: {shown}")
        return verdict

    async def _read_line(self) -> str | None:
        """One line from the terminal, or None at the end of input."""
        loop = asyncio.get_running_loop()
        done: asyncio.Future[bytes] = loop.create_future()
        data = bytearray()

        def readable() -> None:
            try:
                chunk = os.read(self._fd, MAX_ANSWER_BYTES)
            except OSError as exc:
                if not done.done():
                    done.set_exception(exc)
                return
            if not chunk or b"\n" in chunk or len(data) + len(chunk) >= MAX_ANSWER_BYTES:
                data.extend(chunk)
                if not done.done():
                    done.set_result(bytes(data) if chunk or data else b"")
                return
            data.extend(chunk)

        loop.add_reader(self._fd, readable)
        try:
            raw = await done
        except OSError:
            return None
        finally:
            loop.remove_reader(self._fd)
        if not raw:
            return None
        text = raw[:MAX_ANSWER_BYTES].split(b"\n", 1)[0]
        return text.decode("utf-8", errors="replace")
