"""Many sessions at once: memory and CPU per session, and superseding them all at once.

Each case runs in a fresh process against the loopback server (its own process):

- run: N concurrent 5-turn sessions (two tool calls per turn, instant tools), with one
  shared client or one client per session. Wall time, CPU per turn, peak RSS growth
  (``VmHWM``, reset through ``/proc/self/clear_refs``), memory per session (that growth / N)
  and full garbage-collector passes; with a shared client also after
  ``tune_gc_for_many_sessions()`` (``run-tuned-gc``), at every size.
- supersede: N sessions brought mid-request (the server holds every request) or mid-tool
  (the executor waits), then every session's ``SessionGeneration.advance()`` at once. CPU
  per cancellation (from the first ``advance()`` until every ``run()`` returned, / N) and
  the p50/p99 latency from a session's ``advance()`` to its ``run()`` returning.

Run alone: ``uv run --locked python -m benchmarks.bench_scale [--sessions N ...]``.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import gc
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks import _scenario
from benchmarks._server import serve
from benchmarks.bench_loop import MOVE_TO, InstantExecutor
from metacrate_grid_agent import (
    CancelToken,
    LLMClient,
    LLMConfig,
    LoopEvent,
    Secret,
    SessionGeneration,
    Success,
    ToolLoop,
    ValidatedCall,
    tune_gc_for_many_sessions,
)

TURNS = 5
KIB = 1024


class WaitingExecutor:
    """An executor whose tools wait until cancelled (a session held mid-tool)."""

    def __init__(self) -> None:
        self.started = 0

    async def execute(self, call: ValidatedCall, cancel: CancelToken) -> Success:
        """Wait for the token."""
        self.started += 1
        await cancel.wait()
        return Success("interrupted")


def _status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"no {field} in /proc/self/status")


def _reset_peak() -> int:
    """Reset the kernel's RSS high-water mark to the current RSS; return that, in KiB."""
    Path("/proc/self/clear_refs").write_text("5")
    return _status_kib("VmRSS")


def _full_passes() -> int:
    return int(gc.get_stats()[2]["collections"])


def _clients(url: str, sessions: int, shared: bool) -> list[LLMClient]:
    if shared:
        config = LLMConfig(endpoint_url=url, api_key=Secret("sk-bench"), max_concurrent_requests=64)
        return [LLMClient(config)]
    config = LLMConfig(endpoint_url=url, api_key=Secret("sk-bench"), max_concurrent_requests=1)
    return [LLMClient(config) for _ in range(sessions)]


async def _run(origin: str, sessions: int, shared: bool, tuned_gc: bool) -> dict[str, Any]:
    url = f"{origin}/loop/{TURNS}/v1/chat/completions"
    clients = _clients(url, sessions, shared)
    loops = [
        ToolLoop(client, [MOVE_TO], InstantExecutor(), system_prompt=_scenario.SYSTEM_PROMPT)
        for client in clients
    ]
    if tuned_gc:
        _tune_gc()
    rss_before = _reset_peak()
    passes = _full_passes()
    wall, cpu = time.perf_counter(), time.process_time()
    results = await asyncio.gather(
        *(
            loops[i % len(loops)].run(_scenario.LOOP_GOAL, generation=SessionGeneration(f"s{i}"))
            for i in range(sessions)
        )
    )
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    growth = (_status_kib("VmHWM") - rss_before) * KIB
    for client in clients:
        await client.aclose()
    outcomes = collections.Counter(
        str(result.outcome) + ("" if result.error is None else f" ({result.error.kind})")
        for result in results
    )
    return {
        "completed": outcomes["completed"],
        "outcomes": dict(outcomes),
        "wall_s": wall,
        "cpu_us_per_turn": cpu / (sessions * TURNS) * 1e6,
        "rss_growth": growth,
        "memory_per_session": growth / sessions,
        "full_gc_passes": _full_passes() - passes,
    }


def _tune_gc() -> None:
    """What a large deployment calls once start-up is done: the library's helper."""
    tune_gc_for_many_sessions()


async def _supersede(
    origin: str, sessions: int, shared: bool, where: str, tuned_gc: bool
) -> dict[str, Any]:
    if tuned_gc:
        _tune_gc()
    path = "stall" if where == "request" else f"loop/{TURNS}"
    url = f"{origin}/{path}/v1/chat/completions"
    clients = _clients(url, sessions, shared)
    executor = WaitingExecutor()
    loops = [
        ToolLoop(client, [MOVE_TO], executor, system_prompt=_scenario.SYSTEM_PROMPT)
        for client in clients
    ]
    generations = [SessionGeneration(f"s{i}") for i in range(sessions)]
    requested = 0

    def on_event(event: LoopEvent) -> None:
        nonlocal requested
        if event.kind == "request":
            requested += 1

    loop = asyncio.get_running_loop()
    returned = [0.0] * sessions
    returned_cpu = [0.0] * sessions

    async def one(i: int) -> str:
        result = await loops[i % len(loops)].run(
            _scenario.LOOP_GOAL, generation=generations[i], on_event=on_event
        )
        returned[i], returned_cpu[i] = loop.time(), time.process_time()
        return str(result.outcome)

    tasks = [asyncio.create_task(one(i)) for i in range(sessions)]
    started = time.perf_counter()
    while (requested if where == "request" else executor.started) < sessions:
        await asyncio.sleep(0.05)
        if time.perf_counter() - started > 300:
            raise RuntimeError("the sessions never all reached the point to supersede")
    await asyncio.sleep(0.5)  # let the last requests reach the server
    everything = asyncio.gather(*tasks)
    advanced = [0.0] * sessions
    cpu = time.process_time()
    for i, generation in enumerate(generations):
        advanced[i] = loop.time()
        generation.advance()
    outcomes = await everything
    cpu_end = time.process_time()
    for client in clients:
        await client.aclose()
    latencies = sorted(r - a for r, a in zip(returned, advanced, strict=True))
    # The same latency on this process's CPU clock: what it would be on a core of its own.
    cpu_latencies = sorted(r - cpu for r in returned_cpu)
    return {
        "superseded": sum(outcome == "superseded" for outcome in outcomes),
        "cpu_us_per_cancellation": (cpu_end - cpu) / sessions * 1e6,
        "p50_ms": statistics.median(latencies) * 1e3,
        "p99_ms": _p99(latencies) * 1e3,
        "cpu_clock_p50_ms": statistics.median(cpu_latencies) * 1e3,
        "cpu_clock_p99_ms": _p99(cpu_latencies) * 1e3,
    }


def _p99(values: list[float]) -> float:
    return values[min(len(values) - 1, int(len(values) * 0.99))]


def _case(origin: str, kind: str, sessions: int, shared: bool) -> dict[str, Any]:
    if kind.startswith("run"):
        return asyncio.run(_run(origin, sessions, shared, tuned_gc=kind == "run-tuned-gc"))
    where = kind.removeprefix("supersede-").removesuffix("-tuned-gc")
    return asyncio.run(
        _supersede(origin, sessions, shared, where, tuned_gc=kind.endswith("-tuned-gc"))
    )


CASES = ("run", "supersede-request", "supersede-tool")


def measure(origin: str, *, sizes: tuple[int, ...], per_session: bool) -> list[dict[str, Any]]:
    """Every case and size, each in a fresh process."""
    rows = []
    for sessions in sizes:
        for shared in (True, False) if per_session else (True,):
            kinds: tuple[str, ...] = CASES
            if shared:
                kinds += ("run-tuned-gc",)
            if shared and sessions == max(sizes):
                kinds += ("supersede-request-tuned-gc",)
            for kind in kinds:
                done = subprocess.run(  # noqa: S603 - our own module, fixed arguments
                    [
                        sys.executable,
                        "-m",
                        "benchmarks.bench_scale",
                        "--case",
                        origin,
                        kind,
                        str(sessions),
                        "shared" if shared else "per-session",
                    ],
                    capture_output=True,
                    text=True,
                    check=True,
                    timeout=1200,
                )
                row = {"case": kind, "sessions": sessions, "shared_client": shared}
                rows.append(row | json.loads(done.stdout.splitlines()[-1]))
    return rows


def main() -> None:
    """Run every case (or one, with ``--case``) and print the figures."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", nargs=4, metavar=("ORIGIN", "KIND", "SESSIONS", "CLIENT"))
    parser.add_argument("--sessions", type=int, nargs="+", default=[100, 1000, 10000])
    parser.add_argument("--shared-only", action="store_true")
    args = parser.parse_args()
    if args.case:
        origin, kind, sessions, client = args.case
        print(json.dumps(_case(origin, kind, int(sessions), client == "shared")))
        return
    with serve() as origin:
        rows = measure(origin, sizes=tuple(args.sessions), per_session=not args.shared_only)
    for row in rows:
        print(json.dumps(row))


if __name__ == "__main__":
    main()
