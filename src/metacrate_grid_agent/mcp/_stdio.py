"""The stdio transport handed to the MCP SDK: bounded lines, one process group, a firm stop.

The SDK's own stdio transport is replaced because of what it leaves open:

* Its line reader joins every chunk to the buffer again (quadratic in a message's size) and
  has no bound. Here each stdout line is gathered once, and a line longer than
  ``max_message_bytes`` is discarded as it arrives (only its first bytes are kept); the
  request it answered gets a JSON-RPC error at once, so that call fails now instead of
  waiting out its timeout.
* A line that does not parse as a message (a lone surrogate in a text, say) is answered the
  same way when its request id can be read.
* The server starts in a process group of its own, and the whole group is ended when the
  transport closes (a helper the server started does not outlive it). A normal close
  closes stdin, waits ``_GRACE_S``, sends SIGTERM, waits ``_TERM_S``, then SIGKILL; a close
  under cancellation (a start-up limit, a cancelled caller) sends SIGKILL at once, so a
  server that ignores SIGTERM cannot stretch a limit.
* The SDK's ``server/discover`` probe waits up to its own 10 s, as long as the default
  start-up limit: a server that ignores unknown requests could not start. A probe left
  unanswered after ``probe_s`` is answered here with "method not found", so the SDK falls
  back to the ``initialize`` handshake within the start-up limit.
* stderr is read line by line, each cut to ``_STDERR_LINE_BYTES``, redacted (anything
  shaped like a credential, and every value of the server's ``env``) and logged with the
  server's label, up to ``_STDERR_LINES`` lines.
* What start-up failures say (:class:`StdioTrace`): a command that cannot be run is named;
  a server whose stdout ends is given ``_EXIT_SEEN_S`` to exit by itself, and then its exit
  status or signal and the last ``_TAIL_LINES`` stderr lines (redacted as logged, cut to
  ``_TAIL_LINE_CHARS`` and escaped by ``display_safe``) are kept for the error.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import re
import signal
from collections import deque
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import anyio
import mcp_types
from mcp.client.stdio import get_default_environment
from mcp.shared.message import SessionMessage

from metacrate_grid_agent._core._redact import (
    MIN_KEY_SLICE,
    NO_KEY,
    KeyRedactor,
    display_safe,
    scrub,
    shortened,
)
from metacrate_grid_agent.mcp._listing import StartupError

__all__ = ["UNREADABLE", "StdioTrace", "stdio_transport"]

logger = logging.getLogger("metacrate_grid_agent.mcp")

#: The JSON-RPC error code given to a request whose answer could not be read.
UNREADABLE: Final = -32603
#: Bytes read from a pipe at a time.
_CHUNK: Final = 64 * 1024
#: Bytes kept of an oversized or unparseable line, to find its request id.
_ID_PREFIX: Final = 4096
#: Wait for a server to exit on its own after its stdin closes (the protocol's first step).
_GRACE_S: Final = 2.0
#: Wait after SIGTERM before SIGKILL.
_TERM_S: Final = 1.0
#: Wait for the killed group's end to be seen; only an unkillable process reaches it.
_REAP_S: Final = 2.0
#: Longest stderr line logged; the rest of the line is dropped.
_STDERR_LINE_BYTES: Final = 1000
#: stderr lines logged per server; later ones are read and dropped (one notice says so).
_STDERR_LINES: Final = 1000
#: stderr lines a start-up error quotes: the last few, where a failing server says why.
_TAIL_LINES: Final = 5
#: Longest stderr line a start-up error quotes (an error is read on one screen).
_TAIL_LINE_CHARS: Final = 200
#: Wait, once a server's stdout has ended, for it to exit by itself (and say its status)
#: before it is stopped.
_EXIT_SEEN_S: Final = 1.0
#: Wait, once the server is stopped, for the rest of its stderr (a helper may hold it).
_STDERR_DRAIN_S: Final = 0.5
_ID: Final = re.compile(rb'"id"\s*:\s*(-?\d{1,18}|"(?:[^"\\]|\\.){0,256}")')


def _error_for(head: bytes, reason: str) -> SessionMessage | None:
    """An error answer to the request whose id starts ``head``, or None if none is found."""
    try:
        ident: Any = json.loads(head).get("id")
    except (ValueError, AttributeError):
        match = _ID.search(head)
        ident = json.loads(match.group(1)) if match else None
    if not isinstance(ident, int | str) or isinstance(ident, bool):
        return None
    return _error(ident, UNREADABLE, reason)


def _error(ident: int | str, code: int, reason: str) -> SessionMessage:
    error = {"jsonrpc": "2.0", "id": ident, "error": {"code": code, "message": reason}}
    return SessionMessage(mcp_types.jsonrpc_message_adapter.validate_python(error))


async def _lines(stream: asyncio.StreamReader, limit: int) -> AsyncIterator[tuple[bytes, bool]]:
    """Each line as ``(bytes, whole)``; a line over ``limit`` is cut to its first bytes."""
    buffer = bytearray()
    over = False
    while chunk := await stream.read(_CHUNK):
        start = 0
        while (end := chunk.find(b"\n", start)) >= 0:
            if not over:
                buffer += chunk[start:end]
            if over or len(buffer) > limit:
                yield bytes(buffer[:_ID_PREFIX]), False
            else:
                yield bytes(buffer), True
            buffer.clear()
            over = False
            start = end + 1
        if not over:
            buffer += chunk[start:]
            if len(buffer) > limit:
                del buffer[_ID_PREFIX:]
                over = True


@dataclass(slots=True)
class StdioTrace:
    """What a stdio server showed of itself, for a start-up error: its exit and last lines."""

    #: The exit status (negative: the signal) once it exited by itself, or None.
    returncode: int | None = None
    #: Its last stderr lines, redacted as logged, bounded and escaped.
    tail: deque[str] = field(default_factory=lambda: deque(maxlen=_TAIL_LINES))

    def describe(self) -> str:
        """``"; it exited with status 3; its stderr ended: ..."`` or an empty text."""
        said = ""
        if self.returncode is not None and self.returncode < 0:
            try:
                name = signal.Signals(-self.returncode).name
            except ValueError:
                name = str(-self.returncode)
            said = f"; it was ended by signal {name}"
        elif self.returncode is not None:
            said = f"; it exited with status {self.returncode}"
        if self.tail:
            said += "; its stderr ended: " + " | ".join(self.tail)
        return said


def _redactors(env: Mapping[str, str] | None) -> list[KeyRedactor]:
    values = {value for value in (env or {}).values() if len(value) >= MIN_KEY_SLICE}
    return [KeyRedactor(value) for value in sorted(values)]


async def _log_stderr(
    stream: asyncio.StreamReader, label: str, redactors: list[KeyRedactor], trace: StdioTrace
) -> None:
    count = 0
    async for line, _ in _lines(stream, _STDERR_LINE_BYTES):
        text = line[:_STDERR_LINE_BYTES].decode("utf-8", "replace")
        for redactor in redactors:
            text = redactor.redact(text)
        text = scrub(text, redactor=NO_KEY, limit=_STDERR_LINE_BYTES)
        if text.strip():
            trace.tail.append(display_safe(shortened(text.strip(), _TAIL_LINE_CHARS)))
        count += 1
        if count > _STDERR_LINES:
            if count == _STDERR_LINES + 1:
                logger.info("MCP server %r stderr: further lines are dropped", label)
            continue
        logger.info("MCP server %r stderr: %s", label, text)


def _inherited(label: str, names: Sequence[str]) -> dict[str, str]:
    """The variables of this process named by ``inherit_env``; one not set is skipped."""
    found = {name: os.environ[name] for name in names if name in os.environ}
    for name in names:
        if name not in found:
            logger.info("MCP server %r: inherit_env: %s is not set here; not passed", label, name)
    return found


def _not_run(command: str, cwd: str | None, error: OSError) -> str:
    """Why ``command`` could not be run, naming it (escaped) and what to check."""
    shown = display_safe(shortened(command, _TAIL_LINE_CHARS))
    if isinstance(error, FileNotFoundError) and cwd is not None and not os.path.isdir(cwd):
        return f"its cwd {display_safe(shortened(cwd, _TAIL_LINE_CHARS))!r} does not exist"
    if isinstance(error, FileNotFoundError):
        where = "" if os.sep in command else " on the server's PATH"
        return f"command {shown!r} not found{where}: install it, or give its full path"
    if isinstance(error, PermissionError):
        return f"command {shown!r} cannot be run: permission denied (is it executable?)"
    return f"command {shown!r} cannot be run: {error.strerror or type(error).__name__}"


def _signal_group(process: asyncio.subprocess.Process, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, sig)


async def _exited(process: asyncio.subprocess.Process, within_s: float) -> bool:
    # Polled, not process.wait(): that also waits for the pipes, which a helper may hold.
    deadline = asyncio.get_running_loop().time() + within_s
    while process.returncode is None:
        if asyncio.get_running_loop().time() >= deadline:
            return False
        await asyncio.sleep(0.01)
    return True


async def _stop(process: asyncio.subprocess.Process, *, graceful: bool) -> None:
    """End the server and its whole process group (see the module documentation)."""
    if process.stdin is not None:
        process.stdin.close()
    if graceful and not await _exited(process, _GRACE_S):
        _signal_group(process, signal.SIGTERM)
        await _exited(process, _TERM_S)
    _signal_group(process, signal.SIGKILL)  # the server, if still there, and every helper
    if not await _exited(process, _REAP_S):
        logger.warning("MCP server process %d is still alive after SIGKILL", process.pid)


@contextlib.asynccontextmanager
async def stdio_transport(
    *,
    label: str,
    command: str,
    args: Sequence[str],
    env: Mapping[str, str] | None,
    cwd: str | None,
    max_message_bytes: int,
    inherit_env: Sequence[str] = (),
    probe_s: float,
    trace: StdioTrace | None = None,
) -> AsyncIterator[tuple[Any, Any]]:
    """Start the server and yield the SDK's (read, write) message streams; ``trace`` keeps
    its exit and last stderr lines (:class:`StdioTrace`). A command that cannot be run is a
    :class:`StartupError` naming it."""
    trace = StdioTrace() if trace is None else trace
    try:
        process = await asyncio.create_subprocess_exec(
            command,
            *args,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=get_default_environment() | _inherited(label, inherit_env) | dict(env or {}),
            cwd=cwd,
            start_new_session=True,
        )
    except OSError as exc:
        raise StartupError(_not_run(command, cwd, exc)) from None
    reader_end, read_stream = anyio.create_memory_object_stream[SessionMessage | Exception](0)
    write_stream, writer_end = anyio.create_memory_object_stream[SessionMessage](0)
    stdout, stdin, stderr = process.stdout, process.stdin, process.stderr
    assert stdout is not None  # noqa: S101 - piped
    assert stdin is not None  # noqa: S101 - piped
    assert stderr is not None  # noqa: S101 - piped

    probes: set[int | str] = set()  # server/discover requests not answered yet
    given_up: set[int | str] = set()  # probes answered here instead

    async def give_up_probe(ident: int | str) -> None:
        await anyio.sleep(probe_s)
        if ident in probes:
            probes.discard(ident)
            given_up.add(ident)
            reason = f"no server/discover answer within {probe_s:g} s"
            with contextlib.suppress(anyio.ClosedResourceError, anyio.BrokenResourceError):
                await reader_end.send(_error(ident, mcp_types.METHOD_NOT_FOUND, reason))

    stdout_ended = anyio.Event()
    stderr_ended = anyio.Event()

    async def read() -> None:
        async with reader_end:
            async for line, whole in _lines(stdout, max_message_bytes):
                if not line.strip():
                    continue
                message: SessionMessage | Exception | None
                if whole:
                    try:
                        parsed = mcp_types.jsonrpc_message_adapter.validate_json(
                            line, by_name=False
                        )
                        message = SessionMessage(parsed)
                    except ValueError:
                        message = _error_for(
                            line[:_ID_PREFIX], "the server's answer could not be read"
                        )
                else:
                    message = _error_for(
                        line,
                        "the server's answer is larger than max_response_bytes "
                        f"({max_message_bytes}); it was dropped",
                    )
                if message is None:
                    logger.warning("MCP server %r sent a message that could not be read", label)
                    continue
                answered = message.message if isinstance(message, SessionMessage) else None
                if isinstance(answered, mcp_types.JSONRPCResponse | mcp_types.JSONRPCError):
                    if answered.id in given_up:
                        continue  # already answered here; the SDK has moved on
                    probes.discard(answered.id)
                try:
                    await reader_end.send(message)
                except (anyio.ClosedResourceError, anyio.BrokenResourceError):
                    return
            stdout_ended.set()

    async def watch_stderr() -> None:
        await _log_stderr(stderr, label, _redactors(env), trace)
        stderr_ended.set()

    async def write() -> None:
        try:
            async with writer_end:
                async for session_message in writer_end:
                    message = session_message.message
                    if isinstance(message, mcp_types.JSONRPCRequest) and (
                        message.method == "server/discover"
                    ):
                        probes.add(message.id)
                        group.start_soon(give_up_probe, message.id)
                    data = message.model_dump_json(by_alias=True, exclude_unset=True)
                    stdin.write(data.encode("utf-8") + b"\n")
                    await stdin.drain()
        except (ConnectionError, OSError, anyio.ClosedResourceError, anyio.BrokenResourceError):
            await reader_end.aclose()  # the session sees the connection end

    graceful = True
    async with anyio.create_task_group() as group:
        group.start_soon(read)
        group.start_soon(write)
        group.start_soon(watch_stderr)
        try:
            yield read_stream, write_stream
        except BaseException:
            graceful = False
            raise
        finally:
            with anyio.CancelScope(shield=True):
                read_stream.close()
                write_stream.close()
                if stdout_ended.is_set() and await _exited(process, _EXIT_SEEN_S):
                    trace.returncode = process.returncode  # it ended by itself
                await _stop(process, graceful=graceful)
                with anyio.move_on_after(_STDERR_DRAIN_S):
                    await stderr_ended.wait()
            group.cancel_scope.cancel()
