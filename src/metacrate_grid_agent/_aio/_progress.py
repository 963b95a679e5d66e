"""Progress of a call in flight, for a caller that shows it: attempts, phases, retries.

:class:`LLMClient` takes ``on_progress=``, a plain callable receiving :class:`ProgressEvent`
values. Without one, nothing here runs: the connection pool gets no phase callback and no
event is built. With one, the client reports each attempt's start, the phase it is in
(connecting, waiting for the response headers, reading the body, reported by the
connection's own events), each retry with its reason and delay, and the end of the call.

The hook is called on the event loop's thread, synchronously: it must return quickly and
must not raise (an exception from it is logged and ignored, never turned into a failed
call). Events carry no header, body or key: only ids, counts, kinds and times.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

__all__ = ["ProgressEvent", "ProgressHook"]

logger = logging.getLogger("metacrate_grid_agent")

#: What a progress event reports.
ProgressKind = Literal["attempt", "phase", "retry", "end"]
#: Where an attempt is: making a new connection (TCP and TLS), request sent and waiting for
#: the response headers, headers in and reading the body.
Phase = Literal["connecting", "waiting_for_headers", "reading_body"]


@dataclass(frozen=True, slots=True, kw_only=True)
class ProgressEvent:
    """One step of a call in flight (see :class:`LLMClient`'s ``on_progress``).

    ``kind``:

    - ``"attempt"``: attempt ``attempt`` starts (1 for the first).
    - ``"phase"``: the attempt entered ``phase`` (``"connecting"`` only when a new
      connection is made; a reused one goes straight to ``"waiting_for_headers"``).
    - ``"retry"``: attempt ``attempt`` failed with ``reason`` (an error kind, with the HTTP
      status when there was one) and the next starts after ``delay_s`` seconds.
    - ``"end"``: the call is over (success, failure or cancellation).

    ``elapsed_s`` is the time since the call started, retries and waits included.
    """

    kind: ProgressKind
    request_id: str
    attempt: int
    elapsed_s: float
    phase: Phase | None = None
    reason: str | None = None
    delay_s: float | None = None


#: The type of ``on_progress``: called with each event, on the event loop's thread.
ProgressHook = Callable[[ProgressEvent], None]


class Progress:
    """The client's side of a progress hook: which attempt each call is on, and emission."""

    __slots__ = ("_calls", "_hook", "_loop_time")

    def __init__(self, hook: ProgressHook) -> None:
        if not callable(hook):
            raise TypeError("on_progress must be a callable taking a ProgressEvent")
        self._hook = hook
        self._calls: dict[str, tuple[int, float]] = {}  # request id -> (attempt, started)

    def _emit(self, event: ProgressEvent) -> None:
        try:
            self._hook(event)
        except Exception:  # a display callback must never fail the call it watches
            logger.exception("the on_progress hook raised; ignored")

    @staticmethod
    def _now() -> float:
        return asyncio.get_running_loop().time()

    def attempt(self, request_id: str, attempt: int, started: float) -> None:
        """Attempt ``attempt`` of the call ``request_id`` (started at ``started``) begins."""
        self._calls[request_id] = (attempt, started)
        self._emit(ProgressEvent(kind="attempt", request_id=request_id, attempt=attempt,
                                 elapsed_s=self._now() - started))  # fmt: skip

    def retry(self, request_id: str, reason: str, delay_s: float) -> None:
        """The current attempt failed with ``reason``; the next starts after ``delay_s``."""
        attempt, started = self._calls.get(request_id, (0, self._now()))
        self._emit(ProgressEvent(kind="retry", request_id=request_id, attempt=attempt,
                                 elapsed_s=self._now() - started, reason=reason,
                                 delay_s=delay_s))  # fmt: skip

    def end(self, request_id: str) -> None:
        """The call is over."""
        found = self._calls.pop(request_id, None)
        if found is not None:
            attempt, started = found
            self._emit(ProgressEvent(kind="end", request_id=request_id, attempt=attempt,
                                     elapsed_s=self._now() - started))  # fmt: skip

    def phase(self, request_id: str | None, phase: Phase) -> None:
        """The current attempt of ``request_id`` entered ``phase``."""
        found = None if request_id is None else self._calls.get(request_id)
        if request_id is None or found is None:
            return
        attempt, started = found
        self._emit(ProgressEvent(kind="phase", request_id=request_id, attempt=attempt,
                                 elapsed_s=self._now() - started, phase=phase))  # fmt: skip
