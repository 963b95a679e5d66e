"""scrub()'s shortcut for plain texts: the same result as the whole procedure, always.

A reply's ``id`` and ``model`` are scrubbed on every reply; nearly always they are short runs
of letters, digits and punctuation that no step of :func:`scrub` changes. Such a text skips
the decoding steps (there is nothing to decode), and still goes through every check that
could change it: the key and its slices, a beginning of the key at its end, credential
shapes. These tests pin that the shortcut never gives a result the whole procedure would not.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from metacrate_grid_agent._core import _redact
from metacrate_grid_agent._core._redact import NO_KEY, KeyRedactor, scrub
from tests.conftest import CANARY_KEYS

KEYS = [*CANARY_KEYS.values(), "sk-proj-abcdefghijklmnopqrstuvwx", "short-key", "k3y!"]

# Pieces a label may be made of: plain runs, pieces of a key, credential shapes, and the
# characters that take the whole procedure (blanks, escapes).
_PLAIN_PIECES = st.text(alphabet=st.characters(min_codepoint=0x21, max_codepoint=0x7E), max_size=20)
_OTHER_PIECES = st.sampled_from(
    ["sk-", "sk-abcdefgh1234", "AIza", "hf_", "Bearer ", " ", "\t", "\u200b", "%41", "&amp;",
     "\\u0041", "\\", "%", "&", "é", "…", "\x1b", "chatcmpl-", "gpt-4o-mini"]
)  # fmt: skip


@st.composite
def labels(draw: st.DrawFn, key: str) -> str:
    """A text mixing plain runs, slices and beginnings of ``key``, and the other pieces."""
    key_pieces = st.builds(
        lambda start, size: key[start : start + size],
        st.integers(0, len(key)),
        st.integers(1, len(key)),
    )
    pieces = draw(
        st.lists(st.one_of(_PLAIN_PIECES, _OTHER_PIECES, key_pieces, key_pieces), max_size=6)
    )
    text = "".join(pieces)
    return text.upper() if draw(st.booleans()) else text


@settings(max_examples=400)
@given(data=st.data(), key=st.sampled_from([*KEYS, None]), limit=st.sampled_from([1, 12, 40, 256]))
def test_the_shortcut_gives_what_the_whole_procedure_gives(
    data: st.DataObject, key: str | None, limit: int
) -> None:
    """For any text, key and limit, scrub() equals the procedure without the shortcut."""
    text = data.draw(labels(key or "sk-abcdefghijklmnop"))
    redactor = KeyRedactor(key)
    assert scrub(text, redactor=redactor, limit=limit) == _redact._scrub_whole(
        text, redactor=redactor, limit=limit
    )


@pytest.mark.parametrize("key", KEYS)
def test_a_plain_label_that_holds_the_key_is_still_redacted(key: str) -> None:
    """The shortcut keeps every check that could change a plain text."""
    redactor = KeyRedactor(key)
    plain = key.replace("%", "x").replace("\\", "x")
    for text in (f"chatcmpl-{plain}", f"model-{plain[:14]}-x", f"id-{plain[:5]}"):
        assert scrub(text, redactor=redactor, limit=256) == _redact._scrub_whole(
            text, redactor=redactor, limit=256
        )
        if plain == key:  # still a slice of the key
            assert plain[:12].lower() not in scrub(text, redactor=redactor, limit=256).lower()


def test_a_plain_label_takes_the_shortcut(monkeypatch: pytest.MonkeyPatch) -> None:
    """A short plain label is not decoded (the costly part); the key's search still runs."""

    def decoded(*_: object) -> bool:
        raise AssertionError("a plain text has nothing to decode")

    monkeypatch.setattr(KeyRedactor, "_decoded_hit", decoded)
    redactor = KeyRedactor(CANARY_KEYS["hex64"])
    assert scrub("chatcmpl-9f8e7d6c5b4a", redactor=redactor, limit=256) == ("chatcmpl-9f8e7d6c5b4a")
    assert scrub("gpt-4o-mini", redactor=NO_KEY, limit=256) == "gpt-4o-mini"


def test_a_plain_text_found_clear_is_searched_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """A reply's model, the same on every reply, is searched for the key once per redactor."""
    searched: list[str] = []
    search = KeyRedactor._matches

    def counted(text: str, key: str) -> list[tuple[int, int]]:
        searched.append(text)
        return search(text, key)

    monkeypatch.setattr(KeyRedactor, "_matches", staticmethod(counted))
    redactor = KeyRedactor(CANARY_KEYS["hex64"])
    for _ in range(3):
        assert scrub("gpt-4o-mini", redactor=redactor, limit=256) == "gpt-4o-mini"
    assert searched == ["gpt-4o-mini"]


def test_the_texts_remembered_are_bounded() -> None:
    """At most MAX_CLEAR_TEXTS plain texts are remembered, whatever the replies' ids."""
    redactor = KeyRedactor(CANARY_KEYS["hex64"])
    for index in range(3 * _redact.MAX_CLEAR_TEXTS + 1):
        scrub(f"chatcmpl-{index}", redactor=redactor, limit=256)
        assert redactor.remembered() <= _redact.MAX_CLEAR_TEXTS


@pytest.mark.parametrize(
    ("size", "limit"),
    [(5, 5), (_redact.MAX_SCRUB_CHARS, _redact.MAX_SCRUB_CHARS)],
    ids=["at-the-limit", "at-the-scrub-bound"],
)
def test_a_plain_text_at_either_bound_takes_the_shortcut(size: int, limit: int) -> None:
    """Both bounds of the shortcut are inclusive: a plain text exactly ``limit`` characters
    long, or exactly MAX_SCRUB_CHARS, is kept as it is and remembered as clear (searched
    once), not sent through the whole procedure on every reply."""
    redactor = KeyRedactor(CANARY_KEYS["hex64"])
    text = "a" * size
    assert scrub(text, redactor=redactor, limit=limit) == text
    assert redactor.remembered() == 1
