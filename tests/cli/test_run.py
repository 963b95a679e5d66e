"""``grid-agent run`` and ``grid-agent demo``: whole tool-loop sessions in the sandbox region.

Without ``--config`` the child plays against its own built-in scripted model; with
``--config`` it plays against the test's fake endpoint, here answered by the same scripted
model so the session is known in advance.
"""

from __future__ import annotations

import json
import re
from typing import TYPE_CHECKING

import pytest

from metacrate_grid_agent import __version__
from metacrate_grid_agent.cli._scripted_model import DISCLAIMER, respond
from metacrate_grid_agent.testing import FakeEndpoint, Reply
from tests.cli.conftest import CANARY, RunCLI, WriteConfig, assert_no_key, together

if TYPE_CHECKING:
    from pathlib import Path

RESULT_KEYS = {
    "model",
    "outcome",
    "bound",
    "cancel_reason",
    "finish_reason",
    "final_text",
    "turns",
    "calls",
    "usage",
    "attempts",
    "latency_ms",
    "compactions",
    "ambiguous_call",
    "error",
    "session_id",
    "generation",
    "world",
}
SANDBOX_TOOLS = ["look_around", "inspect", "move_to", "say", "give"]
#: The scripted session: (name, status) of every call, in order.
SCRIPTED_CALLS = [
    ("look_around", "ok"),
    ("move_to", "rejected"),
    ("move_to", "ok"),
    ("say", "ok"),
]


async def test_demo_end_to_end(cli: RunCLI) -> None:
    """``demo`` completes (exit 0) and says plainly that the model is scripted.

    Protects the stderr progress (banner, each request, each call with its arguments, the
    rejected invalid call) and the stdout report (outcome, summary, turns table, calls).
    """
    result = await cli("demo")
    assert result.returncode == 0, result.stderr
    err, out = result.stderr, result.stdout
    assert "SCRIPTED model" in err
    assert "not a real language model" in err
    assert re.search(r"\[turn 1\] request cli-\d{8}T\d{6}Z-[0-9a-f]{8}-g0-r1-t1\n", err), err
    assert "-> look_around {}" in err
    assert "[turn 2]   <- move_to REJECTED:" in err
    assert '-> move_to {"x": 19, "y": 23}' in err
    assert "session finished: completed" in err
    assert "model:     scripted" in out
    assert "outcome:   completed" in out
    assert "summary:   I looked around" in out
    assert DISCLAIMER in out
    assert "total  5 turn(s)" in out
    assert "move_to      rejected" in out
    assert "sandbox:   Scout at (19, 23)" in out


async def test_run_json_and_transcript(cli: RunCLI, tmp_path: Path) -> None:
    """``run --json --transcript``: one JSON result on stdout, and a JSON-lines transcript.

    The JSON has the documented members; the invalid call is a rejected call; the transcript
    is the public format: the session header, one record per event, the finish record.
    """
    transcript = tmp_path / "session.jsonl"
    result = await cli(
        "run", "--goal", "Explore and greet.", "--json", "--transcript", str(transcript)
    )
    assert result.returncode == 0, result.stderr
    data = result.json()
    assert set(data) == RESULT_KEYS
    assert data["model"] == "scripted"
    assert data["outcome"] == "completed"
    assert (data["bound"], data["cancel_reason"], data["error"]) == (None, None, None)
    assert data["turns"] == 5
    assert data["attempts"] == 5
    assert [(c["name"], c["status"]) for c in data["calls"]] == SCRIPTED_CALLS
    assert [c["turn"] for c in data["calls"]] == [1, 2, 3, 4]
    assert "integer" in data["calls"][1]["observation"]
    assert set(data["calls"][0]) == {
        "turn", "id", "name", "status", "arguments", "reissued_from", "observation"
    }  # fmt: skip
    # Each call's arguments, as the model sent them (bounded), even a rejected call's.
    assert all(isinstance(c["arguments"], str) for c in data["calls"])
    assert json.loads(data["calls"][0]["arguments"]) == {}
    assert '"x"' in data["calls"][1]["arguments"]
    assert data["finish_reason"] == "stop"
    assert data["usage"]["requests"] == 5
    assert data["usage"]["total_tokens"] > 0
    assert isinstance(data["latency_ms"], int)
    assert "rejected" in data["final_text"]
    assert data["world"]["position"] == [19, 23]
    assert [line["speaker"] for line in data["world"]["chat"]] == ["Scout"]

    records = [json.loads(line) for line in transcript.read_text("utf-8").splitlines()]
    header = records[0]
    assert (header["type"], header["schema"], header["v"]) == (
        "session",
        "metacrate-grid-agent.transcript",
        1,
    )
    assert header["labels"] == {"model": "scripted"}
    assert [t["name"] for t in header["tools"]] == SANDBOX_TOOLS
    assert header["goal"] == "Explore and greet."
    kinds = [r["type"] for r in records]
    assert kinds.count("request") == 5
    assert kinds.count("reply") == 5
    assert kinds.count("tool_call") == 3  # the rejected call never reached the executor
    assert kinds.count("tool_result") == 4
    assert kinds[-1] == "finish"
    assert records[-1]["outcome"] == "completed"
    assert records[-1]["final_text"] == data["final_text"]
    rejected = [r for r in records if r["type"] == "tool_result" and r["status"] == "rejected"]
    assert [r["name"] for r in rejected] == ["move_to"]
    assert "reasoning" not in transcript.read_text("utf-8")


async def test_run_against_configured_endpoint(cli: RunCLI, write_config: WriteConfig) -> None:
    """With --config the session talks to that endpoint, with the key from the environment.

    Protects the [tool_loop] table being honoured, the sandbox tools being offered, the
    session's request ids, and "model": "endpoint" (no scripted banner).
    """
    async with FakeEndpoint(responder=respond) as ep:
        config = write_config(ep.url, tool_loop={"max_turns": 6})
        result = await cli(
            "run", "--goal", "Explore.", "--config", str(config), "--json",
            "--session-id", "plaza-7",
        )  # fmt: skip
    assert result.returncode == 0, result.stderr
    data = result.json()
    assert (data["model"], data["outcome"], data["turns"]) == ("endpoint", "completed", 5)
    assert "SCRIPTED" not in result.stderr
    assert [r.header("Authorization") for r in ep.requests] == [f"Bearer {CANARY}"] * 5
    assert [r.header("X-Request-Id") for r in ep.requests] == [
        f"plaza-7-g0-r1-t{n}" for n in range(1, 6)
    ]
    body = ep.requests[0].json()
    assert [t["function"]["name"] for t in body["tools"]] == SANDBOX_TOOLS
    move = next(t for t in body["tools"] if t["function"]["name"] == "move_to")
    assert move["function"]["parameters"]["additionalProperties"] is False
    assert body["messages"][1] == {"role": "user", "content": "Explore."}


@pytest.mark.slow
async def test_other_outcomes_exit_1(cli: RunCLI, write_config: WriteConfig) -> None:
    """A session that does not complete exits 1 and says why.

    A turn bound (max_turns = 2) gives "bound_reached" with bound "turns"; a 400 from the
    endpoint gives "http_status", the error kind, also in the human report.
    """
    async with (
        FakeEndpoint(responder=respond) as bounded_ep,
        FakeEndpoint(responder=lambda _: Reply.error(400, "model not found")) as failing_ep,
    ):
        bounded_cfg = write_config(bounded_ep.url, tool_loop={"max_turns": 2})
        failing_cfg = write_config(failing_ep.url, llm={"max_retries": 0})
        bounded, failing, failing_text = await together(
            cli("run", "--goal", "Go.", "--config", str(bounded_cfg), "--json"),
            cli("run", "--goal", "Go.", "--config", str(failing_cfg), "--json"),
            cli("run", "--goal", "Go.", "--config", str(failing_cfg)),
        )
    assert bounded.returncode == 1
    data = bounded.json()
    assert (data["outcome"], data["bound"], data["turns"]) == ("bound_reached", "turns", 2)
    assert failing.returncode == 1
    data = failing.json()
    assert data["outcome"] == "http_status"
    assert data["error"]["kind"] == "http_status"
    assert "model not found" in data["error"]["message"]
    assert failing_text.returncode == 1
    assert "outcome:   http_status" in failing_text.stdout
    assert "error:     http_status" in failing_text.stdout
    assert "request failed after 1 attempt(s): http_status" in failing_text.stderr


@pytest.mark.slow
async def test_run_usage_errors_exit_2(cli: RunCLI, tmp_path: Path) -> None:
    """Missing --goal, an empty goal, a bad config and an unwritable transcript: exit 2."""
    bad = tmp_path / "bad.toml"
    bad.write_text(f'[llm]\nendpoint_url = "https://x.example/v1"\napi_key = "{CANARY}"\n'
                   "max_turns = 3\n", encoding="utf-8")  # fmt: skip
    results = await together(
        cli("run"),
        cli("run", "--goal", "   ", "--json"),
        cli("run", "--goal", "Go.", "--config", str(bad), "--json"),
        cli("run", "--goal", "Go.", "--transcript", str(tmp_path / "no" / "dir" / "t.jsonl")),
        cli("demo", "--goal", "Go."),
    )
    assert [r.returncode for r in results] == [2, 2, 2, 2, 2]
    assert "--goal" in results[0].stderr
    assert results[1].json()["kind"] == "configuration"
    config_error = results[2].json()
    assert config_error["kind"] == "configuration"
    assert "llm.max_turns" in config_error["message"]
    assert "cannot write transcript" in results[3].stderr
    for result in results:
        assert_no_key(result.stdout, result.stderr)


async def test_version(cli: RunCLI) -> None:
    """``--version`` prints the package version and exits 0."""
    result = await cli("--version")
    assert result.returncode == 0
    assert result.stdout.strip() == f"grid-agent {__version__}"


def test_run_tunes_the_collector_once_before_the_session(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``run`` (and ``demo``) call the library's ``tune_gc_for_many_sessions`` once, after
    the arguments are checked and before the session starts, as an application should."""
    from metacrate_grid_agent.cli import _run
    from metacrate_grid_agent.cli._output import Console, Redactor
    from metacrate_grid_agent.cli._parser import build_parser

    calls: list[str] = []

    def tune() -> tuple[int, int, int]:
        calls.append("tune")
        return (1, 1, 1)

    async def session(*args: object) -> int:
        calls.append("session")
        return 0

    monkeypatch.setattr(_run, "tune_gc_for_many_sessions", tune)
    monkeypatch.setattr(_run, "_run", session)
    args = build_parser(["demo"]).parse_args(["demo"])
    assert _run.cmd_demo(args, Console(Redactor())) == 0
    assert calls == ["tune", "session"]


async def test_each_run_has_a_session_id_of_its_own(cli: RunCLI, tmp_path: Path) -> None:
    """Without ``--session-id`` every run gets a new session id (its UTC start and a random
    part), in the transcript, the request ids and so ``gen_ai.conversation.id``: two runs'
    traces never merge."""
    ids = []
    for n in range(2):
        transcript = tmp_path / f"{n}.jsonl"
        result = await cli("demo", "--quiet", "--transcript", str(transcript))
        assert result.returncode == 0, result.stderr
        ids.append(json.loads(transcript.read_text("utf-8").splitlines()[0])["session_id"])
    assert ids[0] != ids[1]
    assert all(re.fullmatch(r"cli-\d{8}T\d{6}Z-[0-9a-f]{8}", i) for i in ids), ids


async def test_the_turn_table_shows_each_request_id_by_its_end(cli: RunCLI) -> None:
    """A long session id (the default one is) still leaves every row of the turn table its
    own request: the column keeps the end of the id, where the turns differ."""
    result = await cli("run", "--goal", "Explore.", "--session-id", "avatar-" + "x" * 40)
    assert result.returncode == 0, result.stderr
    rows = [line.split()[1] for line in result.stdout.splitlines() if re.match(r"\s+\d+\s", line)]
    assert len(rows) >= 2
    assert len(set(rows)) == len(rows), rows
    assert all(row.startswith("…") and row.endswith(f"-t{n}") for n, row in enumerate(rows, 1))


@pytest.mark.parametrize(
    "value",
    ["", "a/b", "..", ".hidden", "x" * 65, "tab\there", "caf\u00e9", "a\\b", "-rf"],
)
async def test_a_session_id_that_cannot_name_a_file_is_a_usage_error(
    cli: RunCLI, value: str
) -> None:
    """``--session-id`` takes 1 to 64 letters, digits, ".", "_" or "-", starting with a
    letter or digit (printable, no path separator, never "." or ".."): anything else is one
    line and exit 2, before any session starts."""
    result = await cli("run", "--goal", "Explore.", f"--session-id={value}")
    assert result.returncode == 2, result.stderr
    (line,) = result.stderr.splitlines()
    assert "--session-id" in line
    assert "1 to 64 letters, digits" in line
    assert "session finished" not in result.stderr
