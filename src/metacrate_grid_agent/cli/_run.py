"""``grid-agent run`` and ``demo``: a tool-loop session in the in-memory sandbox region.

::

    grid-agent run --goal TEXT|- [--config FILE | --endpoint URL --api-key-env NAME]
                   [--approve] [--json] [--transcript FILE] [--verbose] [--quiet]
    grid-agent demo [--json] [--transcript FILE] [--verbose]

One :class:`ToolLoop` session toward the goal, with the sandbox's tools (:mod:`._sandbox`).
Without ``--config`` or ``--endpoint`` (and always for ``demo``), the built-in scripted
model (:mod:`._scripted_model`, not a real model) plays on a loopback
:class:`~metacrate_grid_agent.testing.FakeEndpoint`. Progress lines go to stderr, the result
to stdout; ``--approve`` asks on the terminal before each mutating call, ``--transcript``
records the session. Exit 0 when the session completed, 1 otherwise, 130 or 143 when Ctrl-C
or SIGTERM cancelled it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import sys
from typing import IO, Final

from metacrate_grid_agent import (
    AgentConfig,
    CancelToken,
    LLMClient,
    LLMConfig,
    LoopEvent,
    LoopResult,
    Outcome,
    Secret,
    SessionGeneration,
    ToolLoop,
    ToolLoopConfig,
)
from metacrate_grid_agent.cli import _output as output
from metacrate_grid_agent.cli._approve import NO_TERMINAL, TerminalApprover
from metacrate_grid_agent.cli._common import (
    EXIT_FAILURE,
    EXIT_OK,
    UsageError,
    check_text,
    text_arg,
    usage_failure,
)
from metacrate_grid_agent.cli._config import agent_config
from metacrate_grid_agent.cli._output import Console
from metacrate_grid_agent.cli._process import (
    OPERATOR,
    SHUTDOWN,
    beating,
    cancel_status,
    heartbeat,
    operator_interrupts,
)
from metacrate_grid_agent.cli._sandbox import SandboxWorld, build_sandbox
from metacrate_grid_agent.cli._scripted_model import respond
from metacrate_grid_agent.cli._transcript import CLITranscript
from metacrate_grid_agent.config import shown_url
from metacrate_grid_agent.errors import ConfigError, GridAgentError
from metacrate_grid_agent.safety import open_private
from metacrate_grid_agent.testing import FakeEndpoint

__all__ = ["DEMO_GOAL", "cmd_demo", "cmd_run"]

SESSION_ID: Final = "cli-session"
DEMO_GOAL: Final = (
    "Look around the plaza, walk over to the sign, and greet whoever is nearby. "
    "Finish with a short summary of what you did."
)
SYSTEM_PROMPT: Final = (
    "You drive an avatar in a virtual-world region through the tools you are given. Act one "
    "step at a time, and finish with a short plain-text summary of what you did."
)
#: The dummy key of the built-in scripted endpoint (it checks nothing).
SCRIPTED_KEY: Final = "scripted-model-no-key"
#: Extra lifetime of the built-in fake endpoint beyond the session's own wall-clock bound.
SCRIPTED_ENDPOINT_MARGIN_S: Final = 30.0


@dataclasses.dataclass(slots=True)
class _RunPlan:
    goal: str
    config: AgentConfig | None
    transcript: IO[str] | None


def cmd_demo(args: argparse.Namespace, console: Console) -> int:
    """``grid-agent demo``: ``run`` with the built-in goal and the scripted model."""
    return cmd_run(args, console)


def cmd_run(args: argparse.Namespace, console: Console) -> int:
    """``grid-agent run``: check the arguments, open the transcript, run the session."""
    if getattr(args, "approve", False) and not sys.stdin.isatty():
        return usage_failure(console, args, NO_TERMINAL)
    try:
        goal = check_text(text_arg(args.goal), "--goal")
        config = agent_config(args, console.redactor)
        transcript = None
        if args.transcript is not None:
            try:
                transcript = open_private(args.transcript)
            except OSError as exc:
                raise UsageError(
                    f"cannot write transcript {args.transcript!r}: {exc.strerror or exc}"
                ) from None
    except ConfigError as exc:
        return usage_failure(console, args, exc.message)
    except UsageError as exc:
        return usage_failure(console, args, str(exc))
    try:
        return asyncio.run(_run(_RunPlan(goal, config, transcript), args, console))
    finally:
        if transcript is not None:
            transcript.close()


async def _run(plan: _RunPlan, args: argparse.Namespace, console: Console) -> int:
    cancel = CancelToken()
    writer = CLITranscript(plan.transcript, console.redactor)
    stats = output.SessionStats()
    tools, executor = build_sandbox()
    scripted = plan.config is None
    tool_loop_config = ToolLoopConfig() if plan.config is None else plan.config.tool_loop

    def on_event(event: LoopEvent) -> None:
        stats.observe(event)
        if not args.quiet:
            console.err(*output.progress_lines(event))
        writer(event)

    with operator_interrupts(cancel, console):
        async with contextlib.AsyncExitStack() as stack:
            endpoint: FakeEndpoint | None = None
            if plan.config is None:
                endpoint = FakeEndpoint(
                    responder=respond,
                    lifetime_s=tool_loop_config.max_session_s + SCRIPTED_ENDPOINT_MARGIN_S,
                    strict=False,
                )
                await stack.enter_async_context(endpoint)
                llm = LLMConfig(endpoint_url=endpoint.url, api_key=Secret(SCRIPTED_KEY))
                console.err(
                    "grid-agent: using the built-in SCRIPTED model on a loopback fake endpoint "
                    f"({endpoint.url}): a fixed script, not a real language model"
                )
            else:
                llm = plan.config.llm
                console.err(f"grid-agent: model endpoint {shown_url(llm.endpoint_url)}")
            console.err(f"grid-agent: goal: {output.bounded(output.printable(plan.goal), 500)}")
            beat = heartbeat(args, console, llm)
            client = await stack.enter_async_context(
                LLMClient(
                    llm,
                    correlation_id=SESSION_ID,
                    on_progress=None if beat is None else beat.on_progress,
                )
            )
            await stack.enter_async_context(beating(beat))
            writer.begin(
                llm=llm,
                scripted=scripted,
                session_id=SESSION_ID,
                goal=plan.goal,
                tools=tools,
                config=tool_loop_config,
                system_prompt=SYSTEM_PROMPT,
            )
            try:
                approve = getattr(args, "approve", False)
                approver = TerminalApprover(console, sys.stdin) if approve else None
                loop = ToolLoop(
                    client,
                    tools,
                    executor,
                    config=tool_loop_config,
                    system_prompt=SYSTEM_PROMPT,
                    approver=approver,
                )
            except GridAgentError as exc:
                console.err(f"grid-agent: the sandbox tools were refused: {exc.kind}: {exc}")
                return EXIT_FAILURE
            result = await loop.run(
                plan.goal,
                generation=SessionGeneration(SESSION_ID),
                cancel=cancel,
                on_event=on_event,
            )
        if endpoint is not None and endpoint.failures:
            console.err(f"grid-agent: the built-in endpoint reported: {endpoint.failures[:5]}")
    if writer.error is not None:
        console.err(f"grid-agent: the transcript stopped early: {writer.error}")
    _print_result(console, result, stats, executor.world, scripted=scripted, as_json=args.json)
    if result.outcome is Outcome.COMPLETED:
        return EXIT_OK
    if result.outcome is Outcome.CANCELLED and result.cancel_reason in (OPERATOR, SHUTDOWN):
        return cancel_status(result.cancel_reason)
    return EXIT_FAILURE


def _print_result(
    console: Console,
    result: LoopResult,
    stats: output.SessionStats,
    world: SandboxWorld,
    *,
    scripted: bool,
    as_json: bool,
) -> None:
    model = "scripted" if scripted else "endpoint"
    if as_json:
        console.json({**output.result_json(result, model=model), "world": output.world_json(world)})
    else:
        console.out(*output.run_report(result, stats, world, scripted=scripted))
