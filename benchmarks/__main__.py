"""Every benchmark in one run, one table: each figure, its target, met or missed.

Run: ``uv run --locked --group bench python -m benchmarks`` (peers included; without the
``bench`` group their rows say "not installed"). ``--quick`` runs a small subset in seconds
(CI runs it so the benchmarks keep working; it checks no threshold). Results also go to a
JSON file (``--json``, default ``.benchmarks/latest.json``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from benchmarks import (
    bench_history,
    bench_instructions,
    bench_loop,
    bench_memory,
    bench_recovery,
    bench_scale,
    bench_transport,
)
from benchmarks._server import serve
from metacrate_grid_agent import GC_THRESHOLDS

KIB = 1024


@dataclass
class Figure:
    """One row of the table."""

    figure: str
    measured: str
    target: str
    met: bool | None  # None: informative, or not measured in this run


def _x(value: float) -> str:
    return f"{value:.2f}x"


#: The unit each target below is stated in: a verdict compares that unit only. Without
#: instruction counts (``--quick``, ``--no-callgrind``), an instruction target has none.
INSTRUCTIONS = "instructions (callgrind)"


def _transport_rows(t: dict[str, Any], counts: dict[str, float] | None) -> list[Figure]:
    """The per-request rows: CPU ratios (informative on a shared machine, where they spread
    by tens of percent between rounds), and the instruction ratios the targets are stated
    in, when callgrind counted them."""
    ours, as_ours = t["ours"], t["aiohttp as ours"]
    rows = [
        *(
            Figure(
                f"{name} (prebuilt bytes): CPU per request vs raw aiohttp",
                f"{t[name]['cpu_us_median']:.0f} us, {_x(t[name]['ratio_vs_raw_median'])}",
                "informative",
                None,
            )
            for name in ("hand-written floor", "streams floor")
        ),
        Figure(
            "raw aiohttp: CPU per request",
            f"{t['raw aiohttp']['cpu_us_median']:.0f} us",
            "informative",
            None,
        ),
    ]
    measured = f"CPU {_x(ours['ratio_vs_raw_median'])} ({ours['cpu_us_median']:.0f} us)"
    verdict = None
    if counts:
        instructions = counts["ours"] / counts["raw aiohttp"]
        measured += f"; instructions {_x(instructions)} ({counts['ours']:,.0f})"
        verdict = instructions <= 0.5
    rows.append(
        Figure(
            "ours: client instructions per request vs raw aiohttp",
            measured,
            f"<= 0.50x {INSTRUCTIONS}",
            verdict,
        )
    )
    if counts:
        floor = counts["ours"] / counts["hand-written floor"]
        rows.append(
            Figure(
                "ours vs the hand-written floor: instructions per request",
                f"{_x(floor)} ({counts['hand-written floor']:,.0f})",
                f"<= 2.00x {INSTRUCTIONS}",
                floor <= 2.0,
            )
        )
    measured = f"CPU {_x(as_ours['paired_with_ours_median'])}"
    if counts:
        measured += f"; instructions {_x(counts['ours'] / counts['aiohttp as ours'])}"
    rows.append(Figure("ours vs aiohttp configured as ours", measured, "informative", None))
    for name, target, bound in (
        ("httpx", "informative", None),
        ("openai SDK", f">= {SDK_RATIO_TARGET}x {INSTRUCTIONS}", float(SDK_RATIO_TARGET)),
    ):
        peer = t[name]
        if not peer["installed"]:
            rows.append(Figure(f"{name}: per request vs ours", "not installed", target, None))
            continue
        measured = f"CPU {_x(peer['paired_with_ours_median'])}"
        met = None
        if counts and name in counts:
            ratio = counts[name] / counts["ours"]
            measured += f"; instructions {_x(ratio)} ({counts[name]:,.0f})"
            met = None if bound is None else ratio >= bound
        rows.append(Figure(f"{name}: per request vs ours", measured, target, met))
    return rows


#: The SDK target (issue 29): the openai SDK at least this many times our instructions per
#: request.
SDK_RATIO_TARGET = 250


#: The history target: a request at 200 messages at most this many times one at 10.
HISTORY_TARGET = 1.2


def _history_rows(cpu: dict[str, float], counts: dict[str, float] | None) -> list[Figure]:
    """Per request at 200 history messages against 10: the target is in instructions (CPU
    is shown, informative, when they were not counted)."""
    figures, unit = (cpu, "CPU") if counts is None else (counts, "instructions")
    long, short = f"{bench_history.LONG} messages", f"{bench_history.SHORT} messages"
    rows = []
    for suffix, target in (
        ("", f"<= {HISTORY_TARGET:.2f}x {INSTRUCTIONS}"),
        (", whole history", "informative"),
    ):
        ratio = figures[long + suffix] / figures[short + suffix]
        how = "with the session's HistoryEncoder" if not suffix else "encoded whole every turn"
        rows.append(
            Figure(
                f"per request, {long} vs {short}, {how}",
                f"{unit} {_x(ratio)} ({figures[long + suffix]:,.0f} vs "
                f"{figures[short + suffix]:,.0f})",
                target,
                ratio <= HISTORY_TARGET if not suffix and counts is not None else None,
            )
        )
    return rows


def _memory_rows(memory: list[dict[str, Any]]) -> list[Figure]:
    rows = []
    ours = [row for row in memory if row["cap"]]
    worst = max(row["bytes_read"] - row["cap"] for row in ours)
    rows.append(
        Figure(
            "bytes read past max_response_bytes (worst of ours, every hostile body)",
            f"cap + {worst / KIB:.0f} KiB",
            "<= cap + 64 KiB",
            worst <= 64 * KIB,
        )
    )
    for row in memory:
        past = f"cap + {(row['bytes_read'] - row['cap']) / KIB:.0f} KiB" if row["cap"] else (
            f"{row['bytes_read'] / KIB:,.0f} KiB ({row['outcome']})"
        )  # fmt: skip
        rows.append(
            Figure(
                f"{row['body']}, {row['client']}: read, traced peak, RSS growth",
                f"{past}; {row['traced_peak'] / KIB:,.0f} KiB; "
                f"{row['rss_hwm_growth'] / KIB:,.0f} KiB",
                "informative",
                None,
            )
        )
    return rows


#: The loop's own instructions per tool turn at most: issue 29's target (about half of the
#: 447k to 496k it measured), counted over the stub client.
LOOP_INSTRUCTIONS_TARGET = 250_000
#: Agent frameworks' CPU per turn at least this many times ours (issue 29).
FRAMEWORK_RATIO_TARGET = 100
#: Memory per session at 10,000 sessions at most this many KiB (issue 29).
MEMORY_PER_SESSION_KIB = 24
#: CPU per turn at 10,000 sessions at most this many times that at 100, with the GC helper.
SCALE_RATIO_TARGET = 1.10


def _loop_rows(loop: dict[str, Any], instructions: float | None) -> list[Figure]:
    own = loop["own_cpu_us_per_turn_median"]
    rows = [
        Figure(
            "ToolLoop's own CPU per turn (2 tool calls, HTTP excluded)",
            f"{own:.0f} us",
            "<= 60 us",
            own <= 60,
        ),
        Figure(
            "ours, whole stack: CPU per turn",
            f"{loop['stacks']['ours']['cpu_us_per_turn_median']:.0f} us",
            "informative",
            None,
        ),
    ]
    if instructions is not None:
        rows.append(
            Figure(
                "ToolLoop's own instructions per tool turn (callgrind)",
                f"{instructions:,.0f}",
                f"<= {LOOP_INSTRUCTIONS_TARGET:,}",
                instructions <= LOOP_INSTRUCTIONS_TARGET,
            )
        )
    for name in ("openai-agents", "pydantic-ai"):
        row = loop["stacks"][name]
        if row["installed"]:
            ratio = row["ratio_vs_ours_median"]
            measured = f"{ratio:.1f}x ({row['cpu_us_per_turn_median']:,.0f} us)"
            target = f">= {FRAMEWORK_RATIO_TARGET}x"
            met = ratio >= FRAMEWORK_RATIO_TARGET
            rows.append(Figure(f"{name}: CPU per turn vs ours", measured, target, met))
        else:
            target = f">= {FRAMEWORK_RATIO_TARGET}x"
            rows.append(Figure(f"{name}: CPU per turn vs ours", "not installed", target, None))
    return rows


def _scale_rows(scale: list[dict[str, Any]]) -> list[Figure]:
    rows = []
    for row in scale:
        client = "shared client" if row["shared_client"] else "client per session"
        n = row["sessions"]
        if row["case"].startswith("run"):
            per = row["memory_per_session"] / KIB
            gated = row["shared_client"] and n >= 10000 and row["case"] == "run"
            target = f"<= {MEMORY_PER_SESSION_KIB} KiB" if gated else "informative"
            tuned = ", gc tuned" if row["case"] == "run-tuned-gc" else ""
            done = "" if row["completed"] == n else f", {row['completed']:,} completed"
            rows.append(
                Figure(
                    f"{n:,} sessions, {client}{tuned}: memory per session",
                    f"{per:.1f} KiB (wall {row['wall_s']:.1f} s, "
                    f"{row['cpu_us_per_turn']:.0f} us/turn, {row['full_gc_passes']} full GC{done})",
                    target,
                    per <= MEMORY_PER_SESSION_KIB if target != "informative" else None,
                )
            )
        else:
            where = row["case"].removeprefix("supersede-").removesuffix("-tuned-gc")
            gated = row["shared_client"] and n >= 10000 and row["case"] == "supersede-request"
            if row["case"].endswith("-tuned-gc"):
                client += ", gc tuned"
            cpu, p99 = row["cpu_us_per_cancellation"], row["p99_ms"]
            rows.append(
                Figure(
                    f"{n:,} superseded mid-{where}, {client}: CPU each; p50/p99",
                    f"{cpu:.0f} us; {row['p50_ms']:.0f}/{p99:.0f} ms wall, "
                    f"{row['cpu_clock_p50_ms']:.0f}/{row['cpu_clock_p99_ms']:.0f} ms CPU clock",
                    "<= 40 us; p99 <= 400 ms" if gated else "informative",
                    (cpu <= 40 and p99 <= 400) if gated else None,
                )
            )
    runs = {r["sessions"]: r for r in scale if r["case"] == "run" and r["shared_client"]}
    tuned_runs = {r["sessions"]: r for r in scale if r["case"] == "run-tuned-gc"}
    if len(runs) >= 2:
        small, large = runs[min(runs)], runs[max(runs)]
        ratio = large["cpu_us_per_turn"] / small["cpu_us_per_turn"]
        rows.append(
            Figure(
                f"CPU per turn at {max(runs):,} sessions vs {min(runs):,} (shared client)",
                f"{large['cpu_us_per_turn']:.0f} vs {small['cpu_us_per_turn']:.0f} us "
                f"({_x(ratio)})",
                "informative",
                None,
            )
        )
    if len(tuned_runs) >= 2:
        small, large = tuned_runs[min(tuned_runs)], tuned_runs[max(tuned_runs)]
        ratio = large["cpu_us_per_turn"] / small["cpu_us_per_turn"]
        rows.append(
            Figure(
                f"the same after tune_gc_for_many_sessions() {GC_THRESHOLDS}",
                f"{large['cpu_us_per_turn']:.0f} vs {small['cpu_us_per_turn']:.0f} us "
                f"({_x(ratio)})",
                f"<= {SCALE_RATIO_TARGET:.2f}x",
                ratio <= SCALE_RATIO_TARGET,
            )
        )
    return rows


def _recovery_rows(recovery: list[dict[str, Any]]) -> list[Figure]:
    """Per size: the first action and the whole recovery, from the fresh process's spawn."""
    rows = []
    for row in recovery:
        n = row["sessions"]
        first, reply = row["first_action_s_median"], row["first_reply_s_median"]
        spread = f"{min(row['first_action_s']):.2f} to {max(row['first_action_s']):.2f}"
        rows.append(
            Figure(
                f"recovery of {n:,} sessions ({row['turns']} turns): first action from start",
                f"{first:.2f} s ({spread}; CPU {row['first_action_cpu_s_median']:.2f} s; "
                f"its reply {reply:.2f} s)",
                f"<= {bench_recovery.FIRST_ACTION_S:.0f} s",
                first <= bench_recovery.FIRST_ACTION_S,
            )
        )
        gated = n >= 10000
        every = row["all_s_median"]
        rows.append(
            Figure(
                f"recovery of {n:,} sessions ({row['turns']} turns): every session ended",
                f"{every:.1f} s ({min(row['all_s']):.1f} to {max(row['all_s']):.1f}; "
                f"CPU {statistics.median(row['cpu_s']):.1f} s)",
                f"<= {bench_recovery.ALL_10K_S:.0f} s" if gated else "informative",
                every <= bench_recovery.ALL_10K_S if gated else None,
            )
        )
    return rows


def _print(rows: list[Figure]) -> None:
    width = max(len(row.figure) for row in rows)
    measured = max(len(row.measured) for row in rows)
    target = max(len(row.target) for row in rows)
    print(f"{'figure':<{width}}  {'measured':<{measured}}  {'target':<{target}}  result")
    for row in rows:
        verdict = {True: "met", False: "MISSED", None: ""}[row.met]
        if row.met is None and row.target != "informative":
            verdict = "not measured in the target's unit"
        print(
            f"{row.figure:<{width}}  {row.measured:<{measured}}  {row.target:<{target}}  {verdict}"
        )


def main() -> None:
    """Run every benchmark (or the quick subset); print the table; write the JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a small subset, in seconds")
    parser.add_argument("--json", type=Path, default=Path(".benchmarks/latest.json"))
    parser.add_argument("--no-callgrind", action="store_true", help="skip instruction counts")
    parser.add_argument("--sessions", type=int, nargs="+", default=[100, 1000, 10000])
    args = parser.parse_args()
    quick = args.quick
    started = time.perf_counter()
    results: dict[str, Any] = {
        "machine": {
            "python": sys.version.split()[0],
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
            "load_average": os.getloadavg(),
        },
        "quick": quick,
    }
    with serve() as origin:
        url = origin + "/v1/chat/completions"
        transport = bench_transport.measure(
            url, requests=30 if quick else 500, rounds=2 if quick else 7
        )
        counts = history_counts = loop_counts = None
        if not quick and not args.no_callgrind and bench_instructions.available():
            counts = bench_instructions.measure(url, requests=50)
            history_counts = bench_history.instructions(url, requests=20)
            loop_counts = bench_instructions.loop_per_turn(sessions=6)
        history = bench_history.cpu(url, requests=20 if quick else 200)
        memory = bench_memory.measure(origin, quick=quick)
        loop = bench_loop.measure(origin, sessions=1 if quick else 20, rounds=1 if quick else 5)
        scale = bench_scale.measure(
            origin, sizes=(100,) if quick else tuple(args.sessions), per_session=not quick
        )
        recovery = bench_recovery.measure(
            origin,
            sizes=(20,) if quick else tuple(args.sessions),
            rounds=1 if quick else 3,
        )
    results |= {
        "transport": transport,
        "instructions": counts,
        "history": {"cpu_us": history, "instructions": history_counts},
        "memory": memory,
        "loop": loop | {"instructions_per_tool_turn": loop_counts},
        "scale": scale,
        "recovery": recovery,
    }
    rows = (
        _transport_rows(transport, counts)
        + _history_rows(history, history_counts)
        + _memory_rows(memory)
        + _loop_rows(loop, loop_counts)
        + _scale_rows(scale)
        + _recovery_rows(recovery)
    )
    results["table"] = [asdict(row) for row in rows]
    results["machine"]["load_average_after"] = os.getloadavg()
    results["seconds"] = time.perf_counter() - started
    _print(rows)
    if quick:
        print("(quick: a small subset for CI; its figures are not the targets' measurement)")
    elif counts is None:
        print("(no instruction counts: valgrind is not installed or --no-callgrind)")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(results, indent=2) + "\n")
    print(f"results: {args.json} ({results['seconds']:.0f} s)")


if __name__ == "__main__":
    main()
