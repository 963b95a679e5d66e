"""How hard the kept proofs push: fast by default, long when an environment variable asks.

Two knobs, both read once at import:

* ``HYPOTHESIS_PROFILE``: the Hypothesis profile for the whole run. Unset, the suite keeps
  its fast profiles (``ci`` under ``CI``, ``dev`` otherwise: 100 examples a property).
  ``long`` runs at least :data:`LONG_EXAMPLES` examples a property, for the fuzz file::

      HYPOTHESIS_PROFILE=long uv run --locked pytest tests/core/test_fuzz_envelope.py \\
          -p no:cacheprovider --timeout=0

  A property that runs more than the default in the fast tier takes its count from
  :func:`examples`, which the long profile raises to :data:`LONG_EXAMPLES` too.

* ``RACE_PROFILE`` / ``RACE_SEED``: how many tool-loop sessions the race stress runs and from
  which seed. Unset: :data:`FAST_SESSIONS` sessions from :data:`DEFAULT_SEED` (a few
  seconds). ``RACE_PROFILE=long`` runs :data:`LONG_SESSIONS`; ``RACE_SESSIONS=N`` any count;
  ``RACE_SEED=S`` replays the batch a failure printed.

* ``CRASH_PROFILE``: which kill points the crash matrices on a database journal
  (``tests/dbos``) run. Unset: every point between a mutating intent and its result and
  every :data:`CRASH_STRIDE`-th of the others (each point starts database engines in two
  processes, seconds apiece); ``CRASH_PROFILE=long`` runs all of them. The file journal's
  matrix always runs every point.

* ``CRASH_PROFILE`` / ``CRASH_KILLS`` / ``CRASH_SEED``: the random kill profile
  (``tests/journal/test_random_kills.py``): random scripted sessions, each killed at one
  random point and resumed in a new process. Unset: :data:`FAST_KILLS` kills from
  :data:`DEFAULT_SEED`; ``CRASH_PROFILE=long`` runs :data:`LONG_KILLS`; ``CRASH_KILLS=N`` any
  count; ``CRASH_SEED=S`` another batch (a failure names the session's seed)::

      CRASH_PROFILE=long uv run --locked pytest tests/journal/test_random_kills.py \\
          -p no:cacheprovider --timeout=0
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Final

import hypothesis

if TYPE_CHECKING:
    from collections.abc import Collection, Sequence

#: Examples per property under the long profile.
LONG_EXAMPLES: Final = 100_000
#: Sessions of the race stress in CI and by default.
FAST_SESSIONS: Final = 120
#: Sessions of the race stress under ``RACE_PROFILE=long``.
LONG_SESSIONS: Final = 10_000
#: Of the kill points that need no intent, a database matrix runs every this-many-th by default.
CRASH_STRIDE: Final = 4
#: Random kills (one session each) of the random kill profile by default: a few seconds.
FAST_KILLS: Final = 6
#: Random kills under ``CRASH_PROFILE=long`` (the durable sessions' acceptance figure).
LONG_KILLS: Final = 1_000
#: The seed of the default batch (fixed, so CI runs the same sessions every time).
DEFAULT_SEED: Final = 20261130

hypothesis.settings.register_profile(
    "long",
    max_examples=LONG_EXAMPLES,
    deadline=None,
    suppress_health_check=[hypothesis.HealthCheck.too_slow, hypothesis.HealthCheck.data_too_large],
)


def hypothesis_profile(default: str) -> str:
    """The profile named by ``HYPOTHESIS_PROFILE``, else ``default``."""
    return os.environ.get("HYPOTHESIS_PROFILE") or default


def examples(fast: int) -> int:
    """Examples for a property that runs ``fast`` of them by default: the long profile's
    count under ``HYPOTHESIS_PROFILE=long`` (an explicit count would override it)."""
    return LONG_EXAMPLES if os.environ.get("HYPOTHESIS_PROFILE") == "long" else fast


def race_sessions() -> int:
    """How many sessions the race stress runs (``RACE_SESSIONS``, ``RACE_PROFILE``)."""
    if count := os.environ.get("RACE_SESSIONS"):
        return int(count)
    return LONG_SESSIONS if os.environ.get("RACE_PROFILE") == "long" else FAST_SESSIONS


def race_seed() -> int:
    """The seed of the race stress batch (``RACE_SEED``, else :data:`DEFAULT_SEED`)."""
    return int(os.environ.get("RACE_SEED") or DEFAULT_SEED)


def crash_kills() -> int:
    """How many random kills the random kill profile runs (``CRASH_KILLS``, ``CRASH_PROFILE``)."""
    if count := os.environ.get("CRASH_KILLS"):
        return int(count)
    return LONG_KILLS if os.environ.get("CRASH_PROFILE") == "long" else FAST_KILLS


def crash_seed() -> int:
    """The seed of the random kill batch (``CRASH_SEED``, else :data:`DEFAULT_SEED`)."""
    return int(os.environ.get("CRASH_SEED") or DEFAULT_SEED)


def crash_points(points: Sequence[str], always: Collection[str]) -> tuple[str, ...]:
    """The kill points a database crash matrix runs: ``points`` whole under
    ``CRASH_PROFILE=long``; by default those in ``always`` and every :data:`CRASH_STRIDE`-th
    of the rest, in order (a fixed choice: CI runs the same points every time)."""
    if os.environ.get("CRASH_PROFILE") == "long":
        return tuple(points)
    rest = [p for p in points if p not in always]
    sampled = set(rest[::CRASH_STRIDE])
    return tuple(p for p in points if p in always or p in sampled)
