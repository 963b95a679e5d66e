"""The public safety module: the library's own rules, for an application's own front end."""

from __future__ import annotations

import json
import os
import pickle
import stat
from typing import TYPE_CHECKING

import pytest

from metacrate_grid_agent import Secret
from metacrate_grid_agent._core._redact import display_safe as library_display_safe
from metacrate_grid_agent._files import open_private as library_open_private
from metacrate_grid_agent._files import read_regular as library_read_regular
from metacrate_grid_agent.safety import (
    RefusedFileError,
    SecretRedactor,
    display_safe,
    open_private,
    read_regular,
)
from tests.conftest import assert_no_canary

if TYPE_CHECKING:
    from pathlib import Path

KEY = "sk-CANARY-5f0c2e9a7b31d84e"


def test_the_public_names_are_the_library_rules_themselves() -> None:
    """No second copy of a rule: the public names are the functions the library uses."""
    assert (library_display_safe, library_read_regular, library_open_private) == (
        display_safe,
        read_regular,
        open_private,
    )


def test_a_secret_redactor_hides_the_secret_in_every_form() -> None:
    """Whole, by a 12-character slice, quoted by JSON or repr, and a beginning cut by a bound
    (at the end of the text or before the cut mark): each becomes the marker."""
    redactor = SecretRedactor(KEY)
    texts = {
        f"text {KEY} more": "text [REDACTED] more",
        f"text {KEY[5:17]} more": "text [REDACTED] more",
        json.dumps({"m": KEY}): '{"m": "[REDACTED]"}',
        f"quoted {KEY!r}": "quoted '[REDACTED]'",
        "token=" + KEY[:12]: "token=[REDACTED]",
        f"cut {KEY[:8]}… here": "cut [REDACTED]… here",
        "sk-CANARY is a word here": "sk-CANARY is a word here",
    }
    assert texts == {text: redactor.redact(text) for text in texts}


def test_a_secret_redactor_takes_a_secret_and_never_shows_it() -> None:
    """Built from a :class:`Secret`, it redacts alike; its repr hides the secret and
    pickling it is refused."""
    redactor = SecretRedactor(Secret(KEY))
    assert redactor.redact(f"a {KEY} b") == "a [REDACTED] b"
    assert_no_canary(repr(redactor))
    with pytest.raises(TypeError, match="cannot be pickled"):
        pickle.dumps(redactor)


def test_an_empty_secret_changes_nothing() -> None:
    """A redactor of no secret leaves every text as it is."""
    assert SecretRedactor("").redact("anything at all…") == "anything at all…"


def test_the_files_rules_hold_through_the_public_names(tmp_path: Path) -> None:
    """A written file is private (0600) and read back bounded; a FIFO is refused as a
    :class:`RefusedFileError` (an OSError) before it could block."""
    path = tmp_path / "out.txt"
    with open_private(path) as file:
        file.write("hello")
    assert (stat.S_IMODE(path.stat().st_mode), read_regular(path, 64).data) == (0o600, b"hello")
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(RefusedFileError, match="it is a FIFO, not a regular file"):
        read_regular(fifo, 64)
