"""``tune_gc_for_many_sessions``: what it sets in the collector, and that it sets it once.

Each test restores the collector's state (thresholds, frozen objects, enabled) afterwards,
so nothing leaks into the rest of the run.
"""

from __future__ import annotations

import gc
from typing import TYPE_CHECKING

import pytest

import metacrate_grid_agent
from metacrate_grid_agent import GC_THRESHOLDS, tune_gc_for_many_sessions

if TYPE_CHECKING:
    from collections.abc import Iterator

#: Python's own first threshold: the tuned one must be above it, or the helper tunes nothing.
PYTHON_DEFAULT_GEN0 = 700


@pytest.fixture(autouse=True)
def restored_gc() -> Iterator[None]:
    """The collector as it was: thresholds, nothing frozen by the test, enabled or not."""
    thresholds, enabled = gc.get_threshold(), gc.isenabled()
    frozen = gc.get_freeze_count()
    yield
    if gc.get_freeze_count() != frozen:
        gc.unfreeze()
    gc.set_threshold(*thresholds)
    (gc.enable if enabled else gc.disable)()


def test_it_freezes_what_start_up_left_and_raises_the_thresholds() -> None:
    """After the call, start-up's objects are out of the collector's generations and the
    thresholds are the documented constants; the call returns exactly what it set."""
    gc.set_threshold(700, 10, 10)
    gc.unfreeze()
    survivor = [object() for _ in range(100)]  # a start-up object: must end up frozen
    assert tune_gc_for_many_sessions() == GC_THRESHOLDS
    assert gc.get_threshold() == GC_THRESHOLDS
    assert gc.get_freeze_count() >= len(survivor)
    assert gc.isenabled()


def test_a_second_call_changes_nothing() -> None:
    """Idempotent: a later call neither freezes the objects made since (they would never be
    collected) nor changes the thresholds."""
    gc.unfreeze()
    tune_gc_for_many_sessions()
    frozen = gc.get_freeze_count()
    later = [[i] for i in range(1000)]  # a session's objects, made after start-up
    assert tune_gc_for_many_sessions() == GC_THRESHOLDS
    assert gc.get_freeze_count() == frozen
    assert gc.get_threshold() == GC_THRESHOLDS
    assert len(later) == 1000


def test_the_thresholds_are_sane() -> None:
    """Three positive counts, the first well above Python's own (that is the point), the
    others at least Python's 10, none so large that garbage could pile up unbounded."""
    first, second, third = GC_THRESHOLDS
    assert PYTHON_DEFAULT_GEN0 < first <= 1_000_000
    assert 10 <= second <= 1_000
    assert 10 <= third <= 1_000


def test_it_is_public_and_documented() -> None:
    """Exported from the package root, named there, with a docstring that says when to call
    it and what it sets."""
    assert tune_gc_for_many_sessions.__module__ == "metacrate_grid_agent"
    assert "tune_gc_for_many_sessions" in metacrate_grid_agent.__all__
    doc = tune_gc_for_many_sessions.__doc__ or ""
    assert "start-up" in doc
    assert "gc.freeze" in doc
