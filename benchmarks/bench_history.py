"""Per request as a session's history grows: 10 against 200 messages, each turn adding two.

A session sends its whole history every turn. ``LLMClient.complete`` with the session's
``HistoryEncoder`` (what ``ToolLoop`` passes) encodes only the messages the last request
did not have; without it, the whole history is encoded every time. Each request is the
next turn of one of ``SESSIONS`` sessions that last sent N - 2 messages: the same objects
again, and two new ones (an assistant tool call and its tool result), as the tool loop
sends them. The reply is the server's one small completion.

Counted in instructions under callgrind (like ``bench_instructions``: N and 3N requests,
the difference over 2N), and in CPU time for ``--quick``.

Run alone: ``uv run --locked python -m benchmarks.bench_history [--requests N]``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
from typing import TYPE_CHECKING, Final

import msgspec

from benchmarks import _scenario, bench_instructions
from benchmarks._server import serve
from benchmarks.bench_transport import SLOTS, Contender, Once, run_requests
from metacrate_grid_agent import (
    AssistantMessage,
    HistoryEncoder,
    LLMClient,
    LLMConfig,
    Message,
    Secret,
    ToolCall,
    ToolMessage,
)

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

#: The two history lengths compared (messages, the system prompt included).
SHORT: Final = 10
LONG: Final = 200
#: Sessions taking turns: at least the requests of a callgrind run (3N, N up to 64), so
#: each request there is one session's first turn at exactly its length. With fewer (64
#: against the default N = 50 before), the 3N run's later turns were longer histories, and
#: the two runs' difference was no longer one request at the stated length. A longer CPU
#: run grows each session by a few messages.
SESSIONS: Final = 192


def _history(length: int) -> list[Message]:
    """``length - 2`` messages: the realistic request's, repeated as new objects."""
    pattern = _scenario.MESSAGES[1:]
    history: list[Message] = [_scenario.MESSAGES[0]]
    while len(history) < length - 2:
        message = pattern[(len(history) - 1) % len(pattern)]
        history.append(type(message)(**msgspec.structs.asdict(message)))
    return history


def _contender(length: int, *, per_session: bool) -> Contender:
    @contextlib.asynccontextmanager
    async def contender(url: str) -> AsyncIterator[Once]:
        # The same client settings as bench_transport's "ours" (at c=1 the slots are idle).
        config = LLMConfig(
            endpoint_url=url, api_key=Secret("sk-bench"), max_concurrent_requests=SLOTS
        )
        prefix = _history(length)
        # SESSIONS sessions, each of which sent `prefix` last; a request is the next turn of
        # one of them (its history grown by two). Each is warmed up here, so the N and 3N
        # runs do the same set-up and it cancels out.
        sessions = [
            (HistoryEncoder() if per_session else None, list(prefix)) for _ in range(SESSIONS)
        ]
        for encoder, history in sessions:
            if encoder is not None:
                encoder.encode(history, _scenario.TOOLS)
        turn = itertools.count()
        async with LLMClient(config) as client:

            async def once() -> object:
                number = next(turn)
                encoder, history = sessions[number % SESSIONS]
                call_id = f"call_{number}"
                history += (
                    AssistantMessage(tool_calls=(ToolCall.create(call_id, "look", "{}"),)),
                    ToolMessage(tool_call_id=call_id, content="a door, closed"),
                )
                return await client.complete(history, _scenario.TOOLS, encoder=encoder)

            yield once

    return contender


#: Every contender: each length, with the session's encoder and without it.
CONTENDERS: dict[str, Contender] = {
    f"{length} messages{suffix}": _contender(length, per_session=not suffix)
    for length in (SHORT, LONG)
    for suffix in ("", ", whole history")
}


def instructions(url: str, *, requests: int) -> dict[str, float]:
    """Instructions per request of each contender (callgrind)."""
    if 3 * requests > SESSIONS:
        raise ValueError(f"at most {SESSIONS // 3} requests: each must be a session's first turn")
    return {
        name: (
            bench_instructions.counted_requests(url, name, 3 * requests)
            - bench_instructions.counted_requests(url, name, requests)
        )
        / (2 * requests)
        for name in CONTENDERS
    }


def cpu(url: str, *, requests: int) -> dict[str, float]:
    """CPU microseconds per request of each contender (after a warm-up)."""
    return {
        name: asyncio.run(run_requests(contender, url, requests, warmup=5)) * 1e6
        for name, contender in CONTENDERS.items()
    }


def main() -> None:
    """Count every contender and print the ratios."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=50, help="N (the long run is 3N)")
    parser.add_argument("--cpu", action="store_true", help="CPU time instead of callgrind")
    args = parser.parse_args()
    with serve() as origin:
        url = origin + "/v1/chat/completions"
        figures = (
            cpu(url, requests=args.requests)
            if args.cpu
            else instructions(url, requests=args.requests)
        )
    unit = "CPU us" if args.cpu else "instructions"
    for name, value in figures.items():
        print(f"{name:<32}{value:>14,.0f} {unit}/request")
    for suffix in ("", ", whole history"):
        ratio = figures[f"{LONG} messages{suffix}"] / figures[f"{SHORT} messages{suffix}"]
        print(f"{LONG} vs {SHORT} messages{suffix}: {ratio:.2f}x")


if __name__ == "__main__":
    main()
