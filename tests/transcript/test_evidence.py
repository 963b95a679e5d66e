"""Transcripts as evidence: approvals with their verdicts, replayed as the operator answered.

A session run with an approver records, for each question, which call, which tool, the
verdict (approved, denied, timeout, failed, cut), its reason, how long the operator took and
whether the answer timed out. Replay answers each question as the recording says, so a
denial or a timeout is an expected decision, never a difference.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from typing import TYPE_CHECKING, Any

from metacrate_grid_agent import (
    ApprovalRequest,
    Approved,
    CancelToken,
    Denied,
    LLMClient,
    SessionGeneration,
    ToolLoopConfig,
)
from metacrate_grid_agent.testing import FakeEndpoint, Reply
from metacrate_grid_agent.transcript import (
    SCHEMA,
    TranscriptWriter,
    load,
    replay,
    report,
    report_html,
)
from tests.llm_transport.loop_support import (
    LONG_STALL_S,
    SESSION,
    SYSTEM,
    TOOLS,
    RecordingExecutor,
    call,
    calls_reply,
    make_loop,
    run_loop,
    start_loop,
)
from tests.llm_transport.support import make_config

if TYPE_CHECKING:
    from pathlib import Path

#: The approval timeout of the recorded session: short, against an approver that never answers.
APPROVAL_TIMEOUT_S = 0.05


class ScriptedApprover:
    """Approves the first call, denies the second, never answers the third."""

    def __init__(self) -> None:
        self.asked: list[str] = []

    async def approve(self, request: ApprovalRequest, cancel: CancelToken) -> Approved | Denied:
        self.asked.append(request.call.id)
        if len(self.asked) == 1:
            return Approved()
        if len(self.asked) == 2:
            return Denied("not into the lake")
        await asyncio.Event().wait()
        raise AssertionError("unreachable")  # pragma: no cover


def _script() -> list[Reply]:
    return [
        calls_reply(call("m1", "move", {"x": 1, "y": 1})),
        calls_reply(call("m2", "move", {"x": 2, "y": 2})),
        calls_reply(call("m3", "move", {"x": 3, "y": 3})),
        Reply.completion("done"),
    ]


async def record_approvals(tmp_path: Path) -> Path:
    """A session whose approver approves, denies, then times out, written to a file."""
    path = tmp_path / "approvals.jsonl"
    config = ToolLoopConfig(approval_timeout_s=APPROVAL_TIMEOUT_S)
    async with FakeEndpoint(_script()) as endpoint:
        llm = make_config(endpoint.url)
        with path.open("w", encoding="utf-8") as stream:
            writer = TranscriptWriter(stream, secret=llm.api_key)
            writer.begin(
                session_id=SESSION,
                generation=0,
                goal="walk",
                tools=TOOLS,
                config=config,
                system_prompt=SYSTEM,
                llm=llm,
            )
            async with LLMClient(llm) as client:
                loop = make_loop(
                    client, RecordingExecutor(), config=config, approver=ScriptedApprover()
                )
                await run_loop(loop, "walk", generation=SessionGeneration(SESSION), on_event=writer)
    return path


def _approvals(path: Path) -> list[dict[str, Any]]:
    return [r for r in map(json.loads, path.read_text().splitlines()) if r["type"] == "approval"]


async def test_approval_records_carry_call_verdict_reason_and_wait(tmp_path: Path) -> None:
    """Each approval record names the call and tool, the verdict, the reason and the wait.

    Protects the operator's evidence: which call was approved, denied or timed out, why,
    and how long the operator took, not just the turn.
    """
    path = await record_approvals(tmp_path)
    found = _approvals(path)
    assert [(r["id"], r["name"], r["verdict"], r["timed_out"]) for r in found] == [
        ("m1", "move", "approved", False),
        ("m2", "move", "denied", False),
        ("m3", "move", "timeout", True),
    ]
    assert [r["reason"] for r in found] == [None, "not into the lake", "no answer within 0.05 s"]
    assert all(isinstance(r["wait_s"], float) for r in found)
    assert found[2]["wait_s"] >= APPROVAL_TIMEOUT_S


async def test_reports_show_each_verdict_never_a_raw_record(tmp_path: Path) -> None:
    """The text and HTML reports show each approval as a verdict line, not a Python dict."""
    path = await record_approvals(tmp_path)
    text = "\n".join(report(path))
    assert "approval m1 (move): approved" in text
    assert "approval m2 (move): denied (not into the lake)" in text
    assert "approval m3 (move): timeout (no answer within 0.05 s)" in text
    assert "{'turn'" not in text
    page = report_html(path)
    assert "approval m2 (move): denied (not into the lake)" in page
    assert "{&#x27;turn" not in page


async def test_a_session_with_approval_denial_and_timeout_replays_with_no_difference(
    tmp_path: Path,
) -> None:
    """Replay answers each question as the recording says: a denial or timeout is expected.

    Protects replay as a regression test of a session in which the operator refused calls.
    """
    path = await record_approvals(tmp_path)
    found = await replay(path)
    assert [str(d) for d in found.differences] == []
    assert found.result is not None
    assert [(c.call_id, c.status) for c in found.result.calls] == [
        ("m1", "ok"),
        ("m2", "denied"),
        ("m3", "denied"),
    ]


def test_an_old_approval_record_with_only_a_turn_still_loads() -> None:
    """Transcripts written before approvals carried their verdict still load."""
    header = {"type": "session", "seq": 0, "t": 0.0, "schema": SCHEMA, "v": 1, "library": "0.1"}
    old = {"type": "approval", "seq": 1, "t": 0.5, "turn": 2}
    transcript = load([json.dumps(header), json.dumps(old)])
    assert [dict(r) for r in transcript.records] == [old]
    assert "approval asked (turn 2; no verdict recorded)" in "\n".join(report(transcript))


async def test_a_request_cut_after_four_503s_keeps_every_attempt(tmp_path: Path) -> None:
    """A request cut by the operator after four 503s records its five attempts.

    Protects the evidence of a request that never completed: each attempt's status,
    latency and reason, not "0 attempt(s)".
    """
    busy = Reply.error(503, "busy", headers=(("Retry-After", "0"),))
    stall = dataclasses.replace(Reply.completion("late"), stall_before_headers_s=LONG_STALL_S)
    path = tmp_path / "cut.jsonl"
    token = CancelToken()
    async with FakeEndpoint([busy, busy, busy, busy, stall]) as endpoint:
        llm = make_config(endpoint.url, max_retries=10)
        with path.open("w", encoding="utf-8") as stream:
            writer = TranscriptWriter(stream, secret=llm.api_key)
            async with LLMClient(llm) as client:
                handle = start_loop(
                    make_loop(client, RecordingExecutor()), "walk", cancel=token, on_event=writer
                )
                await endpoint.wait_for_request(4)
                token.cancel("operator_interrupt")
                run = await handle.finish()
    assert run.result.outcome == "cancelled"
    failed = [
        r for r in map(json.loads, path.read_text().splitlines()) if r["type"] == "request_failed"
    ]
    assert len(failed) == 1
    attempts = failed[0]["attempt_records"]
    assert [(a["attempt"], a["status"], a["error_kind"]) for a in attempts] == [
        (1, 503, "http_status"),
        (2, 503, "http_status"),
        (3, 503, "http_status"),
        (4, 503, "http_status"),
        (5, None, "cancelled"),
    ]
    assert all(a["latency_s"] >= 0 for a in attempts)
    assert (failed[0]["error"], failed[0]["cancel_reason"]) == (None, "operator_interrupt")
    text = "\n".join(report(path))
    assert "cut (operator_interrupt), 5 attempt(s)" in text
