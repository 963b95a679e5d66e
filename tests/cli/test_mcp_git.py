"""``grid-agent run`` against a reference MCP server from a package index: ``mcp-server-git``
(started with ``uvx``) on a throwaway repository, approval on a pseudo-terminal.

The model is the test's fake endpoint: ``git_status`` (read-only by the server's hint: runs
unasked), then ``git_commit`` of a staged file (mutating: asked). A commit is refused up
front without a terminal, denied on the terminal (no commit is made) and approved on it (the
commit is in the repository's log). Needs git, uv and the package index.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
from typing import TYPE_CHECKING, Any, Final

import pytest

from metacrate_grid_agent.testing import FakeEndpoint, Reply
from tests.cli.conftest import KEY_ENV, RunCLI, assert_no_key
from tests.cli.test_approve import QUESTION, on_a_terminal, read_until

pytest.importorskip("mcp", reason="the MCP tier needs the mcp extra")

from tests.mcp.reference import FORWARDED, UVX_START_S

if TYPE_CHECKING:
    from pathlib import Path

GIT: Final = shutil.which("git")
UVX: Final = shutil.which("uvx")
#: The server's release these tests were written against.
SERVER: Final = "mcp-server-git==2026.10.19"
#: First start of the server may download it: a longer bound than other children get.
START_S: Final = UVX_START_S

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(GIT is None or UVX is None, reason="needs git and uvx"),
]


def _git(repo: Path, *args: str) -> str:
    assert GIT is not None
    found = subprocess.run(  # noqa: S603 - git on the test's own repository
        [GIT, "-C", str(repo), *args], capture_output=True, text=True, check=True, timeout=30
    )
    return found.stdout


def repository(tmp_path: Path) -> Path:
    """A repository with one commit and one staged file."""
    repo = tmp_path / "repo"
    repo.mkdir()
    _git(repo, "init", "-q")
    _git(repo, "config", "user.email", "agent@example.invalid")
    _git(repo, "config", "user.name", "Agent")
    (repo / "a.txt").write_text("a\n", encoding="utf-8")
    _git(repo, "add", "a.txt")
    _git(repo, "commit", "-qm", "first")
    (repo / "b.txt").write_text("b\n", encoding="utf-8")
    _git(repo, "add", "b.txt")
    return repo


def config(tmp_path: Path, url: str, repo: Path) -> Path:
    """agent.toml with the endpoint and ``[mcp.servers.git]``."""
    env = {k: os.environ[k] for k in FORWARDED if os.environ.get(k)}
    path = tmp_path / "agent.toml"
    lines = [
        "[llm]",
        f'endpoint_url = "{url}"',
        f'api_key_env = "{KEY_ENV}"',
        "[mcp.servers.git]",
        'command = "uvx"',
        f'args = ["--quiet", "{SERVER}", "--repository", {json.dumps(str(repo))}]',
        f"startup_timeout_s = {START_S}",
        "env = { " + ", ".join(f"{k} = {json.dumps(v)}" for k, v in env.items()) + " }",
    ]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def script(repo: Path) -> list[Reply]:
    """Status, then a commit, then a summary."""
    where = json.dumps({"repo_path": str(repo)})
    commit = json.dumps({"repo_path": str(repo), "message": "add b"})
    return [
        Reply.completion(tool_calls=[("c1", "git_status", where)]),
        Reply.completion(tool_calls=[("c2", "git_commit", commit)]),
        Reply.completion("Checked the status and asked to commit b.txt."),
    ]


async def _on_the_terminal(
    pycache: Path, tmp_path: Path, answer: bytes
) -> tuple[Path, dict[str, Any], str]:
    """A session on a pseudo-terminal, answering the one question with ``answer``."""
    repo = repository(tmp_path)
    async with FakeEndpoint(script(repo)) as ep:
        args = ("run", "--config", str(config(tmp_path, ep.url, repo)), "--goal", "Commit b.",
                "--approve", "--json")  # fmt: skip
        async with on_a_terminal(pycache, *args) as (child, tty):
            assert child.stderr is not None
            seen: list[str] = []
            await read_until(child.stderr, QUESTION, seen)
            os.write(tty, answer)
            async with asyncio.timeout(START_S):
                out, rest = await child.communicate()
    err = "".join(seen) + rest.decode()
    assert_no_key(out.decode(), err)
    assert child.returncode == 0, err
    return repo, json.loads(out.decode()), err


async def test_a_commit_denied_on_the_terminal_is_not_made(pycache: Path, tmp_path: Path) -> None:
    """The status runs unasked; the commit is asked about (server and tool named), denied,
    and the repository keeps its one commit."""
    repo, data, err = await _on_the_terminal(pycache, tmp_path, b"n not yet\n")
    assert "  MCP server:  git" in err
    assert "  tool:        git_commit (mutating)" in err
    assert [(c["name"], c["status"]) for c in data["calls"]] == [
        ("git_status", "ok"), ("git_commit", "denied"),
    ]  # fmt: skip
    assert "b.txt" in data["calls"][0]["observation"]
    assert _git(repo, "log", "--format=%s").split() == ["first"]


async def test_a_commit_approved_on_the_terminal_is_made(pycache: Path, tmp_path: Path) -> None:
    """Approved, the commit reaches the server and is in the repository's log."""
    repo, data, _ = await _on_the_terminal(pycache, tmp_path, b"y\n")
    assert [(c["name"], c["status"]) for c in data["calls"]] == [
        ("git_status", "ok"), ("git_commit", "ok"),
    ]  # fmt: skip
    assert data["servers"] == {"git": {"git_status": 1, "git_commit": 1}}
    assert _git(repo, "log", "--format=%s").splitlines() == ["add b", "first"]


async def test_approve_without_a_terminal_is_refused_before_any_server_starts(
    cli: RunCLI, tmp_path: Path
) -> None:
    """No terminal on stdin: --approve is refused (exit 2); nothing is committed."""
    repo = repository(tmp_path)
    async with FakeEndpoint(script(repo)) as ep:
        path = str(config(tmp_path, ep.url, repo))
        result = await cli("run", "--config", path, "--goal", "Commit b.", "--approve")
    assert result.returncode == 2
    assert "stdin is not a terminal" in result.stderr
    assert ep.requests == []
    assert _git(repo, "log", "--format=%s").split() == ["first"]
