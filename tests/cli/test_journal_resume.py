"""``grid-agent resume DIR`` with several unfinished sessions, and ``--session-id``.

Each session is journaled by a real ``grid-agent run --journal DIR`` against the test's fake
endpoint (the sandbox's tools), then its journal is cut back as a crash leaves it: ``a``
after the model's reply (its read-only call not run), ``b`` after a mutating call's intent
(the crash inside the call), ``c`` after its first request (the reply lost). The fake
endpoint's record names every request a resume sent, by its request id.
"""

from __future__ import annotations

import json
import re
from typing import TYPE_CHECKING, Any

from metacrate_grid_agent.testing import FakeEndpoint, RecordedRequest, Reply
from tests.cli.conftest import RunCLI, WriteConfig, together

if TYPE_CHECKING:
    from pathlib import Path

import pytest

GOAL = "Do your one thing, then say so."
#: Each session's first call (the second turn is its final text).
FIRST: dict[str, tuple[str, dict[str, Any]]] = {
    "a": ("look_around", {}),
    "b": ("move_to", {"x": 3, "y": 4}),
    "c": ("look_around", {}),
}
#: Lines of each session's journal kept: a crash right after that record.
KEEP = {"a": 3, "b": 4, "c": 2}
_REQUEST = re.compile(r"\Aavatar-([abc])-g0-r1-t(\d+)\Z")


def respond(request: RecordedRequest) -> Reply:
    """Turn 1: the session's call; turn 2: its final text."""
    found = _REQUEST.match(request.header("X-Request-Id") or "")
    assert found is not None, request.header("X-Request-Id")
    session, turn = found[1], int(found[2])
    if turn == 1:
        name, arguments = FIRST[session]
        return Reply.completion(tool_calls=[(f"{session}1", name, json.dumps(arguments))])
    return Reply.completion(f"session {session} is done")


def _path(journal: Path, session: str) -> Path:
    return journal / f"avatar-{session}-g0-r1.journal"


def _cut(journal: Path, session: str) -> None:
    path = _path(journal, session)
    lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
    kinds = [json.loads(line)["j"]["kind"] for line in lines]
    assert kinds[-1] == "finish"
    path.write_text("".join(lines[: KEEP[session]]), encoding="utf-8")


def _sent(ep: FakeEndpoint, start: int) -> list[str]:
    return [r.header("X-Request-Id") or "" for r in ep.requests[start:]]


@pytest.mark.slow
async def test_resume_resumes_every_unfinished_session_or_only_the_one_named(
    cli: RunCLI, write_config: WriteConfig, tmp_path: Path
) -> None:
    """``resume DIR --session-id ID`` resumes only that session: the other journals keep
    every byte and the endpoint hears only its request. ``resume DIR`` then resumes each
    other unfinished session and prints each one's outcome as ``run`` does (one JSON line
    per session); its exit status is ``run``'s for several: 1 since one ended
    ``ambiguous_mutation`` (its mutating call never re-run, nothing sent for it)."""
    journal = tmp_path / "journal"
    async with FakeEndpoint(responder=respond) as ep:
        config = str(write_config(ep.url))
        ran = await together(*(
            cli("run", "--config", config, "--goal", GOAL, "--journal", str(journal),
                "--session-id", f"avatar-{s}", "--json")
            for s in "abc"
        ))  # fmt: skip
        assert [r.returncode for r in ran] == [0, 0, 0], [r.stderr for r in ran]
        for session in "abc":
            _cut(journal, session)
        kept = {s: _path(journal, s).read_bytes() for s in "ab"}
        start = len(ep.requests)
        one = await cli("resume", str(journal), "--config", config, "--session-id",
                        "avatar-c", "--json")  # fmt: skip
        assert one.returncode == 0, one.stderr
        assert _sent(ep, start) == ["avatar-c-g0-r1-t1", "avatar-c-g0-r1-t2"]
        assert {s: _path(journal, s).read_bytes() for s in "ab"} == kept
        data = one.json()
        assert (data["session_id"], data["outcome"]) == ("avatar-c", "completed")
        finished_c = _path(journal, "c").read_bytes()
        start = len(ep.requests)
        every = await cli("resume", str(journal), "--config", config, "--json")
        assert every.returncode == 1, every.stderr
        assert _sent(ep, start) == ["avatar-a-g0-r1-t2"]
    results = {d["session_id"]: d for d in map(json.loads, every.stdout.splitlines())}
    assert sorted(results) == ["avatar-a", "avatar-b"]
    assert results["avatar-a"]["outcome"] == "completed"
    assert results["avatar-a"]["final_text"] == "session a is done"
    assert [c["id"] for c in results["avatar-a"]["calls"]] == ["a1"]
    assert results["avatar-b"]["outcome"] == "ambiguous_mutation"
    assert results["avatar-b"]["ambiguous_call"] == "b1"
    assert "resuming avatar-a-g0-r1" in every.stderr
    assert "resuming avatar-b-g0-r1" in every.stderr
    assert "avatar-c" not in every.stderr
    assert _path(journal, "c").read_bytes() == finished_c
    again = await cli("resume", str(journal), "--config", config)
    assert again.returncode == 0
    assert "no unfinished session" in again.stderr
