"""The files a configuration names: only regular files are read, never blocking, always named.

A configuration file or ``api_key_file`` that is a FIFO (or a symbolic link to one) would
block the reader forever, and a device such as ``/dev/zero`` would feed it without end; both
are refused before a byte is read, with the path in the message. A key file that other users
can read is accepted with a warning, as ssh warns about a private key. A symbolic link to a
regular file is read as the file (secrets are often mounted that way).

Every read that could block runs in a worker thread bounded by :data:`BOUND_S`, so a
regression fails the test instead of hanging the suite; the FIFO's other end is then opened
and closed to let the blocked reader go.
"""

from __future__ import annotations

import logging
import os
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from typing import TYPE_CHECKING, TypeVar

import pytest

from metacrate_grid_agent.config import AgentConfig, LLMConfig
from metacrate_grid_agent.errors import ConfigError, ConfigProblem
from tests.llm_transport.support import CANARY_KEY

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

URL = "https://llm.example.com/v1/chat/completions"
#: How long a read may take before the test calls it blocked (a refusal takes microseconds).
BOUND_S = 5.0
#: The logger the configuration's warnings go to.
CONFIG_LOGGER = "metacrate_grid_agent.config"

T = TypeVar("T")


def bounded(call: Callable[[], T], fifo: Path) -> T:
    """``call()``'s result, or a test failure if it has not returned within BOUND_S.

    On a timeout the FIFO's writing end is opened and closed, so the blocked reader sees the
    end of the file and its thread can finish.
    """
    with ThreadPoolExecutor(max_workers=1) as pool:
        future = pool.submit(call)
        try:
            return future.result(timeout=BOUND_S)
        except FutureTimeout:
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
            pytest.fail(f"reading {fifo} blocked for {BOUND_S} s")


def problems_of(build: Callable[[], object]) -> tuple[ConfigProblem, ...]:
    """The problems of the ConfigError that ``build`` must raise."""
    with pytest.raises(ConfigError) as caught:
        build()
    return caught.value.problems


def from_key_file(path: str | Path) -> LLMConfig:
    """An LLMConfig whose key comes from ``path``."""
    return LLMConfig.from_mapping({"endpoint_url": URL, "api_key_file": str(path)}, env={})


def key_file(tmp_path: Path, mode: int, data: bytes = CANARY_KEY.encode() + b"\n") -> Path:
    """A key file holding ``data`` with permission bits ``mode``."""
    path = tmp_path / "llm.key"
    path.write_bytes(data)
    path.chmod(mode)
    return path


def test_a_key_file_that_is_a_fifo_is_refused_without_blocking(tmp_path: Path) -> None:
    """A FIFO as api_key_file is a problem naming the path, not a reader waiting forever."""
    fifo = tmp_path / "key.fifo"
    os.mkfifo(fifo)
    found = bounded(lambda: problems_of(lambda: from_key_file(fifo)), fifo)
    expected = [
        (
            "api_key_file",
            f"cannot read the key file {str(fifo)!r} (it is a FIFO, not a regular file)",
        )
    ]
    assert expected == [(p.key, p.problem) for p in found]


def test_a_symlink_to_a_fifo_as_key_file_is_refused_without_blocking(tmp_path: Path) -> None:
    """The link is followed for the check: what it points at must be a regular file."""
    fifo, link = tmp_path / "key.fifo", tmp_path / "llm.key"
    os.mkfifo(fifo)
    link.symlink_to(fifo)
    found = bounded(lambda: problems_of(lambda: from_key_file(link)), fifo)
    expected = [
        (
            "api_key_file",
            f"cannot read the key file {str(link)!r} (it is a FIFO, not a regular file)",
        )
    ]
    assert expected == [(p.key, p.problem) for p in found]


def test_a_device_as_key_file_is_refused_naming_the_path() -> None:
    """/dev/zero (endless NUL bytes) is refused as a character device, its path named."""
    found = problems_of(lambda: from_key_file("/dev/zero"))
    expected = [
        (
            "api_key_file",
            "cannot read the key file '/dev/zero' (it is a character device, not a regular file)",
        )
    ]
    assert expected == [(p.key, p.problem) for p in found]


def test_a_symlink_to_a_regular_key_file_is_read(tmp_path: Path) -> None:
    """Mounted secrets are symbolic links to regular files: they work."""
    target = key_file(tmp_path, 0o600)
    link = tmp_path / "mounted.key"
    link.symlink_to(target)
    assert from_key_file(link).api_key.reveal() == CANARY_KEY


def test_a_key_file_of_two_lines_is_refused_saying_so(tmp_path: Path) -> None:
    """The file is the key alone: surrounding whitespace (a final newline) is stripped, and
    a second line is refused with a message that says so, naming the file."""
    path = key_file(tmp_path, 0o600, b"sk-one\nsk-two\n")
    found = problems_of(lambda: from_key_file(path))
    expected = [
        (
            "api_key_file",
            f"the key file {str(path)!r} has more than one line; it must hold the key alone",
        )
    ]
    assert expected == [(p.key, p.problem) for p in found]


def test_the_from_mapping_docstring_says_what_is_read_from_the_key_file() -> None:
    """The documentation of from_mapping describes the rule the code applies, not another."""
    doc = LLMConfig.from_mapping.__doc__ or ""
    assert "first line" not in doc
    assert "the key alone" in doc


def test_a_key_file_readable_by_others_is_warned_about(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Like ssh for a private key: a key file with group or other read bits is used, with
    one warning naming the file and its mode, and the key nowhere in it."""
    caplog.set_level(logging.WARNING, logger=CONFIG_LOGGER)
    path = key_file(tmp_path, 0o644)
    assert from_key_file(path).api_key.reveal() == CANARY_KEY
    expected = [
        (
            CONFIG_LOGGER,
            logging.WARNING,
            f"the key file {str(path)!r} is readable by other users (mode 0644); chmod 600 it",
        )
    ]
    assert expected == caplog.record_tuples


@pytest.mark.parametrize("mode", [0o600, 0o400], ids=["0600", "0400"])
def test_a_private_key_file_is_not_warned_about(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, mode: int
) -> None:
    """A key file only its owner can read gives no warning."""
    caplog.set_level(logging.WARNING, logger=CONFIG_LOGGER)
    assert from_key_file(key_file(tmp_path, mode)).api_key.reveal() == CANARY_KEY
    assert caplog.record_tuples == []


def test_a_config_file_that_is_a_fifo_is_refused_without_blocking(tmp_path: Path) -> None:
    """from_toml refuses a FIFO before opening it to read, naming the path."""
    fifo = tmp_path / "agent.toml"
    os.mkfifo(fifo)
    found = bounded(lambda: problems_of(lambda: AgentConfig.from_toml(fifo, env={})), fifo)
    expected = [(str(fifo), "cannot read: it is a FIFO, not a regular file")]
    assert expected == [(p.key, p.problem) for p in found]


def test_a_directory_as_config_file_is_refused(tmp_path: Path) -> None:
    """A folder is not a configuration file either; the message says what it is."""
    found = problems_of(lambda: AgentConfig.from_toml(tmp_path, env={}))
    expected = [(str(tmp_path), "cannot read: it is a directory, not a regular file")]
    assert expected == [(p.key, p.problem) for p in found]
