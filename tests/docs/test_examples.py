"""Every Python example of the README and the docs runs, as written, on every test run.

Each fenced ``python`` block of ``README.md`` and ``docs/**/*.md`` is one test. It runs in a
fresh namespace against a loopback :class:`FakeEndpoint` that plays a model: asked with a
tool offered, it calls ``move_to(3, 4)``; shown the result, it answers "I walked to (3, 4).".
The comment on the line above a block says how it runs (``docs/development.md`` tells
writers):

- no comment: the block is a whole program. It runs in a folder holding ``agent.toml``
  (pointing at the fake endpoint, the key in ``GRID_AGENT_API_KEY``), in a thread of its
  own, so it may call ``asyncio.run``.
- ``<!-- in-session -->``: the block continues the example of "The tool loop". It runs on
  the event loop of an open client with ``config``, ``client``, ``loop``, ``session``,
  ``goal``, ``SYSTEM``, ``MOVE`` and ``Grid`` defined as there, and may ``await`` at top
  level; ``tests/incidents/1234.jsonl`` holds a recorded transcript of one such session.
- ``<!-- no-run: reason -->``: the block needs what the suite cannot have; skipped with
  that reason.

A block followed by a ``text title="Output"`` block must print exactly that; a block that
defines ``test_*`` functions has them run too; nothing a block prints may show the key.
"""

from __future__ import annotations

import ast
import asyncio
import contextlib
import inspect
import io
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import pytest

from metacrate_grid_agent import (
    AgentConfig,
    CancelToken,
    Effect,
    Failure,
    LLMClient,
    SessionGeneration,
    Success,
    Tool,
    ToolLoop,
    ValidatedCall,
)
from metacrate_grid_agent.testing import FakeEndpoint, RecordedRequest, Reply
from metacrate_grid_agent.transcript import TranscriptWriter
from tests.conftest import CANARY_KEYS, assert_no_canary

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Iterator
    from types import CodeType

ROOT: Final = Path(__file__).resolve().parents[2]
PAGES: Final = (ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md")))
#: The key the examples' configuration reads from the environment; it must never be printed.
KEY: Final = CANARY_KEYS["jwt"]
#: What a block may say about itself, on the line above its fence.
MARKER: Final = re.compile(r"<!--\s*(in-session|no-run)\s*(?::\s*(.*?))?\s*-->")
OUTPUT_FENCE: Final = '```text title="Output"'
#: Bound on one example: each is a session or two on loopback, done in well under a second.
EXAMPLE_TIMEOUT_S: Final = 20.0


@dataclass(frozen=True)
class Example:
    """One fenced ``python`` block: where it is, its code, how it runs, what it prints."""

    page: str
    line: int
    code: str
    mode: str  # "program", "in-session" or "no-run"
    reason: str
    output: str | None

    @property
    def name(self) -> str:
        """``page:line`` of the opening fence, as the test id and the code's file name."""
        return f"{self.page}:{self.line}"


def _fence_body(lines: list[str], start: int) -> tuple[str, int]:
    """The text of the fence opening at ``start`` (its indentation removed) and its end."""
    indent = len(lines[start]) - len(lines[start].lstrip())
    end = start + 1
    while end < len(lines) and lines[end].strip() != "```":
        end += 1
    assert end < len(lines), f"unclosed fence at line {start + 1}"
    return "".join(line[indent:] + "\n" for line in lines[start + 1 : end]), end


def examples_of(path: Path, root: Path = ROOT) -> list[Example]:
    """The python blocks of one page, in order, named by the page's path under ``root``."""
    page = path.relative_to(root).as_posix()
    lines = path.read_text(encoding="utf-8").splitlines()
    found: list[Example] = []
    for number, line in enumerate(lines):
        if line.strip() != "```python":
            continue
        code, end = _fence_body(lines, number)
        above = next((text.strip() for text in reversed(lines[:number]) if text.strip()), "")
        marker = MARKER.fullmatch(above)
        after = next((i for i in range(end + 1, len(lines)) if lines[i].strip()), None)
        output = None
        if after is not None and lines[after].strip() == OUTPUT_FENCE:
            output = _fence_body(lines, after)[0]
        found.append(
            Example(
                page=page,
                line=number + 1,
                code=code,
                mode=marker.group(1) if marker else "program",
                reason=(marker.group(2) or "") if marker else "",
                output=output,
            )
        )
    return found


EXAMPLES: Final = [example for page in PAGES for example in examples_of(page)]


def _param(example: Example) -> Any:
    marks: list[pytest.MarkDecorator] = []
    if example.mode == "no-run":
        marks.append(pytest.mark.skip(reason=f"{example.name}: {example.reason}"))
    return pytest.param(example, id=example.name, marks=marks)


# -- the model and the session the examples run against ------------------------------------

GOAL: Final = "Stand at (3, 4)."
SYSTEM: Final = "You drive an avatar. Act, then summarise."
MOVE: Final = Tool(
    name="move_to",
    description="Walk the avatar to a grid cell.",
    parameters={
        "type": "object",
        "properties": {"x": {"type": "integer"}, "y": {"type": "integer"}},
        "required": ["x", "y"],
        "additionalProperties": False,
    },
    effect=Effect.MUTATING,
)


class Grid:
    """The executor of "The tool loop": moves nothing, says where the avatar now is."""

    async def execute(self, call: ValidatedCall, cancel: CancelToken) -> Success | Failure:
        """Answer the move as done."""
        return Success(f"now at ({call.arguments['x']}, {call.arguments['y']})")


def play_model(request: RecordedRequest) -> Reply:
    """Call ``move_to(3, 4)`` when a tool is offered and nothing ran yet; else summarise."""
    body = request.json()
    if body.get("tools") and body["messages"][-1]["role"] != "tool":
        return Reply.completion(tool_calls=[("call_1", "move_to", json.dumps({"x": 3, "y": 4}))])
    return Reply.completion("I walked to (3, 4).")


def _write_config(folder: Path, url: str) -> Path:
    path = folder / "agent.toml"
    path.write_text(
        f'[llm]\nendpoint_url = "{url}"\napi_key_env = "GRID_AGENT_API_KEY"\n', encoding="utf-8"
    )
    return path


async def _record_incident(folder: Path, config: AgentConfig, client: LLMClient) -> None:
    """Write the transcript of one session where the replay example looks for it."""
    path = folder / "tests" / "incidents" / "1234.jsonl"
    path.parent.mkdir(parents=True)
    loop = ToolLoop(client, [MOVE], Grid(), config=config.tool_loop, system_prompt=SYSTEM)
    session = SessionGeneration("incident-1234")
    with path.open("w", encoding="utf-8") as stream:
        writer = TranscriptWriter(stream, secret=config.llm.api_key)
        writer.begin(
            session_id=session.session_id,
            generation=session.current,
            goal=GOAL,
            tools=[MOVE],
            config=config.tool_loop,
            llm=config.llm,
            system_prompt=SYSTEM,
        )
        await loop.run(GOAL, generation=session, on_event=writer)


@contextlib.asynccontextmanager
async def session_names(folder: Path) -> AsyncIterator[dict[str, Any]]:
    """The names of "The tool loop" example, on an open client, for an in-session block."""
    config = AgentConfig.from_toml(folder / "agent.toml")
    async with LLMClient(config.llm) as client:
        await _record_incident(folder, config, client)
        yield {
            "__name__": "__main__",
            "config": config,
            "client": client,
            "loop": ToolLoop(client, [MOVE], Grid(), config=config.tool_loop, system_prompt=SYSTEM),
            "session": SessionGeneration("avatar-42"),
            "goal": GOAL,
            "SYSTEM": SYSTEM,
            "MOVE": MOVE,
            "Grid": Grid,
        }


# -- running a block ------------------------------------------------------------------------


@contextlib.contextmanager
def _printed() -> Iterator[io.StringIO]:
    with contextlib.redirect_stdout(io.StringIO()) as out:
        yield out


def _compiled(example: Example) -> CodeType:
    code: CodeType = compile(
        example.code, example.name, "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT
    )
    return code


async def _run_tests(namespace: dict[str, Any]) -> None:
    """Run the ``test_*`` functions a block defined, as pytest would."""
    for name, value in list(namespace.items()):
        if name.startswith("test_") and callable(value):
            returned = value()
            if inspect.iscoroutine(returned):
                await returned


async def _run_in_session(example: Example, namespace: dict[str, Any]) -> None:
    """On the running event loop: top-level awaits are awaited here."""
    # The code is the repository's own documentation, run as the reader would run it.
    result = eval(_compiled(example), namespace)  # noqa: S307
    if inspect.iscoroutine(result):
        await result
    await _run_tests(namespace)


def _run_program(example: Example, namespace: dict[str, Any]) -> str:
    """A whole program: its own thread, no running event loop, so ``asyncio.run`` works."""
    with _printed() as out:
        # The code is the repository's own documentation, run as the reader would run it.
        result = eval(_compiled(example), namespace)  # noqa: S307
        if inspect.iscoroutine(result):
            asyncio.run(result)
        asyncio.run(_run_tests(namespace))
    return out.getvalue()


async def run_example(example: Example, folder: Path) -> tuple[str, dict[str, Any]]:
    """Run one block against a fresh fake endpoint: what it printed, the names it left."""
    async with FakeEndpoint(responder=play_model) as endpoint:
        _write_config(folder, endpoint.url)
        async with asyncio.timeout(EXAMPLE_TIMEOUT_S):
            if example.mode == "program":
                namespace: dict[str, Any] = {"__name__": "__main__"}
                printed = await asyncio.to_thread(_run_program, example, namespace)
                return printed, namespace
            async with session_names(folder) as namespace:
                with _printed() as out:
                    await _run_in_session(example, namespace)
                return out.getvalue(), namespace


@pytest.mark.parametrize("example", [_param(e) for e in EXAMPLES])
async def test_the_example_runs_as_written(
    example: Example, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Docs match code: the block runs without error, prints exactly the output its page
    shows (when it shows one), and never prints the key."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("GRID_AGENT_API_KEY", KEY)
    printed, _ = await run_example(example, tmp_path)
    if example.output is not None:
        assert example.output == printed
    assert_no_canary(printed)


async def test_the_session_names_are_those_of_the_tool_loop_page(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The in-session blocks run with the tool, system prompt and goal that "The tool loop"
    defines, so a change to that example cannot leave the others running on stale names."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("GRID_AGENT_API_KEY", KEY)
    first = examples_of(ROOT / "docs" / "guide" / "tool-loop.md")[0]
    printed, defined = await run_example(first, tmp_path)
    assert (defined["MOVE"], defined["SYSTEM"]) == (MOVE, SYSTEM)
    assert f"goal = {GOAL!r}".replace("'", '"') in first.code
    assert printed.startswith("completed I walked to (3, 4).")


def test_the_examples_are_found_and_few_are_skipped() -> None:
    """The collector sees the README's example and every page's; skipped ones stay rare."""
    pages = {e.page for e in EXAMPLES}
    assert {"README.md", "docs/guide/tool-loop.md", "docs/guide/configuration.md"} <= pages
    assert EXAMPLES[0].page == "README.md"
    skipped = [e.name for e in EXAMPLES if e.mode == "no-run"]
    assert len(skipped) <= len(EXAMPLES) // 4, skipped
    assert all(e.reason for e in EXAMPLES if e.mode == "no-run")


def test_every_python_fence_is_one_the_collector_runs() -> None:
    """A block fenced as ``py``, ``python3`` or ``pycon`` would silently never run."""
    odd = re.compile(r"^\s*```\s*(?:py|python3|pycon|Python)\b")
    offenders = [
        f"{page.relative_to(ROOT)}:{number}"
        for page in PAGES
        for number, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1)
        if odd.match(line)
    ]
    assert offenders == []


def test_a_marker_is_read_and_an_output_block_is_attached(tmp_path: Path) -> None:
    """The collector itself: markers, reasons, indentation and the output block."""
    page = tmp_path / "page.md"
    page.write_text(
        "<!-- no-run: needs a server -->\n```python\nx = 1\n```\n\n"
        "<!-- in-session -->\n\n  ```python\n  print(2)\n  ```\n\n"
        '```text title="Output"\n2\n```\n',
        encoding="utf-8",
    )
    found = examples_of(page, root=tmp_path)
    assert [(e.line, e.mode, e.reason, e.code, e.output) for e in found] == [
        (2, "no-run", "needs a server", "x = 1\n", None),
        (8, "in-session", "", "print(2)\n", "2\n"),
    ]
