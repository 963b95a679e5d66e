"""CPU per turn of the tool loop: its own cost, and the whole stack against agent frameworks.

The scenario: a session of 10 tool turns (each reply asks for two calls of ``move_to``) and
a final text reply, served by the loopback server (its own process). Figures are per tool
turn: a session's CPU divided by 10 (the final reply is included in the session).

- loop's own CPU: ``ToolLoop.run`` over a stub client that returns prebuilt completions
  without HTTP, so what remains is the loop (machine, driver, validation, tokens, timers).
- whole stack, same URL: ours (``ToolLoop`` + ``LLMClient``), openai-agents (``Agent`` +
  ``Runner`` with its chat-completions model, tracing off) and pydantic-ai (its OpenAI chat
  model with its own client), alternated over rounds; paired ratios against ours.

Run alone: ``uv run --locked --group bench python -m benchmarks.bench_loop``.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import statistics
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, cast

from benchmarks import _scenario
from benchmarks._server import serve
from metacrate_grid_agent import (
    CancelToken,
    Completion,
    Effect,
    FunctionCall,
    HistoryEncoder,
    LLMClient,
    LLMConfig,
    Message,
    Secret,
    SessionGeneration,
    Success,
    Tool,
    ToolCall,
    ToolDefinition,
    ToolLoop,
    ValidatedCall,
)
from metacrate_grid_agent.journal import FileJournal

MOVE_TO = Tool(
    name="move_to",
    description="Walk the avatar to a point in the region.",
    parameters=_scenario.MOVE_TO_SCHEMA,
    effect=Effect.READ_ONLY,
)
Session = Callable[[], Awaitable[object]]


class InstantExecutor:
    """An executor whose tools succeed at once."""

    async def execute(self, call: ValidatedCall, cancel: CancelToken) -> Success:
        """Report success without doing anything."""
        return Success("moved")


class StubClient:
    """Stands in for ``LLMClient`` without HTTP: the server's replies, prebuilt."""

    def __init__(self, tool_turns: int) -> None:
        self._tool_turns = tool_turns
        self._replies = [
            tuple(
                ToolCall(
                    id=f"call_{turn}_{i}",
                    function=FunctionCall(name="move_to", arguments=f'{{"x":{i},"y":4}}'),
                )
                for i in (1, 2)
            )
            for turn in range(tool_turns)
        ]

    async def complete(
        self,
        messages: Sequence[Message],
        tools: Sequence[ToolDefinition] = (),
        *,
        request_id: str | None = None,
        cancel: CancelToken | None = None,
        attempt_log: list[Any] | None = None,
        encoder: HistoryEncoder | None = None,
    ) -> Completion:
        """The next reply of the scenario, by the turn the loop's request id names.

        Read from the id's ``-t<turn>`` suffix rather than by counting the history's tool
        messages, so the stub's own cost stays out of the loop's figure.
        """
        done = int((request_id or "-t1").rpartition("-t")[2]) - 1
        final = done >= self._tool_turns
        return Completion(
            text="I am next to the lamp." if final else None,
            tool_calls=() if final else self._replies[done],
            minted_call_ids=frozenset(),
            usage=None,
            finish_reason="stop" if final else "tool_calls",
            request_id=request_id or "stub",
            attempts=1,
            latency_s=0.0,
            attempt_records=(),
        )


def own_loop(tool_turns: int, *, journal_dir: str | None = None) -> Session:
    """A session of ``ToolLoop`` over the stub client: the loop's own cost (with
    ``journal_dir``, each session journaled in a ``FileJournal`` there)."""
    loop = ToolLoop(
        cast("LLMClient", StubClient(tool_turns)),
        [MOVE_TO],
        InstantExecutor(),
        system_prompt=_scenario.SYSTEM_PROMPT,
    )
    journal = None if journal_dir is None else FileJournal(journal_dir)
    journaled = SessionGeneration("bench")  # one, so each journaled run has its own run id

    async def session() -> object:
        generation = SessionGeneration("bench") if journal is None else journaled
        result = await loop.run(_scenario.LOOP_GOAL, generation=generation, journal=journal)
        assert result.outcome == "completed", result.outcome
        return result

    return session


def ours(url: str) -> tuple[Session, Callable[[], Awaitable[None]]]:
    """A session of ``ToolLoop`` + ``LLMClient`` at ``url``; and the client's close."""
    client = LLMClient(LLMConfig(endpoint_url=url, api_key=Secret("sk-bench")))
    loop = ToolLoop(client, [MOVE_TO], InstantExecutor(), system_prompt=_scenario.SYSTEM_PROMPT)

    async def session() -> object:
        result = await loop.run(_scenario.LOOP_GOAL, generation=SessionGeneration("bench"))
        assert result.outcome == "completed", result.outcome
        return result

    return session, client.aclose


def openai_agents(url: str) -> tuple[Session, Callable[[], Awaitable[None]]]:
    """openai-agents: ``Agent`` + ``Runner``, chat-completions model, tracing off."""
    import agents  # noqa: PLC0415 - optional peer
    import openai  # noqa: PLC0415

    agents.set_tracing_disabled(True)
    client = openai.AsyncOpenAI(base_url=url, api_key="sk-bench", max_retries=0)

    @agents.function_tool
    async def move_to(x: int, y: int) -> str:
        """Walk the avatar to a point in the region."""
        return "moved"

    agent: Any = agents.Agent(
        name="ada",
        instructions=_scenario.SYSTEM_PROMPT,
        tools=[move_to],
        model=agents.OpenAIChatCompletionsModel(model="bench", openai_client=client),
    )
    config = agents.RunConfig(tracing_disabled=True)

    async def session() -> object:
        return await agents.Runner.run(agent, _scenario.LOOP_GOAL, max_turns=32, run_config=config)

    return session, client.close


def pydantic_ai(url: str) -> tuple[Session, Callable[[], Awaitable[None]]]:
    """pydantic-ai: its OpenAI chat model with its own client at the same URL."""
    import openai  # noqa: PLC0415 - optional peer
    from pydantic_ai import Agent  # noqa: PLC0415
    from pydantic_ai.models.openai import OpenAIChatModel  # noqa: PLC0415
    from pydantic_ai.providers.openai import OpenAIProvider  # noqa: PLC0415

    client = openai.AsyncOpenAI(base_url=url, api_key="sk-bench", max_retries=0)
    model = OpenAIChatModel("bench", provider=OpenAIProvider(openai_client=client))
    agent: Any = Agent(model, system_prompt=_scenario.SYSTEM_PROMPT)

    async def move_to(x: int, y: int) -> str:
        """Walk the avatar to a point in the region."""
        return "moved"

    agent.tool_plain(move_to)

    async def session() -> object:
        return await agent.run(_scenario.LOOP_GOAL)

    return session, client.close


PEERS = {"ours": ours, "openai-agents": openai_agents, "pydantic-ai": pydantic_ai}
PEER_MODULES = {"openai-agents": "agents", "pydantic-ai": "pydantic_ai"}


async def _sessions(make: Callable[[], Session], count: int) -> float:
    session = make()
    await session()  # warm-up
    start = time.process_time()
    for _ in range(count):
        await session()
    return (time.process_time() - start) / count


async def _stack(make: Callable[[str], Any], url: str, count: int) -> float:
    session, close = make(url)
    try:
        return await _sessions(lambda: session, count)
    finally:
        await close()


def measure(origin: str, *, sessions: int, rounds: int) -> dict[str, Any]:
    """The loop's own CPU per turn, and every available stack's, alternated over rounds."""
    turns = _scenario.LOOP_TOOL_TURNS
    own = [
        asyncio.run(_sessions(lambda: own_loop(turns), sessions * 10)) / turns
        for _ in range(rounds)
    ]
    url = f"{origin}/loop/{turns}/v1"
    names = [
        name
        for name in PEERS
        if name not in PEER_MODULES or importlib.util.find_spec(PEER_MODULES[name])
    ]
    per_round: dict[str, list[float]] = {name: [] for name in names}
    for index in range(rounds):
        for name in names[index % len(names) :] + names[: index % len(names)]:
            per_round[name].append(asyncio.run(_stack(PEERS[name], url, sessions)) / turns)
    stacks: dict[str, Any] = {}
    for name in PEERS:
        if name not in per_round:
            stacks[name] = {"installed": False}
            continue
        ratios = [a / b for a, b in zip(per_round[name], per_round["ours"], strict=True)]
        stacks[name] = {
            "installed": True,
            "cpu_us_per_turn_median": statistics.median(per_round[name]) * 1e6,
            "ratio_vs_ours_median": statistics.median(ratios),
            "ratio_vs_ours_range": [min(ratios), max(ratios)],
        }
    return {"own_cpu_us_per_turn_median": statistics.median(own) * 1e6, "stacks": stacks}


def main() -> None:
    """Measure and print."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=20, help="sessions per round")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    with serve() as origin:
        results = measure(origin, sessions=args.sessions, rounds=args.rounds)
    print(f"ToolLoop's own CPU per turn: {results['own_cpu_us_per_turn_median']:.1f} us")
    for name, row in results["stacks"].items():
        if row["installed"]:
            cpu, ratio = row["cpu_us_per_turn_median"], row["ratio_vs_ours_median"]
            print(f"{name:<16}{cpu:>10.1f} us/turn{ratio:>8.1f}x ours")
        else:
            print(f"{name:<16}not installed")


if __name__ == "__main__":
    main()
