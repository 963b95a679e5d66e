"""Transcripts as evidence: approvals with their verdicts, replayed as the operator answered.

A session run with an approver records, for each question, which call, which tool, the
verdict (approved, denied, timeout, failed, cut), its reason, how long the operator took and
whether the answer timed out. Replay answers each question as the recording says, so a
denial or a timeout is an expected decision, never a difference.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import html
import json
import re
from pathlib import Path
from typing import Any

import msgspec
import pytest

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
    Transcript,
    TranscriptError,
    TranscriptWriter,
    load,
    replay,
    report,
    report_data,
    report_html,
)
from metacrate_grid_agent.transcript import _schema as schema_module
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
    assert "0 attempt(s)" not in text
    facts = report_data(path)["summary"]
    assert (facts["attempts"], facts["retries"]) == (5, 4)


async def test_a_failed_request_keeps_every_attempt(tmp_path: Path) -> None:
    """A request that fails after its retries records each attempt and its error."""
    busy = Reply.error(503, "busy", headers=(("Retry-After", "0"),))
    path = tmp_path / "failed.jsonl"
    async with FakeEndpoint([busy, busy, busy]) as endpoint:
        llm = make_config(endpoint.url, max_retries=2)
        with path.open("w", encoding="utf-8") as stream:
            writer = TranscriptWriter(stream, secret=llm.api_key)
            async with LLMClient(llm) as client:
                loop = make_loop(client, RecordingExecutor())
                run = await run_loop(loop, "walk", on_event=writer)
    # The final status ends the session: an HTTP error status has an outcome of its own.
    assert run.result.outcome == "http_status"
    records = list(map(json.loads, path.read_text().splitlines()))
    failed = [r for r in records if r["type"] == "request_failed"]
    assert [(a["status"], a["error_kind"]) for a in failed[0]["attempt_records"]] == [
        (503, "http_status")
    ] * 3
    assert (failed[0]["error"]["kind"], failed[0]["error"]["status"]) == ("http_status", 503)
    assert "failed: http_status, 3 attempt(s)" in "\n".join(report(path))
    assert report_data(path)["summary"]["attempts"] == 3


# --- a crashed session's record ----------------------------------------------------------------

#: The one-line note of a transcript whose last record was cut mid-line.
CUT_NOTE = "the last record is incomplete (cut mid-line) and was left out"
#: The one-line note of a transcript with no finish record.
NO_FINISH_NOTE = "the session ended without a finish record (process killed?)"


async def test_a_cut_final_line_is_noted_and_everything_before_it_read(tmp_path: Path) -> None:
    """A last line cut mid-way (the process was killed) is left out with a one-line note.

    Protects the normal shape of a crashed session's record: load, report and replay read
    every complete record, say the last one is incomplete and that there is no finish,
    and replay compares what is there.
    """
    path = await record_approvals(tmp_path)
    lines = path.read_text().splitlines()
    cut = tmp_path / "cut.jsonl"
    cut.write_text("\n".join(lines[:-1]) + "\n" + lines[-1][: len(lines[-1]) // 2])
    transcript = load(cut)
    assert len(transcript.records) == len(lines) - 2
    assert transcript.notes == (CUT_NOTE, NO_FINISH_NOTE)
    text = report(cut)
    assert f"note: {CUT_NOTE}" in text
    assert f"note: {NO_FINISH_NOTE}" in text
    found = await replay(cut)
    assert [str(d) for d in found.differences] == []
    assert CUT_NOTE in found.notes
    assert NO_FINISH_NOTE in found.notes


async def test_a_transcript_with_no_finish_record_says_so(tmp_path: Path) -> None:
    """A transcript that stops after a complete record is reported as ended without a finish.

    Protects the operator from reading a killed session as a finished one; replay cuts the
    session where the recording stops and compares what is there.
    """
    path = await record_approvals(tmp_path)
    lines = path.read_text().splitlines()
    short = tmp_path / "short.jsonl"
    short.write_text("\n".join(lines[:-3]) + "\n")
    transcript = load(short)
    assert transcript.notes == (NO_FINISH_NOTE,)
    assert f"note: {NO_FINISH_NOTE}" in report(short)
    found = await replay(short)
    assert [str(d) for d in found.differences] == []


async def test_a_bad_line_in_the_middle_is_still_refused(tmp_path: Path) -> None:
    """Only the last line may be cut: a bad line before it is a TranscriptError naming it."""
    path = await record_approvals(tmp_path)
    lines = path.read_text().splitlines()
    lines[2] = lines[2][:10]
    bad = tmp_path / "bad.jsonl"
    bad.write_text("\n".join(lines) + "\n")
    with pytest.raises(TranscriptError) as caught:
        load(bad)
    assert caught.value.line == 3


# --- the hash chain ------------------------------------------------------------------------------


async def test_each_record_carries_the_hash_of_the_line_before(tmp_path: Path) -> None:
    """Each record's prev is the SHA-256 of the previous line's bytes; the header's is fixed."""
    path = await record_approvals(tmp_path)
    lines = path.read_text().splitlines()
    prevs = [json.loads(line)["prev"] for line in lines]
    assert prevs[0] == "0" * 64
    assert prevs[1:] == [hashlib.sha256(line.encode()).hexdigest() for line in lines[:-1]]


async def test_tampering_one_observation_byte_is_reported_by_load(tmp_path: Path) -> None:
    """Changing one byte of an observation makes load name the changed record.

    Protects the integrity check replay cannot make: replay feeds recorded observations
    back, so only the chain shows that a record was edited after it was written.
    """
    path = await record_approvals(tmp_path)
    lines = path.read_text().splitlines()
    index = next(i for i, line in enumerate(lines) if '"type": "tool_result"' in line)
    at = lines[index].index('"observation": "') + len('"observation": "')
    assert lines[index][at] != "X"
    lines[index] = lines[index][:at] + "X" + lines[index][at + 1 :]
    tampered = tmp_path / "tampered.jsonl"
    tampered.write_text("\n".join(lines) + "\n")
    with pytest.raises(TranscriptError) as caught:
        load(tampered)
    assert caught.value.line == index + 1
    assert f"line {index + 1} was changed" in str(caught.value)


def test_a_transcript_without_the_chain_loads_with_a_note() -> None:
    """A transcript written before the chain loads, noting its integrity cannot be checked."""
    header = {"type": "session", "seq": 0, "t": 0.0, "schema": SCHEMA, "v": 1, "library": "0.1"}
    finish = {"type": "finish", "seq": 1, "t": 0.5, "redacted": True}
    transcript = load([json.dumps(header), json.dumps(finish)])
    assert transcript.notes == (
        "written without a hash chain (an older library): its integrity cannot be checked",
    )


# --- the documented record table -----------------------------------------------------------------

#: Members every record has, documented once above the table.
COMMON = {"type", "seq", "t", "prev", "oversized", "redacted"}


def test_the_record_table_in_the_docs_matches_the_schema() -> None:
    """The transcripts guide lists every record type with exactly the members it has."""
    page = (Path(__file__).parents[2] / "docs" / "guide" / "transcripts.md").read_text("utf-8")
    documented = {
        match[1]: set(re.findall(r"`([a-z_]+)`", match[2]))
        for match in re.finditer(r"^\| `([a-z_]+)` \| (.*) \|$", page, re.MULTILINE)
    }
    expected = {
        kind: {f.encode_name for f in msgspec.structs.fields(cls)} - COMMON
        for kind, cls in schema_module._TYPES.items()
    }
    assert expected == documented


# --- the report at a glance ----------------------------------------------------------------------

#: A final text longer than any timeline entry shows unfolded.
LONG_SUMMARY = "The avatar walked to the fountain. " * 30


async def test_the_page_answers_at_a_glance(tmp_path: Path) -> None:
    """The page opens with the outcome, calls by outcome, approvals, attempts and tokens.

    Protects an operator's first look: how the session ended and what it did, before the
    timeline; denied calls show their id, tool and arguments; the page runs no script.
    """
    path = await record_approvals(tmp_path)
    page = report_html(path)
    glance = page[page.index('<table class="glance">') : page.index("</table>")]
    assert '<td class="completed">completed</td>' in glance
    assert "<td>1 ok, 2 denied</td>" in glance
    assert "<td>1 approved, 1 denied, 1 timeout</td>" in glance
    assert "<th>turns</th><td>4</td>" in glance
    assert "<th>attempts</th><td>4 (0 retries)</td>" in glance
    assert 'class="tool_result denied"' in page
    assert "&lt;- move denied" in page
    assert "(id m2)" in page
    assert "arguments {&quot;x&quot;: 2, &quot;y&quot;: 2}" in page
    assert "<script" not in page.lower()
    assert "default-src 'none'" in page


def test_a_long_text_is_folded_whole_and_escaped() -> None:
    """A text longer than the timeline shows is folded in <details> holding all of it."""
    header = {"type": "session", "seq": 0, "t": 0.0, "schema": SCHEMA, "v": 1, "library": "0.1"}
    hostile = LONG_SUMMARY + "<script>document.title='x'</script>"
    finish = {"type": "finish", "seq": 1, "t": 0.5, "outcome": "completed", "oversized": True}
    page = report_html(Transcript(header, ({**finish, "final_text": hostile},)))
    folded = page[page.index("<details>") : page.index("</details>")]
    assert html.escape(hostile.strip()) in folded
    assert "<script" not in page.lower()


def test_a_cancelled_session_shows_no_finish_reason() -> None:
    """A session cut after a tool-call reply shows its cut, never "finish reason: tool_calls"."""
    header = {"type": "session", "seq": 0, "t": 0.0, "schema": SCHEMA, "v": 1, "library": "0.1"}
    finish = {
        "type": "finish", "seq": 1, "t": 0.5, "outcome": "cancelled", "oversized": True,
        "cancel_reason": "operator_interrupt", "finish_reason": "tool_calls",
    }  # fmt: skip
    transcript = Transcript(header, (finish,))
    text = "\n".join(report(transcript))
    assert "tool_calls" not in text
    assert "outcome: cancelled (cancelled: operator_interrupt)" in text
    assert "tool_calls" not in report_html(transcript)


async def test_text_page_and_json_give_the_same_facts(tmp_path: Path) -> None:
    """The text report, the page and report_data state the same summary."""
    path = await record_approvals(tmp_path)
    data = report_data(path)
    facts = data["summary"]
    assert facts["outcome"] == "completed"
    assert facts["calls"] == {"ok": 1, "denied": 2}
    assert facts["approvals"] == {"approved": 1, "denied": 1, "timeout": 1}
    assert (facts["turns"], facts["attempts"], facts["retries"]) == (4, 4, 0)
    text = "\n".join(report(path))
    assert "outcome: completed (finish reason: stop)" in text
    assert "calls: 1 ok, 2 denied" in text
    assert "approvals: 1 approved, 1 denied, 1 timeout" in text
    assert data["notes"] == []
    assert [e["type"] for e in data["timeline"]][:3] == ["request", "reply", "approval"]


class WaitingApprover:
    """Never answers; tells the test it was asked."""

    def __init__(self) -> None:
        self.asked = asyncio.Event()

    async def approve(self, request: ApprovalRequest, cancel: CancelToken) -> Approved | Denied:
        self.asked.set()
        await asyncio.Event().wait()
        raise AssertionError("unreachable")  # pragma: no cover


async def test_a_session_cut_while_the_operator_decides_records_cut_and_replays(
    tmp_path: Path,
) -> None:
    """A cut while the approver waits is recorded as verdict ``cut`` and cut again in replay."""
    path = tmp_path / "cut-approval.jsonl"
    token = CancelToken()
    approver = WaitingApprover()
    async with FakeEndpoint(_script()[:1]) as endpoint:
        llm = make_config(endpoint.url)
        with path.open("w", encoding="utf-8") as stream:
            writer = TranscriptWriter(stream, secret=llm.api_key)
            writer.begin(
                session_id=SESSION, generation=0, goal="walk", tools=TOOLS,
                config=ToolLoopConfig(), system_prompt=SYSTEM, llm=llm,
            )  # fmt: skip
            async with LLMClient(llm) as client:
                loop = make_loop(client, RecordingExecutor(), approver=approver)
                handle = start_loop(loop, "walk", cancel=token, on_event=writer)
                await approver.asked.wait()
                token.cancel("operator_interrupt")
                run = await handle.finish()
    assert run.result.outcome == "cancelled"
    found = _approvals(path)
    assert [(r["id"], r["verdict"], r["timed_out"]) for r in found] == [("m1", "cut", False)]
    replayed = await replay(path)
    assert [str(d) for d in replayed.differences] == []
