"""The report tells who changed the world: each call's MCP server, the approved mutating
calls marked, the session's wall-clock start, tokens "not reported" when no reply reported
usage, and ``report_data`` timeline entries with fields a program can read.

The session is recorded by a real ``ToolLoop`` with a ``TranscriptWriter`` (the approver
approves the first move, denies the second, never answers the third), its tools' server
given to the writer as the command gives it.
"""

from __future__ import annotations

import datetime
import json
from typing import TYPE_CHECKING, Any

from metacrate_grid_agent import LLMClient, SessionGeneration, ToolLoopConfig
from metacrate_grid_agent.testing import FakeEndpoint, Reply
from metacrate_grid_agent.transcript import (
    SCHEMA,
    Transcript,
    TranscriptWriter,
    report,
    report_data,
    report_html,
)
from tests.llm_transport.loop_support import (
    SESSION,
    SYSTEM,
    TOOLS,
    RecordingExecutor,
    call,
    calls_reply,
    make_loop,
    run_loop,
)
from tests.llm_transport.support import make_config
from tests.transcript.test_evidence import APPROVAL_TIMEOUT_S, ScriptedApprover

if TYPE_CHECKING:
    from pathlib import Path

#: The wall clock the writer reads for ``started_at``: 2026-12-02 10:30:00.250 UTC.
STARTED = datetime.datetime(2026, 12, 2, 10, 30, 0, 250000, tzinfo=datetime.UTC).timestamp()
SERVERS = {"look": "world", "move": "world"}


async def _record(tmp_path: Path, script: list[Reply]) -> Path:
    """One session with the scripted approver, written with each tool's server."""
    path = tmp_path / "session.jsonl"
    config = ToolLoopConfig(approval_timeout_s=APPROVAL_TIMEOUT_S)
    async with FakeEndpoint(script) as endpoint:
        llm = make_config(endpoint.url)
        with path.open("w", encoding="utf-8") as stream:
            writer = TranscriptWriter(stream, secret=llm.api_key, wall_clock=lambda: STARTED)
            writer.begin(
                session_id=SESSION,
                generation=0,
                goal="walk",
                tools=TOOLS,
                config=config,
                system_prompt=SYSTEM,
                llm=llm,
                servers=SERVERS,
            )
            async with LLMClient(llm) as client:
                loop = make_loop(
                    client, RecordingExecutor(), config=config, approver=ScriptedApprover()
                )
                await run_loop(loop, "walk", generation=SessionGeneration(SESSION), on_event=writer)
    return path


def _moves(usage: tuple[int, int] | None) -> list[Reply]:
    return [
        calls_reply(call("m1", "move", {"x": 1, "y": 1}), usage=usage),
        calls_reply(call("m2", "move", {"x": 2, "y": 2}), usage=usage),
        calls_reply(call("m3", "move", {"x": 3, "y": 3}), usage=usage),
        Reply.completion("done", usage=usage),
    ]


def _timeline(path: Path, kind: str) -> list[dict[str, Any]]:
    return [e for e in report_data(path)["timeline"] if e["type"] == kind]


async def test_the_header_records_and_shows_the_wall_clock_start_in_utc(tmp_path: Path) -> None:
    """The transcript's header holds ``started_at`` (ISO 8601, UTC); the text and the page
    show it, and ``report_data`` carries it in the summary."""
    path = await _record(tmp_path, _moves((5, 2)))
    header = json.loads(path.read_text("utf-8").splitlines()[0])
    assert header["started_at"] == "2026-12-02T10:30:00.250Z"
    assert "started: 2026-12-02 10:30:00.250 UTC" in report(path)
    assert "started: 2026-12-02 10:30:00.250 UTC" in report_html(path)
    assert report_data(path)["summary"]["started_at"] == "2026-12-02T10:30:00.250Z"


async def test_each_call_names_its_mcp_server(tmp_path: Path) -> None:
    """Each tool's server is in the header's tool records; every call, result and approval
    row of the text, the page and the data names it."""
    path = await _record(tmp_path, _moves((5, 2)))
    header = json.loads(path.read_text("utf-8").splitlines()[0])
    assert {t["name"]: t["server"] for t in header["tools"]} == SERVERS
    text = "\n".join(report(path))
    assert '-> move {"x": 1, "y": 1} (mutating, id m1, server world)' in text
    assert "<- move ok" in text
    assert "(id m1, server world)" in text
    assert "approval m1 (move, server world): approved" in text
    assert "(id m2, server world)" in report_html(path)
    for kind in ("approval", "tool_call", "tool_result"):
        assert {e["server"] for e in _timeline(path, kind)} == {"world"}


async def test_the_approved_mutating_call_stands_out(tmp_path: Path) -> None:
    """The one mutating call the operator approved (and that ran) is marked in the text,
    a row class of its own on the page, and listed at a glance; denied ones are not."""
    path = await _record(tmp_path, _moves((5, 2)))
    lines = report(path)
    marked = [line for line in lines if "** approved mutating call **" in line]
    assert len(marked) == 2  # its call and its result
    assert all("id m1" in line for line in marked)
    assert "approved mutating calls: move (id m1, server world)" in "\n".join(lines)
    page = report_html(path)
    assert page.count('class="tool_call approved"') == 1
    assert page.count('class="tool_result approved"') == 1
    assert "<th>approved mutating calls</th><td>move (id m1, server world)</td>" in page
    assert report_data(path)["summary"]["approved_mutating_calls"] == [
        {"call_id": "m1", "tool": "move", "server": "world"}
    ]


async def test_timeline_entries_carry_fields_not_only_text(tmp_path: Path) -> None:
    """``report_data`` (``report --json``) timeline entries carry type, turn, call id, tool,
    server, effect, verdict, status and latency, not only a prose text."""
    path = await _record(tmp_path, _moves((5, 2)))
    (first,) = [e for e in _timeline(path, "tool_result") if e["call_id"] == "m1"]
    assert {k: v for k, v in first.items() if k not in ("t", "text", "latency_s")} == {
        "type": "tool_result",
        "turn": 1,
        "call_id": "m1",
        "tool": "move",
        "server": "world",
        "effect": "mutating",
        "verdict": "approved",
        "status": "ok",
    }
    assert isinstance(first["latency_s"], float)
    denied = [e for e in _timeline(path, "tool_result") if e["call_id"] == "m2"]
    assert [(e["verdict"], e["status"]) for e in denied] == [("denied", "denied")]
    (request,) = _timeline(path, "request")[:1]
    assert request["call_id"] is request["server"] is request["latency_s"] is None
    assert all(isinstance(e["latency_s"], float) for e in _timeline(path, "reply"))


async def test_tokens_read_not_reported_when_no_reply_reported_usage(tmp_path: Path) -> None:
    """A session whose replies carry no usage: the summary says tokens "not reported" (in
    the text, the page and the data), never ``0 prompt, 0 completion``."""
    path = await _record(tmp_path, _moves(None))
    text = "\n".join(report(path))
    assert "tokens: not reported" in text
    assert "0 prompt" not in text
    assert "tokens 0/0/0" not in text
    assert "<th>tokens</th><td>not reported</td>" in report_html(path)
    assert report_data(path)["summary"]["tokens"] is None


def test_an_older_transcript_says_its_start_was_not_recorded() -> None:
    """A header written before ``started_at`` existed still reports, saying so."""
    header = {"type": "session", "seq": 0, "t": 0.0, "schema": SCHEMA, "v": 1, "library": "0.1"}
    finish = {"type": "finish", "seq": 1, "t": 0.5, "outcome": "completed", "oversized": True}
    lines = report(Transcript(header, (finish,)))
    assert "started: not recorded (an older transcript)" in lines
