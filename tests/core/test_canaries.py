"""The canary checks themselves: each must see a leak, or every leak test passes vacuously."""

from __future__ import annotations

import json
import logging

import pytest

from metacrate_grid_agent.errors import ChoiceError
from tests.conftest import CANARY_KEYS, _Records, assert_error_clean, assert_no_canary


@pytest.mark.parametrize("key", sorted(CANARY_KEYS.values()))
def test_every_form_and_slice_of_a_canary_is_seen(key: str) -> None:
    """The key, a 12-character slice of it, its escaped forms and other cases all fail."""
    for text in (key, f"x{key[3:15]}y", json.dumps(key), repr(key), key.upper()):
        with pytest.raises(AssertionError):
            assert_no_canary(text)
    assert_no_canary(f"x{key[3:14]}y")  # eleven characters identify nothing


def test_an_error_with_the_key_in_a_frame_local_is_seen() -> None:
    """A key held as a local by a frame outside the tests fails assert_error_clean."""
    key = CANARY_KEYS["hex64"]
    namespace: dict[str, object] = {"ChoiceError": ChoiceError}
    exec(  # noqa: S102 - a frame whose file is not under tests/, as a library frame's is
        compile("def fail(secret):\n    raise ChoiceError('no detail')\n", "<lib>", "exec"),
        namespace,
    )
    with pytest.raises(ChoiceError) as info:
        namespace["fail"](key)  # type: ignore[operator]
    with pytest.raises(AssertionError):
        assert_error_clean(info.value)


def test_a_log_record_with_the_key_is_seen() -> None:
    """The guard's handler keeps what a reporter shows: message, arguments and extras."""
    handler = _Records()
    record = logging.LogRecord("x", logging.DEBUG, "f", 1, "sent %s", None, None)
    record.extra_key = CANARY_KEYS["jwt"]
    handler.emit(record)
    with pytest.raises(AssertionError):
        assert_no_canary(*handler.texts)
