"""The session transcript: written by a sink, redacted and bounded, replayed, reported.

Sessions run against the loopback fake endpoint; their transcripts are then replayed (again
on loopback) and compared decision by decision.
"""

from __future__ import annotations

import asyncio
import dataclasses
import io
import json
from typing import TYPE_CHECKING, Any

import pytest

from metacrate_grid_agent import (
    Effect,
    Failure,
    LLMClient,
    LLMConfig,
    Secret,
    SessionGeneration,
    Success,
    Tool,
    ToolLoopConfig,
)
from metacrate_grid_agent.testing import FakeEndpoint, Reply
from metacrate_grid_agent.transcript import (
    SCHEMA,
    TranscriptError,
    TranscriptWriter,
    load,
    replay,
    report,
    report_html,
)
from tests.conftest import CANARY_KEYS, assert_no_canary
from tests.llm_transport.loop_support import (
    LONG_STALL_S,
    LOOK_SCHEMA,
    SESSION,
    SYSTEM,
    TOOLS,
    RecordingExecutor,
    Step,
    call,
    calls_reply,
    make_loop,
    start_loop,
)
from tests.llm_transport.support import FAST, make_config

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

#: A long observation: a lower max_observation_bytes cuts it differently.
LONG = "the fountain " + "splashes " * 200


def _script() -> list[Reply]:
    """A retry, a failed call, a rejected call, an ok call with a long observation, the end."""
    return [
        Reply.error(503, "busy", headers=(("Retry-After", "0"),)),
        calls_reply(call("c1", "look", {"radius": 5}), call("c2", "move", {"x": -1}), usage=(9, 4)),
        calls_reply(call("c3", "move", {"x": 1, "y": 2}), usage=(12, 3)),
        Reply.completion("I looked and walked.", usage=(15, 6)),
    ]


async def _record(
    tmp_path: Path,
    script: list[Reply],
    steps: dict[str, Step] | None = None,
    *,
    cut_at_request: int | None = None,
    cut_at_call: int | None = None,
    config: ToolLoopConfig | None = None,
    key: str | None = None,
) -> tuple[Path, Any]:
    """Run a session with a transcript sink; optionally supersede it at a request or call."""
    path = tmp_path / "session.jsonl"
    executor = RecordingExecutor(steps or {"c1": Step(outcome=Failure("too dark to see"))})
    async with FakeEndpoint(script) as endpoint:
        llm = (
            make_config(endpoint.url)
            if key is None
            else LLMConfig(endpoint_url=endpoint.url, api_key=Secret(key), **FAST)
        )
        with path.open("w", encoding="utf-8") as stream:
            writer = TranscriptWriter(stream, secret=llm.api_key)
            loop_config = config or ToolLoopConfig()
            writer.begin(
                session_id=SESSION,
                generation=0,
                goal="walk to the fountain",
                tools=TOOLS,
                config=loop_config,
                system_prompt=SYSTEM,
                llm=llm,
            )
            generation = SessionGeneration(SESSION)
            async with LLMClient(llm) as client:
                handle = start_loop(
                    make_loop(client, executor, config=loop_config),
                    "walk to the fountain",
                    generation=generation,
                    on_event=writer,
                )
                if cut_at_request is not None:
                    await endpoint.wait_for_request(cut_at_request)
                    generation.advance()
                if cut_at_call is not None:
                    await executor.wait_for_call(cut_at_call)
                    generation.advance()
                run = await handle.finish()
    return path, run


async def test_a_recorded_session_replays_with_no_difference(tmp_path: Path) -> None:
    """Replaying a transcript with today's library and its own settings changes nothing.

    Protects the record of a whole session (retry, failed, rejected and ok calls, the final
    text) being enough to re-run it: same calls, statuses, observations, outcome.
    """
    steps = {"c1": Step(outcome=Failure("too dark to see")), "c3": Step(outcome=Success(LONG))}
    path, run = await _record(tmp_path, _script(), steps)
    assert run.result.outcome == "completed"
    found = await replay(path)
    assert found.differences == ()
    assert found.same
    assert found.result is not None
    assert found.result.outcome == "completed"
    assert [(c.call_id, c.status) for c in found.result.calls] == [
        (c.call_id, c.status) for c in run.result.calls
    ]
    assert "no difference" in "\n".join(found.lines())


async def test_a_lower_bound_shows_up_as_a_difference(tmp_path: Path) -> None:
    """A lower ``max_observation_bytes`` or ``max_calls_per_turn`` is reported where it bites."""
    steps = {"c1": Step(outcome=Failure("too dark to see")), "c3": Step(outcome=Success(LONG))}
    path, _ = await _record(tmp_path, _script(), steps)

    cut = await replay(path, config=ToolLoopConfig(max_observation_bytes=128))
    assert [d.where for d in cut.differences] == [
        "turn 1 call c2 (move) observation",
        "turn 2 call c3 (move) observation",
    ]
    assert not cut.same

    fewer = await replay(path, config=ToolLoopConfig(max_calls_per_turn=1))
    assert fewer.result is not None
    assert fewer.result.outcome == "bound_reached"
    wheres = {d.where: (d.recorded, d.replayed) for d in fewer.differences}
    assert wheres["session outcome"] == ("completed", "bound_reached")
    assert wheres["session bound"] == ("None", "calls_per_turn")
    assert wheres["turn 1 call c1 (look)"] == ("failed", "not reached")
    assert wheres["model requests"] == ("3", "1")


async def test_a_lower_client_bound_shows_up_as_a_difference(tmp_path: Path) -> None:
    """The client's reply-reading settings are recorded (never the key) and replayed; a
    lower ``max_tool_calls`` turns the two-call reply into a failed request."""
    path, _ = await _record(tmp_path, _script())
    header = load(path).header
    assert header["llm"]["max_tool_calls"] == 32
    assert "api_key" not in header["llm"]
    assert (await replay(path)).same
    found = await replay(path, llm_settings={"max_tool_calls": 1})
    wheres = {d.where: (d.recorded, d.replayed) for d in found.differences}
    assert wheres["session outcome"] == ("completed", "transport_error")
    assert wheres["session error"] == ("None", "oversized_value")


async def test_a_stricter_schema_shows_up_as_a_difference(tmp_path: Path) -> None:
    """A validation change (here, a tighter schema) turns a run call into a rejected one."""
    path, _ = await _record(tmp_path, _script())
    tight = Tool(
        name="look",
        description="Describe what the avatar sees within radius metres.",
        parameters={**LOOK_SCHEMA, "properties": {"radius": {"type": "number", "maximum": 1}}},
        effect=Effect.READ_ONLY,
    )
    found = await replay(path, tools=[tight, TOOLS[1]])
    assert [(d.where, d.recorded, d.replayed) for d in found.differences] == [
        ("turn 1 call c1 (look)", "failed", "rejected")
    ]


@pytest.mark.parametrize("where", ["request", "call"])
async def test_a_supersession_is_cut_again_at_the_same_point(tmp_path: Path, where: str) -> None:
    """A session superseded mid-request, or mid-call (a mutating call: ambiguous), replays
    with the same cut, the same records and the same outcome."""
    stalled = dataclasses.replace(Reply.completion("late"), stall_before_headers_s=LONG_STALL_S)
    gate = asyncio.Event()
    steps = {"c1": Step(outcome=Failure("too dark"))}
    if where == "call":
        steps["c3"] = Step(gate=gate)
    script = [*_script()[1:3], stalled]
    path, run = await _record(
        tmp_path,
        script,
        steps,
        cut_at_request=2 if where == "request" else None,
        cut_at_call=1 if where == "call" else None,
    )
    assert run.result.outcome == "superseded"
    found = await replay(path)
    assert found.differences == ()
    assert found.result is not None
    assert found.result.outcome == "superseded"
    if where == "call":
        assert found.result.ambiguous_call is not None


#: A key of a shape no credential pattern recognises.
HEX_KEY = "3a7bd3e2360a3d29eea436fcfb7e44c735d117c42d1c1835420b6b9942dd4f1b"


async def test_the_transcript_is_redacted_and_bounded(tmp_path: Path) -> None:
    """The key echoed in a reply, an argument and an observation appears nowhere in the file;
    a huge observation is cut to the field bound."""
    echo = f"key {HEX_KEY} here"
    script = [
        calls_reply(call("c1", "look", {"radius": 1}), text=echo),
        Reply.completion(echo),
    ]
    steps = {"c1": Step(outcome=Success(echo + "x" * 100_000))}
    path, run = await _record(tmp_path, script, steps, key=HEX_KEY)
    assert run.result.outcome == "completed"
    text = path.read_text("utf-8")
    assert HEX_KEY not in text.lower()
    assert HEX_KEY[:12] not in text.lower()
    assert "key [REDACTED] here" in text
    records = [json.loads(line) for line in text.splitlines()]
    assert [r["seq"] for r in records] == list(range(len(records)))
    (result,) = [r for r in records if r["type"] == "tool_result"]
    assert len(result["observation"].encode()) <= 16 * 1024
    assert result["observation"].endswith("[truncated]")


@pytest.mark.parametrize(
    "form",
    [
        pytest.param(lambda key: key[:40], id="slice"),
        pytest.param(lambda key: key[:40].upper(), id="upper-slice"),
        pytest.param(lambda key: key[-40:], id="end-slice"),
    ],
)
async def test_a_finish_reason_showing_the_key_is_redacted_in_every_record(
    tmp_path: Path, canary_key: str, form: Callable[[str], str]
) -> None:
    """A ``finish_reason`` holding a slice of the key is redacted in the reply and the finish
    record alike; the finish record keeps its outcome and every other field."""
    script = [Reply.completion("done", finish_reason=form(canary_key))]
    path, run = await _record(tmp_path, script, key=canary_key)
    assert run.result.outcome == "completed"
    text = path.read_text("utf-8")
    assert_no_canary(text)
    records = {r["type"]: r for r in map(json.loads, text.splitlines())}
    assert records["reply"]["finish_reason"] == "[REDACTED]"
    finish = records["finish"]
    assert (
        finish["outcome"],
        finish["finish_reason"],
        finish["final_text"],
    ) == ("completed", "[REDACTED]", "done")


@pytest.mark.parametrize("key", [HEX_KEY, CANARY_KEYS["backslash"], CANARY_KEYS["quotes"]])
async def test_a_finish_reason_that_is_the_whole_key_loses_the_field_not_the_record(
    tmp_path: Path, key: str
) -> None:
    """The whole key as ``finish_reason``: that field is redacted, the finish record (its
    outcome, turns, final text) is kept, and the key is nowhere in the file, escaped or not."""
    script = [Reply.completion("done", finish_reason=key)]
    path, run = await _record(tmp_path, script, key=key)
    assert run.result.outcome == "completed"
    text = path.read_text("utf-8")
    assert_no_canary(text)
    assert key.lower()[:12] not in text.lower()
    finish = [json.loads(line) for line in text.splitlines()][-1]
    assert (
        finish["type"],
        finish["outcome"],
        finish["turns"],
        finish["finish_reason"],
        finish["final_text"],
    ) == ("finish", "completed", 1, "[REDACTED]", "done")
    assert "redacted" not in finish


@pytest.mark.parametrize("key", [HEX_KEY, CANARY_KEYS["backslash"], CANARY_KEYS["quotes"]])
def test_a_caller_text_that_is_the_key_loses_the_field_not_the_record(key: str) -> None:
    """A text no redaction was meant for (the caller's session id, a tool's name) that holds
    the key is redacted where it is; the header keeps every other member."""
    from metacrate_grid_agent import LoopEvent

    stream = io.StringIO()
    writer = TranscriptWriter(stream, secret=key)
    writer.begin(session_id=key, generation=3, goal="walk", tools=TOOLS, config=ToolLoopConfig())
    writer(LoopEvent("request", 1, request_id=key))
    text = stream.getvalue()
    assert_no_canary(text)
    assert key.lower()[:12] not in text.lower()
    header, request = map(json.loads, text.splitlines())
    assert (
        header["type"],
        header["session_id"],
        header["generation"],
        header["goal"],
    ) == ("session", "[REDACTED]", 3, "walk")
    assert (request["type"], request["turn"], request["request_id"]) == ("request", 1, "[REDACTED]")


@pytest.mark.parametrize("mark", ["\u00ad", "\u034f", "\ufe0f", "\u180e"], ids=ascii)
async def test_a_key_interleaved_with_invisible_characters_is_redacted(
    tmp_path: Path, mark: str
) -> None:
    """The key with a soft hyphen, a grapheme joiner, a variation selector or a Mongolian
    vowel separator between its characters, in a reply and an observation: redacted."""
    echo = f"key {mark.join(HEX_KEY)} here"
    script = [calls_reply(call("c1", "look", {"radius": 1}), text=echo), Reply.completion(echo)]
    steps = {"c1": Step(outcome=Success(echo))}
    path, run = await _record(tmp_path, script, steps, key=HEX_KEY)
    assert run.result.outcome == "completed"
    records = [json.loads(line) for line in path.read_text("utf-8").splitlines()]
    solid = json.dumps(records, ensure_ascii=False).replace(mark, "").lower()
    assert HEX_KEY[:12] not in solid
    assert HEX_KEY[-12:] not in solid
    (result,) = [r for r in records if r["type"] == "tool_result"]
    assert result["observation"] == "key [REDACTED] here"


def test_the_header_shows_the_endpoint_by_the_one_url_rule() -> None:
    """The header's endpoint hides user-info and credential-named query values, as every
    other place the library shows a URL; the other parameters are kept."""
    secret = "qs-7Hd93kPzQ0vW5mXc"
    stream = io.StringIO()
    url = f"https://u:{secret}@h.example/v1?api-version=2024-10-21&code={secret}"
    TranscriptWriter(stream).begin(
        session_id=SESSION, generation=0, goal="walk", tools=TOOLS, config=ToolLoopConfig(),
        endpoint_url=url,
    )  # fmt: skip
    header = json.loads(stream.getvalue())
    assert (
        header["endpoint"]
        == "https://[REDACTED]@h.example/v1?api-version=2024-10-21&code=[REDACTED]"
    )
    assert secret not in stream.getvalue()


def test_the_total_bound_drops_records_but_keeps_the_finish() -> None:
    """Past ``max_total_bytes`` records are dropped and counted; the finish still fits."""
    from metacrate_grid_agent import LoopEvent, LoopResult, Outcome, UsageTotals

    stream = io.StringIO()
    writer = TranscriptWriter(
        stream, max_field_bytes=64, max_record_bytes=1024, max_total_bytes=4096
    )
    for turn in range(1, 200):
        writer(LoopEvent("request", turn, request_id=f"{SESSION}-g0-t{turn}"))
    result = LoopResult(
        outcome=Outcome.BOUND_REACHED, session_id=SESSION, generation=0, final_text=None,
        turns=199, calls=(), usage=UsageTotals(), usage_records=(), usage_records_dropped=0,
        attempts=199, latency_s=1.0, bound="turns",
    )  # fmt: skip
    writer(LoopEvent("finish", 199, result=result))
    text = stream.getvalue()
    assert len(text.encode()) <= 4096
    transcript = load(text.splitlines())
    finish = transcript.finish
    assert finish is not None
    assert finish["records_dropped"] == writer.records_dropped > 0


async def test_report_text_and_html(tmp_path: Path) -> None:
    """The timeline names every request, call, status, token count and the ending; the HTML
    page is self-contained (no script, nothing loaded) and escapes recorded text."""
    steps = {"c1": Step(outcome=Failure("<script>alert(1)</script>"))}
    path, run = await _record(tmp_path, _script(), steps)
    lines = "\n".join(report(path))
    assert f"request {run.events[0].request_id}" in lines
    assert "attempt 1 failed: http_status (HTTP 503), retried after 0.00 s (retry_after)" in lines
    assert "<- look failed" in lines
    assert "<- move rejected" in lines
    assert "tokens 9/4/13" in lines
    assert "session ended: completed (finish reason: stop); 3 turn(s), 3 call(s)" in lines
    page = report_html(path)
    assert page.startswith("<!doctype html>")
    assert "<script" not in page.lower()
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "src=" not in page
    assert "href=" not in page
    assert "default-src 'none'" in page


def test_load_refuses_what_it_cannot_read(tmp_path: Path) -> None:
    """Not JSON, no header, another schema or another version: a TranscriptError each; the
    header the writer makes when no session was begun is a whole transcript."""
    header = {"type": "session", "seq": 0, "t": 0.0, "schema": SCHEMA, "v": 1, "library": "0"}
    cases = [
        ["not json"],
        [json.dumps({"type": "request"})],
        [json.dumps({**header, "schema": "other"})],
        [json.dumps({**header, "v": 99})],
    ]
    for lines in cases:
        with pytest.raises(TranscriptError):
            load(lines)
    with pytest.raises(TranscriptError):
        load(tmp_path / "missing.jsonl")
    assert load([json.dumps(header)]).records == ()


async def test_tools_refused_today_are_a_difference(tmp_path: Path) -> None:
    """A tool table today's validation refuses is reported as the one difference."""
    path, _ = await _record(tmp_path, _script())
    bad = Tool(
        name="look", description="x", parameters={"type": "nonsense"}, effect=Effect.READ_ONLY
    )
    found = await replay(path, tools=[bad, TOOLS[1]])
    assert found.result is None
    assert [(d.where, d.recorded) for d in found.differences] == [("tools", "accepted")]
    assert found.differences[0].replayed.startswith("refused (")


def test_a_failing_stream_stops_the_transcript_not_the_session() -> None:
    """A stream that raises disables the writer with the reason; the sink never raises."""
    from metacrate_grid_agent import LoopEvent

    class Broken(io.StringIO):
        def write(self, text: str) -> int:
            raise OSError("disk full")

    writer = TranscriptWriter(Broken())
    writer(LoopEvent("request", 1, request_id="agent-1-g0-t1"))
    writer(LoopEvent("request", 2, request_id="agent-1-g0-t2"))
    assert writer.error == "OSError: disk full"
