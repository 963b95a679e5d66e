"""The whole sessions the guide pages show run as written, and print what the pages say.

A session on a page is a ``sh`` block marked ``<!-- session -->`` on the line above. The
files it uses are the blocks of the same section with a ``title="NAME"`` (``agent.toml``,
``script.json``), written to a fresh folder; the block then runs there under ``bash``, with
this environment's ``grid-agent`` first on ``PATH`` and a pseudo-terminal as stdin; its
stdout and stderr together must match the ``text title="Output"`` block that follows.

On a line of the output that asks a question (``Run it? ...: ``), what follows the colon is
the operator's answer: it is typed when the question comes, and left out of the comparison
(a terminal echoes it; the pipe the test reads does not). Numbers, hashes, the loopback port
and request ids differ from run to run and are compared as placeholders.

These sessions drive ``mcp-server-git`` through ``uvx``: they need git, uvx and the package
index (skipped without, saying so; required in CI, as the MCP tier's reference servers are).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import pty
import re
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import pytest

pytest.importorskip("mcp", reason="the MCP tier needs the mcp extra")

from tests.cli.conftest import assert_no_key
from tests.mcp.reference import UVX_START_S, missing

ROOT: Final = Path(__file__).resolve().parents[2]
#: The pages whose sessions run here (each shows at least one).
PAGES: Final = ("docs/guide/mcp.md", "docs/guide/approval.md")
SESSION_MARKER: Final = "<!-- session -->"
OUTPUT_FENCE: Final = '```text title="Output"'
TITLED: Final = re.compile(r'^```\w+ title="([\w.-]+)"$')
#: A question line of the output, and the operator's answer after its colon.
QUESTION: Final = re.compile(r"^(Run it\? .*?: )(\S.*)$")
#: Bound on one session: the first start of the server through uvx may download it.
SESSION_TIMEOUT_S: Final = UVX_START_S + 30.0

pytestmark = pytest.mark.slow


@dataclass(frozen=True)
class Session:
    """A page's session: its files, its commands and the output it shows."""

    page: str
    line: int
    files: dict[str, str]
    commands: str
    output: str


def _fence(lines: list[str], start: int) -> tuple[str, int]:
    end = start + 1
    while lines[end].strip() != "```":
        end += 1
    return "".join(line + "\n" for line in lines[start + 1 : end]), end


def sessions_of(page: str) -> list[Session]:
    """The marked sessions of ``page``, each with the titled files of its section."""
    lines = (ROOT / page).read_text(encoding="utf-8").splitlines()
    found: list[Session] = []
    files: dict[str, str] = {}
    number = 0
    while number < len(lines):
        line = lines[number]
        if line.startswith("## "):
            files = {}
        titled = TITLED.match(line.strip())
        if titled is not None and line.strip() != OUTPUT_FENCE:
            files[titled.group(1)], number = _fence(lines, number)
        elif line.strip() == "```sh" and number and lines[number - 1].strip() == SESSION_MARKER:
            commands, end = _fence(lines, number)
            after = next(i for i in range(end + 1, len(lines)) if lines[i].strip())
            assert lines[after].strip() == OUTPUT_FENCE, f"{page}:{number + 1}: no output"
            output, number = _fence(lines, after)
            found.append(Session(page, end, dict(files), commands, output))
        number += 1
    return found


SESSIONS: Final = [session for page in PAGES for session in sessions_of(page)]


def normalized(text: str) -> list[str]:
    """Lines with what differs between runs as placeholders, and spaces collapsed."""
    found = []
    for line in text.splitlines():
        shown = re.sub(r"http://127\.0\.0\.1:\d+/", "http://127.0.0.1:PORT/", line)
        shown = re.sub(r"\S+-g\d+-r\d+-t\d+", "REQUEST", shown)
        shown = re.sub(r"\b[0-9a-f]{7,40}\b", "HASH", shown)
        shown = re.sub(r"\d+", "0", shown)
        found.append(" ".join(shown.split()))
    return found


def expected_and_answers(output: str) -> tuple[str, list[str]]:
    """The output to compare (answers left out) and the answers to type, in order."""
    lines, answers = [], []
    for line in output.splitlines():
        asked = QUESTION.match(line)
        if asked is not None:
            answers.append(asked.group(2))
        lines.append(line if asked is None else asked.group(1))
    return "\n".join(lines), answers


async def run_session(session: Session, folder: Path) -> tuple[int, str]:
    """Run the session's commands in ``folder``, answering its questions; its output."""
    for name, text in session.files.items():
        (folder / name).write_text(text, encoding="utf-8")
    _, answers = expected_and_answers(session.output)
    env = {k: v for k, v in os.environ.items() if not k.upper().startswith("GRID_AGENT")}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONUNBUFFERED"] = "1"
    master, slave = pty.openpty()
    process = await asyncio.create_subprocess_exec(
        "bash", "-e", "-o", "pipefail", "-c", session.commands,
        cwd=folder, stdin=slave, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT, env=env,
    )  # fmt: skip
    os.close(slave)
    output, asked = b"", 0
    try:
        assert process.stdout is not None
        async with asyncio.timeout(SESSION_TIMEOUT_S):
            while chunk := await process.stdout.read(65536):
                output += chunk
                while answers and output.count(b"Run it? ") > asked:
                    os.write(master, answers.pop(0).encode() + b"\n")
                    asked += 1
            await process.wait()
    finally:
        if process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                process.kill()
            await process.wait()
        os.close(master)
    assert process.returncode is not None
    return process.returncode, output.decode()


def test_the_pages_show_sessions() -> None:
    """Each page listed shows a session (a page that lost its session fails here)."""
    assert sorted({s.page for s in SESSIONS}) == sorted(PAGES)
    for session in SESSIONS:
        assert "--model-script" in session.commands


@pytest.mark.parametrize("session", SESSIONS, ids=lambda s: f"{s.page}:{s.line}")
async def test_the_session_runs_as_the_page_shows(session: Session, tmp_path: Path) -> None:
    """The page's session runs as written (its files, its commands, its answers) and prints
    what the page shows, but for what differs between runs."""
    for tool in ("git", "uvx"):
        if shutil.which(tool) is None:
            missing(f"{tool} is not installed (the guide's sessions drive mcp-server-git)")
    status, output = await run_session(session, tmp_path)
    assert status == 0, output
    assert_no_key(output)
    expected, _ = expected_and_answers(session.output)
    assert normalized(output) == normalized(expected)
