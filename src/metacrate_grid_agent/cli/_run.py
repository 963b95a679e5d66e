"""``grid-agent run`` and ``demo``: a tool-loop session with MCP servers' tools or the sandbox.

::

    grid-agent run --goal TEXT|- [--config FILE | --endpoint URL --api-key-env NAME]
                   [--model-script FILE] [--mcp-config FILE] [--session-id ID]
                   [--approve] [--json] [--transcript FILE] [--journal DIR] [--verbose] [--quiet]
    grid-agent resume DIR [--session-id ID] [the configuration flags of run]
    grid-agent demo [--json] [--transcript FILE] [--verbose]

One :class:`ToolLoop` session toward the goal, with the tools of the configuration's
``[mcp.servers.NAME]`` (:mod:`._mcp`), or without any, the sandbox's (:mod:`._sandbox`).
Without ``--config`` or ``--endpoint`` (and always for ``demo``), the built-in scripted
model (:mod:`._scripted_model`, not a real model) plays on a loopback
:class:`~metacrate_grid_agent.testing.FakeEndpoint`; with ``--model-script FILE``, the
operator's script (:mod:`._model_script`) plays there instead, for any tools. Progress
lines go to stderr, the result to stdout; ``--approve`` asks on the terminal before each
mutating call, ``--transcript`` records the session, ``--journal DIR`` makes it durable (a
:class:`~metacrate_grid_agent.journal.FileJournal` in DIR); ``resume DIR`` resumes every
unfinished session journaled there (or those of ``--session-id``) with the same configuration
and tools, printing each one's result as ``run`` does (with ``--json``, one JSON line each).
Exit 0 when the session (every session resumed) completed, 1 otherwise, 130 or 143 when
Ctrl-C or SIGTERM cancelled it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import re
import secrets
import sys
import time
from collections.abc import Callable, Sequence
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
    Tool,
    ToolExecutor,
    ToolLoop,
    ToolLoopConfig,
    tune_gc_for_many_sessions,
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
from metacrate_grid_agent.cli._mcp import McpTools, open_servers
from metacrate_grid_agent.cli._model_script import ModelScript
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
from metacrate_grid_agent.cli._tracing import CommandTracing, start_tracing
from metacrate_grid_agent.cli._transcript import CLITranscript
from metacrate_grid_agent.config import shown_url
from metacrate_grid_agent.errors import ConfigError, GridAgentError, JournalError
from metacrate_grid_agent.journal import FileJournal, parse_run_id
from metacrate_grid_agent.safety import open_private
from metacrate_grid_agent.testing import FakeEndpoint

__all__ = ["DEMO_GOAL", "cmd_demo", "cmd_resume", "cmd_run"]

#: An operator's ``--session-id``: 1 to 64 characters (the library's bound on a session id)
#: of letters, digits, ".", "_" and "-", the first a letter or digit: printable, no path
#: separator, never "." or "..", so the id can name a file.
SESSION_ID_RULE: Final = re.compile(r"\A[A-Za-z0-9][A-Za-z0-9._-]{0,63}\Z", re.ASCII)
#: Random bytes (shown as hex) in a default session id: two runs in one second differ.
SESSION_ID_RANDOM_BYTES: Final = 4
DEMO_GOAL: Final = (
    "Look around the plaza, walk over to the sign, and greet whoever is nearby. "
    "Finish with a short summary of what you did."
)
SYSTEM_PROMPT: Final = (
    "You drive an avatar in a virtual-world region through the tools you are given. Act one "
    "step at a time, and finish with a short plain-text summary of what you did."
)
#: The one line saying the session's tools are the sandbox's.
SANDBOX_BANNER: Final = (
    "grid-agent: tools: the built-in sandbox region (no [mcp.servers] in the configuration)"
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
    session_id: str | None
    """``run``: the session's id; ``resume --session-id``: only this session's runs (or this
    run), None for every unfinished one."""
    tracing: CommandTracing | None = None
    #: The operator's model script (``--model-script``), played instead of a real model.
    script: ModelScript | None = None
    journal: str | None = None
    """``run --journal DIR`` / ``resume DIR``: the journal directory."""
    resume: bool = False
    """``resume``: resume the unfinished sessions of ``journal`` instead of running one."""


def session_id_arg(value: str | None, *, resume: bool = False) -> str | None:
    """The session's id: ``--session-id`` checked by :data:`SESSION_ID_RULE`, or a new one
    per run (``cli-``, the UTC start, a random part), so that two runs' transcripts and
    traces (``gen_ai.conversation.id``) never share one; for ``resume``, the session (or
    run) to resume, None for all. Raises :class:`UsageError`."""
    if value is None:
        if resume:
            return None
        started = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        return f"cli-{started}-{secrets.token_hex(SESSION_ID_RANDOM_BYTES)}"
    if SESSION_ID_RULE.match(value) is None:
        raise UsageError(
            f"--session-id {output.bounded(value, 80)!r}: use 1 to 64 letters, digits, '.', "
            "'_' or '-', starting with a letter or digit"
        )
    return value


def cmd_demo(args: argparse.Namespace, console: Console) -> int:
    """``grid-agent demo``: ``run`` with the built-in goal and the scripted model."""
    return cmd_run(args, console)


def cmd_resume(args: argparse.Namespace, console: Console) -> int:
    """``grid-agent resume``: ``run``, resuming the journaled sessions of DIR."""
    return cmd_run(args, console)


def cmd_run(args: argparse.Namespace, console: Console) -> int:
    """``grid-agent run``: check the arguments, open the transcript, run the session."""
    if getattr(args, "approve", False) and not sys.stdin.isatty():
        return usage_failure(console, args, NO_TERMINAL)
    resume = args.command == "resume"
    try:
        goal = "" if resume else check_text(text_arg(args.goal), "--goal")
        session_id = session_id_arg(getattr(args, "session_id", None), resume=resume)
        config = agent_config(args, console.redactor)
        script_path = getattr(args, "model_script", None)
        script = None if script_path is None else ModelScript.load(script_path)
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
    # Start-up is done: what an application with many sessions does here, the command does.
    tune_gc_for_many_sessions()
    try:
        tracing = start_tracing(console)
    except (ConfigError, UsageError) as exc:
        if transcript is not None:
            transcript.close()
        message = exc.message if isinstance(exc, ConfigError) else str(exc)
        return usage_failure(console, args, message)
    plan = _RunPlan(
        goal,
        config,
        transcript,
        session_id,
        tracing,
        script,
        journal=getattr(args, "journal", None),
        resume=resume,
    )
    try:
        return asyncio.run(_run(plan, args, console))
    finally:
        if transcript is not None:
            transcript.close()
        if tracing is not None:
            tracing.close(console)


async def _run(plan: _RunPlan, args: argparse.Namespace, console: Console) -> int:
    cancel = CancelToken()
    writer = CLITranscript(plan.transcript, console.redactor)
    stats = output.SessionStats()
    scripted = plan.config is None or plan.script is not None
    tool_loop_config = ToolLoopConfig() if plan.config is None else plan.config.tool_loop
    servers = () if plan.config is None else plan.config.mcp_servers
    world: SandboxWorld | None = None
    mcp: McpTools | None = None
    journal: FileJournal | None = None
    pending: tuple[str, ...] = ()
    if plan.journal is not None:
        secret = Secret(SCRIPTED_KEY) if plan.config is None else plan.config.llm.api_key
        try:
            journal = FileJournal(plan.journal, secret=secret)
            if plan.resume:
                pending = _selected(await journal.pending(), plan.session_id)
        except JournalError as exc:
            return usage_failure(console, args, exc.message)
        if plan.resume and not pending:
            console.err("grid-agent: no unfinished session to resume in the journal directory")
            return EXIT_OK
        if plan.resume and plan.transcript is not None and len(pending) > 1:
            message = f"--transcript records one session; {len(pending)} are unfinished"
            return usage_failure(console, args, message + " (name one with --session-id)")

    def on_event(event: LoopEvent) -> None:
        stats.observe(event)
        if not args.quiet:
            console.err(*output.progress_lines(event))
        writer(event)

    with operator_interrupts(cancel, console):
        async with contextlib.AsyncExitStack() as stack:
            tools: Sequence[Tool]
            executor: ToolExecutor
            if servers:
                try:
                    mcp = await stack.enter_async_context(open_servers(servers, tool_loop_config))
                except UsageError as exc:
                    return usage_failure(console, args, str(exc))
                except GridAgentError as exc:
                    console.err(f"grid-agent: an MCP server did not start: {exc.kind}: {exc}")
                    return EXIT_FAILURE
                tools, executor = mcp.tools, mcp.executor
                tool_lines = [_mcp_banner(mcp), *_skipped_lines(mcp)]
            else:
                tools, sandbox = build_sandbox()
                executor, world = sandbox, sandbox.world
                tool_lines = [SANDBOX_BANNER]
            endpoint: FakeEndpoint | None = None
            if scripted:
                endpoint = FakeEndpoint(
                    responder=respond if plan.script is None else plan.script.respond,
                    lifetime_s=tool_loop_config.max_session_s + SCRIPTED_ENDPOINT_MARGIN_S,
                    strict=False,
                )
                await stack.enter_async_context(endpoint)
                llm = LLMConfig(endpoint_url=endpoint.url, api_key=Secret(SCRIPTED_KEY))
                played_by = (
                    "the built-in SCRIPTED model"
                    if plan.script is None
                    else f"the SCRIPTED model of {output.printable(plan.script.shown)}"
                )
                console.err(
                    f"grid-agent: using {played_by} on a loopback fake endpoint "
                    f"({endpoint.url}): a fixed script, not a real language model"
                )
            else:
                assert plan.config is not None  # noqa: S101 - not scripted: configured
                llm = plan.config.llm
                console.err(f"grid-agent: model endpoint {shown_url(llm.endpoint_url)}")
            console.err(*tool_lines)
            if plan.tracing is not None:
                console.err(plan.tracing.line())
            if not plan.resume:
                console.err(f"grid-agent: goal: {output.bounded(output.printable(plan.goal), 500)}")
            beat = heartbeat(args, console, llm)
            client = await stack.enter_async_context(
                LLMClient(
                    llm,
                    correlation_id=plan.session_id or "grid-agent",
                    on_progress=None if beat is None else beat.on_progress,
                )
            )
            await stack.enter_async_context(beating(beat))
            writer.begin(
                llm=llm,
                scripted=scripted,
                session_id=_session_of(pending[0]) if pending else plan.session_id or "",
                goal=plan.goal or "(resumed from its journal)",
                tools=tools,
                config=tool_loop_config,
                system_prompt=SYSTEM_PROMPT,
                servers=None if mcp is None else mcp.server_of,
            )
            try:
                approve = getattr(args, "approve", False)
                server_of = None if mcp is None else mcp.server_of
                approver = TerminalApprover(console, sys.stdin, server_of) if approve else None
                loop = ToolLoop(
                    client,
                    tools,
                    executor,
                    config=tool_loop_config,
                    system_prompt=SYSTEM_PROMPT,
                    approver=approver,
                )
            except GridAgentError as exc:
                which = "the sandbox tools" if mcp is None else "the MCP servers' tools"
                console.err(f"grid-agent: {which} were refused: {exc.kind}: {exc}")
                return EXIT_FAILURE
            results: list[LoopResult | JournalError] = []

            def sinks_of(generation: SessionGeneration) -> list[Callable[[LoopEvent], None]]:
                if plan.tracing is None:
                    return []
                return [plan.tracing.sink(llm, generation)]

            if not plan.resume:
                generation = SessionGeneration(plan.session_id or "")
                try:
                    result = await loop.run(
                        plan.goal,
                        generation=generation,
                        cancel=cancel,
                        on_event=[on_event, *sinks_of(generation)],
                        journal=journal,
                    )
                except JournalError as exc:
                    console.err(f"grid-agent: {exc.kind}: {output.printable(exc.message)}")
                    results.append(exc)
                else:
                    results.append(result)
            else:
                assert journal is not None  # noqa: S101 - resume has its journal

                def on_resume(
                    run_id: str, generation: SessionGeneration
                ) -> list[Callable[[LoopEvent], None]]:
                    console.err(f"grid-agent: resuming {run_id}")
                    return sinks_of(generation)

                def on_result(run_id: str, result: LoopResult | JournalError) -> None:
                    if isinstance(result, JournalError):
                        console.err(
                            f"grid-agent: {result.kind}: {output.printable(result.message)}"
                        )
                    results.append(result)

                # One session at a time: each one's progress lines stay together.
                await loop.resume_pending(
                    journal,
                    session_id=plan.session_id,
                    concurrency=1,
                    cancel=cancel,
                    on_event=on_event,
                    on_resume=on_resume,
                    on_result=on_result,
                )
        if endpoint is not None and endpoint.failures:
            console.err(f"grid-agent: the built-in endpoint reported: {endpoint.failures[:5]}")
    if plan.script is not None and plan.script.ran_out:
        console.err(output.printable(plan.script.ran_out_line()))
    if writer.error is not None:
        console.err(f"grid-agent: the transcript stopped early: {writer.error}")
    shown = _Shown(world=world, mcp=mcp, scripted=scripted, script=plan.script)
    status = EXIT_OK
    for each in results:
        if isinstance(each, JournalError):
            if args.json:
                console.json(output.error_json(each.kind, each.message))
            status = max(status, EXIT_FAILURE)
            continue
        result = each
        _print_result(console, result, stats, shown, as_json=args.json)
        if result.outcome is Outcome.COMPLETED:
            continue
        if result.outcome is Outcome.CANCELLED and result.cancel_reason in (OPERATOR, SHUTDOWN):
            return cancel_status(result.cancel_reason)
        status = EXIT_FAILURE
    return status


def _selected(pending: Sequence[str], session_id: str | None) -> tuple[str, ...]:
    """The unfinished run ids to resume: all, or those of ``session_id`` (or that run)."""
    if session_id is None:
        return tuple(pending)
    return tuple(r for r in pending if r == session_id or _session_of(r) == session_id)


def _session_of(run_id: str) -> str:
    parsed = parse_run_id(run_id)
    return run_id if parsed is None else parsed[0]


@dataclasses.dataclass(frozen=True, slots=True)
class _Shown:
    """What the session ran against, for its end report: the sandbox or the MCP servers."""

    world: SandboxWorld | None
    mcp: McpTools | None
    scripted: bool
    script: ModelScript | None = None


def _mcp_banner(mcp: McpTools) -> str:
    servers = ", ".join(
        f"{name} ({settings.transport}, {sum(1 for s in mcp.server_of.values() if s == name)})"
        for name, settings in mcp.settings.items()
    )
    return f"grid-agent: tools: {len(mcp.tools)} from MCP servers {servers}; none of the sandbox's"


def _skipped_lines(mcp: McpTools) -> list[str]:
    return [
        f"grid-agent: MCP server {server}: tool {output.bounded(name, 64)} left out: "
        f"{output.bounded(reason, 300)}"
        for server, name, reason in mcp.skipped
    ]


def _print_result(
    console: Console,
    result: LoopResult,
    stats: output.SessionStats,
    shown: _Shown,
    *,
    as_json: bool,
) -> None:
    model = "scripted" if shown.scripted else "endpoint"
    if as_json:
        data = output.result_json(result, model=model)
        if shown.world is not None:
            data["world"] = output.world_json(shown.world)
        if shown.mcp is not None:
            data["tools"] = "mcp"
            data["servers"] = shown.mcp.calls_by_server(result.calls)
        console.json(data)
        return
    if shown.world is not None:
        script = {} if shown.script is None else {"script": f"model script {shown.script.shown}"}
        console.out(
            *output.run_report(result, stats, shown.world, scripted=shown.scripted, **script)
        )
    else:
        assert shown.mcp is not None  # noqa: S101 - one of the two ran the session
        console.out(
            *output.result_report(result, stats),
            "",
            *output.server_lines(shown.mcp.calls_by_server(result.calls)),
        )
