"""``grid-agent probe``: send one request to an endpoint and report what happened.

::

    grid-agent probe (--config FILE | --endpoint URL --api-key-env NAME) [--prompt TEXT|-]
                     [--tools FILE] [--sample-tool] [--image FILE] [--json] [--verbose]

One request through :class:`LLMClient`: the report gives the outcome, latency, attempts,
usage, text, tool calls and what the endpoint showed it supports. ``--tools`` reads a JSON
array of tool definitions (every problem reported at once), ``--image`` a PNG, JPEG, GIF
or WebP file (told by its content). Exit 0 when the request succeeded, 1 when it failed.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import dataclasses
import json
from typing import Final

from metacrate_grid_agent import (
    CancelToken,
    ImagePart,
    LLMClient,
    LLMConfig,
    Message,
    TextPart,
    ToolDefinition,
    UserMessage,
)
from metacrate_grid_agent.cli import _output as output
from metacrate_grid_agent.cli._common import (
    EXIT_FAILURE,
    EXIT_OK,
    UsageError,
    check_text,
    text_arg,
    usage_failure,
)
from metacrate_grid_agent.cli._config import agent_config
from metacrate_grid_agent.cli._output import Console, Redactor
from metacrate_grid_agent.cli._process import (
    beating,
    cancel_status,
    heartbeat,
    operator_interrupts,
)
from metacrate_grid_agent.cli._tracing import CommandTracing, start_tracing, untraced
from metacrate_grid_agent.config import shown_url
from metacrate_grid_agent.errors import ConfigError, GridAgentError, InvalidMessageError
from metacrate_grid_agent.safety import read_regular

__all__ = ["DEFAULT_PROMPT", "cmd_probe", "load_image", "load_tools_file", "sniff_image"]

PROBE_CORRELATION_ID: Final = "grid-agent-probe"
DEFAULT_PROMPT: Final = "Reply with one short sentence."
SAMPLE_TOOL_PROMPT: Final = "What time is it? Call the get_time tool to find out."
#: Largest --tools file read: far above any real tool list.
MAX_TOOLS_FILE_BYTES: Final = 256 * 1024
#: Most tools accepted from a --tools file.
MAX_TOOLS: Final = 64
#: Largest --image file: base64 makes it a third larger, within the default prompt cap.
MAX_IMAGE_BYTES: Final = 2 * 1024 * 1024
_IMAGE_MAGIC: Final = (
    (b"\x89PNG\r\n\x1a\n", "png"),
    (b"\xff\xd8\xff", "jpeg"),
    (b"GIF87a", "gif"),
    (b"GIF89a", "gif"),
)
_SAMPLE_TOOL: Final = ToolDefinition.create(
    "get_time",
    "Return the current time of day in the grid, as HH:MM.",
    {"type": "object", "properties": {}, "additionalProperties": False},
)


@dataclasses.dataclass(frozen=True, slots=True)
class _ProbePlan:
    config: LLMConfig
    messages: tuple[Message, ...]
    tools: tuple[ToolDefinition, ...]
    sent_image: bool


def _probe_config(args: argparse.Namespace, redactor: Redactor) -> LLMConfig:
    if args.config is None and args.endpoint is None:
        raise UsageError("name the endpoint: --config FILE, or --endpoint URL --api-key-env NAME")
    config = agent_config(args, redactor)
    assert config is not None  # noqa: S101 - one of the two sources was given
    return config.llm


def _read_bounded(path: str, limit: int, what: str) -> bytes:
    try:
        data = read_regular(path, limit).data
    except OSError as exc:
        raise UsageError(f"cannot read {what} {path!r}: {exc.strerror or exc}") from None
    if len(data) > limit:
        raise UsageError(f"{what} {path!r} is larger than {limit} bytes")
    return data


def load_tools_file(path: str) -> tuple[ToolDefinition, ...]:
    """Tool definitions from a JSON array in the standard envelope; every problem reported."""
    data = _read_bounded(path, MAX_TOOLS_FILE_BYTES, "tools file")
    try:
        document = json.loads(data)
    except (ValueError, RecursionError) as exc:
        raise UsageError(f"tools file {path!r} is not valid JSON ({exc})") from None
    if not isinstance(document, list) or not document:
        raise UsageError(f"tools file {path!r} must hold a non-empty JSON array of tools")
    if len(document) > MAX_TOOLS:
        raise UsageError(f"tools file {path!r} has {len(document)} tools; the limit is {MAX_TOOLS}")
    problems: list[str] = []
    tools: list[ToolDefinition] = []
    for index, item in enumerate(document):
        where = f"[{index}]"
        if not isinstance(item, dict):
            problems.append(f"{where}: must be an object")
            continue
        problems += [
            f"{where}.{k}: unknown member" for k in sorted(set(item) - {"type", "function"})
        ]
        if item.get("type") != "function":
            problems.append(f'{where}.type: must be "function"')
        function = item.get("function")
        if not isinstance(function, dict):
            problems.append(f"{where}.function: must be an object")
            continue
        known = {"name", "description", "parameters"}
        problems += [f"{where}.function.{k}: unknown member" for k in sorted(set(function) - known)]
        name, description = function.get("name"), function.get("description", "")
        parameters = function.get("parameters", {"type": "object", "properties": {}})
        if not isinstance(name, str):
            problems.append(f"{where}.function.name: must be a string")
            continue
        if not isinstance(description, str):
            problems.append(f"{where}.function.description: must be a string")
            continue
        if not isinstance(parameters, dict):
            problems.append(f"{where}.function.parameters: must be a JSON object (a schema)")
            continue
        try:
            tools.append(ToolDefinition.create(name, description, parameters))
        except InvalidMessageError as exc:
            problems.append(f"{where}.function: {exc}")
    names = [t.name for t in tools]
    twice = sorted({n for n in names if names.count(n) > 1})
    problems += [f"tool name {n!r} appears twice" for n in twice]
    if problems:
        shown = "; ".join(problems[:10]) + ("; …" if len(problems) > 10 else "")
        raise UsageError(f"tools file {path!r} is invalid: {shown}")
    return tuple(tools)


def sniff_image(data: bytes) -> str | None:
    """The image type (png, jpeg, gif, webp) from the first bytes, or None."""
    for magic, kind in _IMAGE_MAGIC:
        if data.startswith(magic):
            return kind
    if len(data) >= 12 and data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "webp"
    return None


def load_image(path: str) -> ImagePart:
    """An image part carrying the file as a ``data:image/<type>;base64,...`` URL."""
    data = _read_bounded(path, MAX_IMAGE_BYTES, "image")
    kind = sniff_image(data)
    if kind is None:
        raise UsageError(f"image {path!r} is not a PNG, JPEG, GIF or WebP file (by its content)")
    encoded = base64.b64encode(data).decode("ascii")
    return ImagePart.of(f"data:image/{kind};base64,{encoded}")


def _plan_probe(args: argparse.Namespace, redactor: Redactor) -> _ProbePlan:
    config = _probe_config(args, redactor)
    tools: list[ToolDefinition] = []
    if args.tools is not None:
        tools.extend(load_tools_file(args.tools))
    if args.sample_tool:
        if any(t.name == _SAMPLE_TOOL.name for t in tools):
            raise UsageError(f"--sample-tool: the tools file already has {_SAMPLE_TOOL.name!r}")
        tools.append(_SAMPLE_TOOL)
    default = SAMPLE_TOOL_PROMPT if args.sample_tool else DEFAULT_PROMPT
    prompt = check_text(default if args.prompt is None else text_arg(args.prompt), "--prompt")
    message: UserMessage
    if args.image is not None:
        message = UserMessage(content=(TextPart(text=prompt), load_image(args.image)))
    else:
        message = UserMessage(content=prompt)
    return _ProbePlan(config, (message,), tuple(tools), sent_image=args.image is not None)


def cmd_probe(args: argparse.Namespace, console: Console) -> int:
    """``grid-agent probe``: check the arguments and files, send the request; the status."""
    try:
        plan = _plan_probe(args, console.redactor)
        tracing = start_tracing(console)
    except ConfigError as exc:
        return usage_failure(console, args, exc.message)
    except UsageError as exc:
        return usage_failure(console, args, str(exc))
    try:
        return asyncio.run(_probe(plan, args, console, tracing))
    finally:
        if tracing is not None:
            tracing.close(console)


async def _probe(
    plan: _ProbePlan, args: argparse.Namespace, console: Console, tracing: CommandTracing | None
) -> int:
    cancel = CancelToken()
    beat = heartbeat(args, console, plan.config)
    with operator_interrupts(cancel, console):
        async with (
            LLMClient(
                plan.config,
                correlation_id=PROBE_CORRELATION_ID,
                on_progress=None if beat is None else beat.on_progress,
            ) as client,
            beating(beat),
        ):
            request_id = client.next_request_id()
            summary = output.ProbeSummary(
                endpoint=shown_url(plan.config.endpoint_url),
                asked_tools=bool(plan.tools),
                sent_image=plan.sent_image,
                request_id=request_id,
            )
            if tracing is None:
                traced = untraced()
            else:
                console.err(tracing.line())
                traced = tracing.request(plan.config, plan.messages, plan.tools, request_id)
            with traced as request:
                try:
                    completion = await client.complete(
                        plan.messages, plan.tools, request_id=request_id, cancel=cancel
                    )
                except GridAgentError as exc:
                    request.failed(exc)
                    summary = dataclasses.replace(summary, error=exc)
                else:
                    request.reply(completion)
                    summary = dataclasses.replace(summary, completion=completion)
    if args.json:
        console.json(output.probe_json(summary))
    else:
        console.out(*output.probe_report(summary))
    if summary.error is None:
        return EXIT_OK
    return cancel_status(cancel.reason) if cancel.cancelled else EXIT_FAILURE
