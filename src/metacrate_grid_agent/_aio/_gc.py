"""The process's garbage collector, set up for thousands of concurrent sessions.

The collector is the one cost of a session that grows with the number of sessions: each
full pass walks every live object, so with 10,000 sessions in one process every turn pays
for all the others. :func:`tune_gc_for_many_sessions` is what an application calls once,
when its start-up is done: the objects of start-up (modules, configuration, tool schemas)
leave the collector's generations for good, and the thresholds rise so that the young
objects of a turn are collected in larger, rarer batches (BENCHMARKS.md, "Scale").
"""

from __future__ import annotations

import gc
from typing import Final

__all__ = ["GC_THRESHOLDS", "tune_gc_for_many_sessions"]

#: The collector's thresholds for many sessions (Python's own: 700, 10, 10). Generation 0
#: is collected after 50,000 net allocations instead of 700: a turn allocates a few hundred
#: objects, so a young collection serves a hundred turns instead of a few. Generation 1
#: every 20 young passes, generation 2 (the full pass over every session) every 100 passes
#: of generation 1, and then only when a quarter of the long-lived objects are new.
#: Chosen by measurement at 100, 1,000 and 10,000 sessions (BENCHMARKS.md, "Scale").
GC_THRESHOLDS: Final = (50_000, 20, 100)


def tune_gc_for_many_sessions() -> tuple[int, int, int]:
    """Set the garbage collector up for many concurrent sessions; call it once, at start-up.

    Call it when start-up is done (configuration read, clients and tool loops built) and
    before sessions start. It runs ``gc.collect()`` (start-up's garbage goes first), then
    ``gc.freeze()`` (every object left moves to the permanent generation, which no
    collection walks again), and sets the thresholds to :data:`GC_THRESHOLDS` with
    ``gc.set_threshold``. Collection stays enabled: cycles made by sessions are still
    collected, in larger and rarer batches.

    Idempotent: once the thresholds are set and objects are frozen, a later call changes
    nothing (freezing again would pin the objects of running sessions, which then could
    never be collected). ``gc.unfreeze()`` and ``gc.set_threshold`` undo it.

    Returns the thresholds now in effect (:data:`GC_THRESHOLDS`).
    """
    if gc.get_threshold() != GC_THRESHOLDS or gc.get_freeze_count() == 0:
        gc.collect()
        gc.freeze()
        gc.set_threshold(*GC_THRESHOLDS)
    return GC_THRESHOLDS
