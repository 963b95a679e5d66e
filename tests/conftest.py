"""Suite-wide settings and the credential canaries.

Live model calls are off; only loopback is ever contacted. The canaries are keys of every
shape the configuration accepts that no credential pattern recognises, so only the
library's redaction of the configured key can hide them: a test that takes ``canary_key``
runs once per shape, and fails if that key, or any 12-character slice of it (as sent,
JSON-escaped or repr-escaped), appears in a log record at any level. Errors and output are
checked with :func:`assert_no_canary` and :func:`assert_error_clean`.

A run that skipped tests of a tier (``tests/tiers.py``) ends with one line per such tier:
what it needs, and the one command that runs them all.

``GRID_AGENT_EVENT_LOOP=uvloop`` runs every async test on uvloop's event loop instead of
asyncio's (the ``uvloop`` dependency group must be installed: asked for and missing, the run
stops at once); unset or ``asyncio``, asyncio's own loop.
"""

from __future__ import annotations

import json
import logging
import os
import pickle
import traceback
from pathlib import Path
from typing import TYPE_CHECKING, Final

import hypothesis
import pytest

from tests.proof_profiles import hypothesis_profile
from tests.tiers import tier_summary

if TYPE_CHECKING:
    import asyncio
    from collections.abc import Callable, Iterable, Iterator, Mapping

# Property tests run a modest, fixed number of examples so the suite stays fast and stable.
hypothesis.settings.register_profile("ci", max_examples=100, deadline=None, derandomize=True)
hypothesis.settings.register_profile("dev", max_examples=100, deadline=None)
hypothesis.settings.load_profile(hypothesis_profile("ci" if os.environ.get("CI") else "dev"))

#: The environment variable that chooses the event loop of the async tests.
EVENT_LOOP_ENV: Final = "GRID_AGENT_EVENT_LOOP"


#: Whether the async tests run on uvloop (see :func:`pytest_configure`).
ON_UVLOOP: Final = (os.environ.get(EVENT_LOOP_ENV) or "asyncio") == "uvloop"
#: For a test that counts the client's reads at the socket module (``socket.socket.recv`` and
#: ``recv_into``), which uvloop's transports never call (libuv reads the socket): on uvloop the
#: same bound is counted where the loop delivers the bytes, in test_event_loop.py.
counts_socket_reads = pytest.mark.skipif(
    ON_UVLOOP, reason="counts reads at the socket module, which uvloop's transports bypass"
)


class _LoopChoice:
    """A plugin that runs every async test on the loop ``factory`` makes."""

    def __init__(self, name: str, factory: Callable[[], asyncio.AbstractEventLoop]) -> None:
        self._factories = {name: factory}

    def pytest_asyncio_loop_factories(
        self, config: pytest.Config, item: pytest.Item
    ) -> Mapping[str, Callable[[], asyncio.AbstractEventLoop]]:
        """The one loop factory chosen, for every async test."""
        return self._factories


def pytest_configure(config: pytest.Config) -> None:
    """Run the async tests on uvloop when ``GRID_AGENT_EVENT_LOOP=uvloop``. Any other value
    but ``asyncio``, or uvloop asked for and not installed, stops the run: a tier that
    silently ran on asyncio's loop would prove nothing about uvloop."""
    chosen = os.environ.get(EVENT_LOOP_ENV) or "asyncio"
    if chosen == "asyncio":
        return
    if chosen != "uvloop":
        raise pytest.UsageError(f"{EVENT_LOOP_ENV}={chosen!r}: expected 'asyncio' or 'uvloop'")
    try:
        import uvloop
    except ImportError:
        raise pytest.UsageError(
            f"{EVENT_LOOP_ENV}=uvloop, but uvloop is not installed: run with --group uvloop"
        ) from None
    config.pluginmanager.register(_LoopChoice("uvloop", uvloop.new_event_loop), "event-loop")


#: Keys of every shape a credential pattern misses. Each is printable ASCII without spaces,
#: as the configuration requires of a header value (non-ASCII keys are refused there).
CANARY_KEYS: Final = {
    "hex64": "9c1e5b2d4086a1b3c5d7e9f204687f3a0b1c2d3e4f5a6b7c8d9e0f1a2b3c4d5e",
    "jwt": "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJncmlkLWNhbmFyeSJ9.Q2FuYXJ5U2lnbmF0dXJlMDAx",
    "backslash": "Cn\\x41ry\\\\Key\\n7f3a9c1e5b2d40",
    "quotes": "Cn'ry\"Key'7f3a9c1e5b2d40e8",
    "angle": "Cn<ry>Key</b>7f3a9c1e5b2d40",
    "percent": "Cn%41ry%Key%2F7f3a9c1e5b2d40",
}
#: The shortest slice of a key that counts as a leak.
SLICE: Final = 12
#: Loggers set to DEBUG while a canary test runs (the root catches the rest).
LOGGERS: Final = ("metacrate_grid_agent", "aiohttp", "asyncio", "grid_agent")
TESTS_DIR: Final = str(Path(__file__).resolve().parent)


def _forms(key: str) -> set[str]:
    """The key as sent and in the escaped forms an output may quote it in."""
    return {key, json.dumps(key)[1:-1], repr(key)[1:-1], repr(key.encode())[2:-1]}


def canary_slices(keys: Iterable[str] = CANARY_KEYS.values()) -> frozenset[str]:
    """Every 12-character slice of every form of every key, lower-cased."""
    return frozenset(
        form[start : start + SLICE].lower()
        for key in keys
        for form in _forms(key)
        for start in range(len(form) - SLICE + 1)
    )


_ALL_SLICES: Final = canary_slices()


def canary_leaks(text: str, slices: frozenset[str] = _ALL_SLICES) -> list[str]:
    """The canary slices found in ``text`` (case-insensitively)."""
    lowered = text.lower()
    if len(lowered) < SLICE:
        return []
    windows = {lowered[i : i + SLICE] for i in range(len(lowered) - SLICE + 1)}
    return sorted(windows & slices)


def assert_no_canary(*texts: str) -> None:
    """No canary key, nor a 12-character slice of one, appears in any of ``texts``."""
    for text in texts:
        found = canary_leaks(text)
        assert not found, f"a canary key leaked ({found[:3]}) in {text[:300]!r}"


def _library_frames(error: BaseException) -> Iterator[str]:
    """Locals (reprs, as error reporters capture them) of every frame outside the tests.

    The test's own frames hold the key it scripted; every other frame of the traceback,
    of every chained exception, is the library's or its dependencies'.
    """
    report = traceback.TracebackException(
        type(error), error, error.__traceback__, capture_locals=True
    )
    pending = [report]
    while pending:  # each exception of the chain once
        current = pending.pop()
        yield "".join(current.format_exception_only())
        for frame in current.stack:
            if not frame.filename.startswith(TESTS_DIR):
                yield from (f"{name} = {value}" for name, value in (frame.locals or {}).items())
        pending += [e for e in (current.__cause__, current.__context__) if e is not None]


def assert_error_clean(error: BaseException) -> None:
    """The canaries appear in no str, repr, attribute, pickle or traceback frame's locals."""
    texts = [str(error), repr(error), repr(getattr(error, "__dict__", {}))]
    texts.append(pickle.dumps(error).decode("latin-1"))
    texts.extend(_library_frames(error))
    assert_no_canary(*texts)


class _Records(logging.Handler):
    """Keeps every record, formatted as a reporter would see it."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.texts: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.texts.append(record.getMessage())
        self.texts.append(repr(vars(record)))
        if record.exc_info and record.exc_info[1] is not None:
            self.texts.append(logging.Formatter().formatException(record.exc_info))


@pytest.fixture(params=sorted(CANARY_KEYS))
def canary_key(request: pytest.FixtureRequest) -> str:
    """One canary key per run of the test: every shape in turn."""
    return CANARY_KEYS[str(request.param)]


@pytest.fixture(autouse=True)
def _canary_log_guard(request: pytest.FixtureRequest) -> Iterator[None]:
    """In a test that takes a canary key, every log record at DEBUG is checked for it."""
    if "canary_key" not in request.fixturenames:
        yield
        return
    handler = _Records()
    root = logging.getLogger()
    levels = {name: logging.getLogger(name).level for name in ("", *LOGGERS)}
    for name in levels:
        logging.getLogger(name).setLevel(logging.DEBUG)
    root.addHandler(handler)
    try:
        yield
    finally:
        root.removeHandler(handler)
        for name, level in levels.items():
            logging.getLogger(name).setLevel(level)
    assert_no_canary(*handler.texts)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """After pytest's own lines, the tiers that skipped and what each needs."""
    # A test's node id, or a module's when the whole module skipped (importorskip).
    skipped = [
        (report.nodeid, str(report.longrepr))
        for report in terminalreporter.stats.get("skipped", [])
    ]
    lines = tier_summary(skipped)
    if lines:
        terminalreporter.section("test tiers")
        for line in lines:
            terminalreporter.write_line(line)
