"""The measured side of ``bench_recovery``: a fresh process that resumes a journal directory.

Run as ``python -m benchmarks._recover_child DIR URL CONCURRENCY``, it imports only the
library (its imports count: the clock starts when the process starts), resumes every
unfinished run of DIR with :meth:`ToolLoop.resume_pending` against URL, and prints one JSON
line: the wall clock (``time.time()``) of the first action (the first request a resumed
run sends), of its reply, and of the end (every run ended), the outcomes, and its CPU time.
"""

from __future__ import annotations

import asyncio
import collections
import json
import os
import resource
import sys
import time

from metacrate_grid_agent import (
    CancelToken,
    Effect,
    LLMClient,
    LLMConfig,
    LoopEvent,
    Secret,
    Success,
    Tool,
    ToolLoop,
    ToolLoopConfig,
    ValidatedCall,
    tune_gc_for_many_sessions,
)
from metacrate_grid_agent.journal import FileJournal

#: The key of the benchmark's sessions (the loopback server checks none).
KEY = "sk-bench-recovery"
#: The loop's settings on both sides: room for the 17th turn, and a day of downtime (the
#: rounds of the largest size resume journals written many minutes before).
CONFIG = ToolLoopConfig(max_turns=24, max_session_s=86400.0)
SYSTEM_PROMPT = "You are Ada, a guide avatar. Walk where you are asked, in small steps."
MOVE_TO = Tool(
    name="move_to",
    description="Walk the avatar to a point in the region.",
    parameters={
        "type": "object",
        "properties": {"x": {"type": "integer"}, "y": {"type": "integer"}},
        "required": ["x", "y"],
        "additionalProperties": False,
    },
    effect=Effect.READ_ONLY,
)


class Walker:
    """An executor whose moves succeed at once."""

    async def execute(self, call: ValidatedCall, cancel: CancelToken) -> Success:
        """Report the move."""
        return Success(f"now at ({call.arguments['x']}, {call.arguments['y']})")


def client_config(url: str) -> LLMConfig:
    """The client both sides use (64 requests in flight, the ceiling)."""
    return LLMConfig(endpoint_url=url, api_key=Secret(KEY), max_concurrent_requests=64)


def _cpu_s() -> float:
    """The process's CPU time so far (user and system), its start and imports included."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def _main(directory: str, url: str, concurrency: int) -> dict[str, object]:
    first: dict[str, float] = {}

    def on_event(event: LoopEvent) -> None:
        # "request" is told right before a request goes out; its "reply" once it came back
        # (an upper bound on when the first action reached the endpoint).
        if event.kind in ("request", "tool_call", "reply") and event.kind not in first:
            first[event.kind] = time.time()
            if event.kind != "reply":
                first["cpu"] = _cpu_s()

    journal = FileJournal(directory, secret=KEY)
    if os.environ.get("RECOVERY_GC") != "default":
        tune_gc_for_many_sessions()  # what a deployment with many sessions does at start-up
    async with LLMClient(client_config(url)) as client:
        loop = ToolLoop(client, [MOVE_TO], Walker(), config=CONFIG, system_prompt=SYSTEM_PROMPT)
        results = await loop.resume_pending(journal, concurrency=concurrency, on_event=on_event)
    end = time.time()
    outcomes = collections.Counter(
        getattr(r, "kind", None) or str(getattr(r, "outcome", "")) for r in results.values()
    )
    return {
        "first_action": min((first.get(k, end) for k in ("request", "tool_call")), default=end),
        "first_reply": first.get("reply", end),
        "end": end,
        "runs": len(results),
        "outcomes": dict(outcomes),
        "first_action_cpu_s": first.get("cpu"),
        "cpu_s": _cpu_s(),
        "max_rss_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
    }


if __name__ == "__main__":
    report = asyncio.run(_main(sys.argv[1], sys.argv[2], int(sys.argv[3])))
    sys.stdout.write(json.dumps(report) + "\n")
