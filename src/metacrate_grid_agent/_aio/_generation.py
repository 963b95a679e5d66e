"""``SessionGeneration``: the generation counter of one avatar session.

Replacing the avatar session (:meth:`SessionGeneration.advance`) supersedes every tool-loop
run bound to an older generation: their tokens are cancelled with :data:`SUPERSEDED`.
"""

from __future__ import annotations

import re
from typing import Final

from metacrate_grid_agent._aio._cancel import CancelToken
from metacrate_grid_agent.errors import InvalidMessageError

__all__ = ["SUPERSEDED", "SessionGeneration"]

#: Reason given to the tokens of a generation that a newer one replaced.
SUPERSEDED: Final = "superseded"
_SESSION_ID: Final = re.compile(r"\A[A-Za-z0-9._:-]{1,64}\Z", re.ASCII)
#: Most sessions (runs) bound to one generation at once.
MAX_RUNS_PER_GENERATION: Final = 64


class SessionGeneration:
    """The generation counter of one avatar session. It only grows.

    :meth:`advance` (avatar-session replacement) supersedes every run of older generations:
    their in-flight request or executor call is cancelled, and any late result is discarded.
    """

    __slots__ = ("_current", "_runs", "_started", "session_id")

    def __init__(self, session_id: str, *, start: int = 0) -> None:
        if not isinstance(session_id, str) or _SESSION_ID.match(session_id) is None:
            raise InvalidMessageError("session id must be 1 to 64 of letters, digits and . _ : -")
        if isinstance(start, bool) or not isinstance(start, int) or start < 0:
            raise InvalidMessageError("start generation must be a non-negative int")
        self.session_id = session_id
        self._current = start
        self._runs: dict[CancelToken, int] = {}
        self._started = 0

    @property
    def current(self) -> int:
        """The current generation."""
        return self._current

    def is_current(self, generation: int) -> bool:
        """Whether ``generation`` is still the current one."""
        return generation == self._current

    def advance(self) -> int:
        """Start a new generation, superseding (cancelling) every run of the older ones."""
        self._current += 1
        self._started = 0
        runs, self._runs = self._runs, {}
        for token, generation in runs.items():
            if generation < self._current:
                token.cancel(SUPERSEDED)
            else:  # pragma: no cover - a run is never newer than the current generation
                self._runs[token] = generation
        return self._current

    def _claim_run(self) -> int:
        """The next run's sequence number within the current generation (from 1)."""
        self._started += 1
        return self._started

    def _bind(self, generation: int, token: CancelToken) -> None:
        if generation != self._current:
            token.cancel(SUPERSEDED)
            return
        if len(self._runs) >= MAX_RUNS_PER_GENERATION:
            raise RuntimeError(f"more than {MAX_RUNS_PER_GENERATION} runs in one generation")
        self._runs[token] = generation

    def _unbind(self, token: CancelToken) -> None:
        self._runs.pop(token, None)

    def __repr__(self) -> str:
        return f"SessionGeneration({self.session_id!r}, current={self._current})"
