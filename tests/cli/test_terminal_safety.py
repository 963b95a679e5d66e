"""No model, endpoint, transcript or file can put a terminal sequence on the operator's screen.

One table, one row per command and output form. Each row feeds the hostile values of
:mod:`tests.terminal_safety` into every field that command prints, runs the child (one after
another, never in a burst) and checks that stdout and stderr hold no control character
(C0, DEL, C1, ESC, CR), no format character (bidi, zero-width, soft hyphen, BOM, tags), no
line or paragraph separator and no other default-ignorable character: only the line breaks
the command writes between its own lines. Every row also checks that the hostile value was
printed (escaped, visibly), so a row cannot pass by printing nothing.

The fields, per row:

- ``run`` (text, ``--verbose``, ``--transcript``): the goal, each call's id, tool name and
  arguments (progress lines), each observation, the final text, the chat line of the
  sandbox's state, the log records; ``run --json``: the same as one JSON object.
- ``probe``: reply text, finish reason, each tool call's id, name and arguments; as text
  and as JSON. ``probe`` failing: the error message, the endpoint's error type and code, the
  image-refused line.
- ``check-config``: a hostile key (its problem line) and a hostile file name, as text and
  JSON; a valid file under a hostile name.
- ``report`` (text and ``--html``) and ``replay`` (text and ``--json``) on a recorded hostile
  session whose header (session id, generation, library), outcome, statuses, effects and
  error kinds were made hostile too.
- errors: an unknown command word, unreadable or unwritable files under hostile names.

The heartbeat's own interpolations are checked without a child (tests/core/test_display_safe.py).
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from metacrate_grid_agent.testing import FakeEndpoint, Reply
from tests.cli.conftest import CLIResult, RunCLI, WriteConfig
from tests.terminal_safety import HOSTILE, HOSTILE_LINES, HOSTILE_SHOWN, unsafe

pytestmark = pytest.mark.slow

PNG = b"\x89PNG\r\n\x1a\n" + bytes(range(64))
#: A hostile value that can be a file name (no NUL, no slash).
HOSTILE_NAME = HOSTILE.replace("\x00", "")

Row = Callable[[RunCLI, WriteConfig, Path], Awaitable[list[CLIResult]]]
ROWS: dict[str, Row] = {}


def row(name: str) -> Callable[[Row], Row]:
    """Register a row of the table."""

    def register(function: Row) -> Row:
        ROWS[name] = function
        return function

    return register


def session_script() -> list[Reply]:
    """A session whose ids, names, arguments, finish reasons and final text are hostile: a
    valid read-only call, an unknown tool, a mutating call saying hostile text, then the end."""
    return [
        Reply.completion(
            None,
            tool_calls=[
                (HOSTILE, "look_around", "{}"),
                (HOSTILE + "2", HOSTILE, json.dumps({HOSTILE: HOSTILE_LINES})),
                (HOSTILE_LINES, "say", json.dumps({"text": HOSTILE + HOSTILE_LINES})),
            ],
            finish_reason=HOSTILE,
        ),
        Reply.completion(HOSTILE_LINES + HOSTILE, finish_reason=HOSTILE),
    ]


def probe_script() -> list[Reply]:
    """One reply with hostile text, finish reason and tool call."""
    call = (HOSTILE, HOSTILE, json.dumps({HOSTILE: HOSTILE_LINES}))
    return [Reply.completion(HOSTILE_LINES, tool_calls=[call], finish_reason=HOSTILE)]


def toml_string(text: str) -> str:
    """``text`` as a TOML basic string, every non-ASCII or control character escaped."""
    return (
        '"'
        + "".join(c if " " <= c <= "~" and c not in '"\\' else f"\\U{ord(c):08X}" for c in text)
        + '"'
    )


@row("run")
async def _run(cli: RunCLI, write_config: WriteConfig, tmp_path: Path) -> list[CLIResult]:
    """Text with --verbose and --transcript, then --json, each on a fresh hostile session."""
    results = []
    for extra in (("--verbose", "--transcript", str(tmp_path / "t.jsonl")), ("--json",)):
        async with FakeEndpoint(session_script()) as endpoint:
            config = write_config(endpoint.url)
            results.append(await cli("run", "--goal", HOSTILE, "--config", str(config), *extra))
    assert [r.returncode for r in results] == [0, 0], results
    assert results[1].json()["calls"][0]["id"] == HOSTILE
    return results


@row("probe")
async def _probe(cli: RunCLI, write_config: WriteConfig, tmp_path: Path) -> list[CLIResult]:
    """Text with --verbose, then --json."""
    results = []
    for extra in (("--verbose",), ("--json",)):
        async with FakeEndpoint(probe_script()) as endpoint:
            config = write_config(endpoint.url)
            results.append(await cli("probe", "--config", str(config), "--sample-tool", *extra))
    assert [r.returncode for r in results] == [0, 0], results
    assert results[1].json()["finish_reason"] == HOSTILE
    return results


@row("probe failing")
async def _probe_failing(cli: RunCLI, write_config: WriteConfig, tmp_path: Path) -> list[CLIResult]:
    """An error body with a hostile message, type and code, refusing an image; text, JSON."""
    image = tmp_path / "i.png"
    image.write_bytes(PNG)
    results = []
    for extra in ((), ("--json",)):
        refusal = Reply.error(400, HOSTILE_LINES + HOSTILE, type=HOSTILE, code=HOSTILE)
        async with FakeEndpoint([refusal]) as endpoint:
            config = write_config(endpoint.url, llm={"max_retries": 0})
            results.append(
                await cli("probe", "--config", str(config), "--image", str(image), *extra)
            )
    assert [r.returncode for r in results] == [1, 1], results
    assert "]0;pwn" in results[1].json()["error_type"]  # the library blanks its controls
    return results


@row("check-config")
async def _check_config(cli: RunCLI, write_config: WriteConfig, tmp_path: Path) -> list[CLIResult]:
    """A hostile key in a file with a hostile name (text, JSON); a valid file so named."""
    valid = write_config("https://llm.example.com/v1/chat/completions")
    invalid = tmp_path / f"{HOSTILE_NAME}.toml"
    invalid.write_text(
        valid.read_text("utf-8") + f"{toml_string(HOSTILE + HOSTILE_LINES)} = 1\n", "utf-8"
    )
    renamed = valid.rename(tmp_path / f"ok{HOSTILE_NAME}.toml")
    results = [
        await cli("check-config", str(invalid)),
        await cli("check-config", str(invalid), "--json"),
        await cli("check-config", str(renamed)),
    ]
    assert [r.returncode for r in results] == [2, 2, 0], results
    return results


def make_hostile(record: dict[str, object]) -> dict[str, object]:
    """``record`` with the fields a run cannot make hostile replaced by hostile values."""
    kind = record["type"]
    fields = {
        "session": ("session_id", "generation", "library"),
        "tool_call": ("effect",),
        "tool_result": ("status",),
        "finish": ("outcome", "bound", "cancel_reason"),
    }.get(str(kind), ())
    changed = dict(record, **dict.fromkeys(fields, HOSTILE))
    if kind == "finish":
        changed["error"] = {"kind": HOSTILE, "message": HOSTILE_LINES}
    return changed


@row("report and replay")
async def _report_and_replay(
    cli: RunCLI, write_config: WriteConfig, tmp_path: Path
) -> list[CLIResult]:
    """A recorded hostile session, then hostile header, outcome, statuses and error kind."""
    recorded = tmp_path / f"{HOSTILE_NAME}.jsonl"
    async with FakeEndpoint(session_script()) as endpoint:
        config = write_config(endpoint.url)
        ran = await cli("run", "--goal", HOSTILE, "--config", str(config),
                        "--transcript", str(recorded), "--quiet")  # fmt: skip
    assert ran.returncode == 0, ran.stderr
    edited = tmp_path / "edited.jsonl"
    records = [json.loads(line) for line in recorded.read_text("utf-8").splitlines()]
    edited.write_text("".join(json.dumps(make_hostile(r)) + "\n" for r in records), "utf-8")
    page = tmp_path / "page.html"
    results = [
        await cli("report", str(recorded), "--html", str(page)),
        await cli("replay", str(recorded)),
        await cli("replay", str(recorded), "--json"),
        await cli("report", str(edited)),
        await cli("replay", str(edited)),
    ]
    assert unsafe(page.read_text("utf-8")) == []
    assert HOSTILE_SHOWN in page.read_text("utf-8")
    return results


@row("errors")
async def _errors(cli: RunCLI, write_config: WriteConfig, tmp_path: Path) -> list[CLIResult]:
    """An unknown command word; files that cannot be read or written, under hostile names."""
    missing = str(tmp_path / HOSTILE_NAME / "x")
    results = [
        await cli("\u034f\ufe0f\u3164x"),  # a short word: echoed, not hidden
        await cli("probe", "--config", missing),
        await cli("probe", "--config", missing, "--json"),
        await cli("run", "--goal", "x", "--transcript", missing),
        await cli("report", missing),
        await cli("replay", missing, "--json"),
    ]
    assert {r.returncode for r in results} == {2}, results
    return results


@pytest.mark.parametrize("name", sorted(ROWS))
async def test_no_printed_field_reaches_the_terminal_unescaped(
    name: str, cli: RunCLI, write_config: WriteConfig, tmp_path: Path
) -> None:
    """Whatever a model, an endpoint, a transcript or a file name holds, the command's
    output holds no character that moves the cursor, starts a terminal sequence, reorders
    or hides text; the hostile value is shown as visible escapes instead."""
    results = await ROWS[name](cli, write_config, tmp_path)
    found = [(unsafe(r.stdout), unsafe(r.stderr)) for r in results]
    assert found == [([], [])] * len(results)
    # The hostile value did reach the output: escaped, or (in an error body, which is scrubbed
    # first and so has every blank and invisible character already folded to a space) as
    # its visible remnant.
    shown = [r.stdout + r.stderr for r in results]
    assert any(HOSTILE_SHOWN in out or "]0;pwn [2K [8m" in out for out in shown)
