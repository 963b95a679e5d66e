"""``ContentGuard``: what the tracing sink and the transcript record passes through it.

Exact outputs, so that a change to its redaction, its bound, its key source or its refusal
to be shown or pickled fails here (the mutation suite runs tests/core only).
"""

from __future__ import annotations

import json
import pickle
from typing import Final

import pytest

from metacrate_grid_agent._core._redact import ContentGuard, bounded_text
from metacrate_grid_agent.config import REDACTED, Secret

KEY: Final = "sk-guard-0123456789abcdefghijklmnopqrstuvwxyz"


@pytest.mark.parametrize("secret", [KEY, Secret(KEY)], ids=["str", "Secret"])
def test_the_key_is_redacted_whatever_it_came_as(secret: str | Secret) -> None:
    """The key, given as text or as a ``Secret``, is replaced wherever it stands."""
    guard = ContentGuard(secret)
    assert guard.text(f"before {KEY} after", 1000) == f"before {REDACTED} after"
    assert guard.text(f"{KEY.upper()}!", 1000) == f"{REDACTED}!"


@pytest.mark.parametrize("secret", [None, "", Secret("")], ids=["None", "empty", "Secret-empty"])
def test_without_a_key_text_is_only_bounded(secret: str | Secret | None) -> None:
    """No key: a text with nothing credential-shaped comes back as it was, cut only at the
    bound; a credential shape is still redacted; nothing counts as the key."""
    guard = ContentGuard(secret)
    assert guard.text("before plain words after", 1000) == "before plain words after"
    assert guard.text("before plain words after", 12) == bounded_text(
        "before plain words after", 12
    )
    assert guard.text(f"before {KEY} after", 1000) == f"before {REDACTED} after"
    assert guard.contains_secret(KEY) is False


@pytest.mark.parametrize("limit", [1, 15, 16, 40, 100, 400])
def test_the_result_is_the_redacted_text_cut_to_the_limit(limit: int) -> None:
    """Redacted first, then cut by ``bounded_text`` to ``limit`` UTF-8 bytes."""
    text = f"{'é' * 30} {KEY} {'x' * 500}"
    found = ContentGuard(KEY).text(text, limit)
    assert found == bounded_text(text.replace(KEY, REDACTED), limit)
    assert len(found.encode()) <= limit
    assert KEY not in found


def test_a_key_across_the_read_window_is_still_redacted() -> None:
    """Only the first ``limit * 4`` characters plus the key's length are read: a key that
    starts just inside that window is still read whole, so it is redacted, not cut into a
    slice that shows."""
    limit = 64
    text = "a" * (limit * 4 - 3) + KEY + "b" * 100
    found = ContentGuard(KEY).text(text, limit)
    assert found == bounded_text(text[: limit * 4 + len(KEY)].replace(KEY, REDACTED), limit)
    assert "sk-g" not in found


def test_contains_secret_matches_as_redaction_does() -> None:
    """Case-insensitive, the whole key only."""
    guard = ContentGuard(Secret(KEY))
    assert guard.contains_secret(f"x{KEY.upper()}y") is True
    assert guard.contains_secret(KEY[:-1]) is False


def test_it_never_shows_the_key_and_does_not_pickle() -> None:
    """Its repr names no key; pickling it is refused with the reason."""
    guard = ContentGuard(KEY)
    assert repr(guard) == "ContentGuard(<secret hidden>)"
    with pytest.raises(TypeError, match=r"^a ContentGuard holds a key and does not pickle$"):
        pickle.dumps(guard)


def test_contains_secret_folds_ascii_letter_case_only_on_either_path() -> None:
    """The key is found in any ASCII letter case, in ASCII text (the fast ``lower()`` path)
    and in text with other characters (the ASCII fold); a non-ASCII look-alike letter (the
    Kelvin sign for ``k``) is not the key on either path."""
    guard = ContentGuard("sk-Journal-KEY-0123456789abcdef")
    assert guard.contains_secret("see SK-JOURNAL-key-0123456789ABCDEF here")
    assert guard.contains_secret("voilà: sk-journal-key-0123456789abcdef")
    assert not guard.contains_secret("s\u212a-journal-key-0123456789abcdef")
    assert not guard.contains_secret("sk-journal-key-0123456789abcde")
    assert not ContentGuard(None).contains_secret("sk-journal-key-0123456789abcdef")


_QUOTED_KEY: Final = 'sk-gu"ard-0123456789abcdefghij\\klmnopqrstuvwxyz'


@pytest.mark.parametrize("key", [KEY, _QUOTED_KEY], ids=["plain", "quote-and-backslash"])
def test_contains_secret_json_finds_the_key_as_json_writes_it_and_nothing_less(key: str) -> None:
    """A JSON text holding the key in a string is found, the key escaped as JSON writes it
    (a quote or a backslash in it preceded by a backslash); the same key short of its first
    or last character, or the words JSON writes for nothing, are not the key."""
    guard = ContentGuard(key)
    assert guard.contains_secret_json(json.dumps({"echo": f"said {key} here"})) is True
    near = json.dumps({"head": key[1:], "tail": key[:-1], "none": None, "XXXX": ""})
    assert guard.contains_secret_json(near) is False


def test_contains_secret_json_without_a_key_finds_nothing() -> None:
    """With no key, no JSON text is said to hold it (not even one holding the placeholder
    words a broken default would look for)."""
    assert ContentGuard(None).contains_secret_json(json.dumps({"xxxx": "null"})) is False
