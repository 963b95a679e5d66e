"""``grid-agent replay`` and ``grid-agent report`` on transcripts written by ``--transcript``."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import pytest

from metacrate_grid_agent.cli._scripted_model import respond
from metacrate_grid_agent.config import MAX_CONFIG_FILE_BYTES
from metacrate_grid_agent.testing import FakeEndpoint
from tests.cli.conftest import CANARY, RunCLI, WriteConfig, assert_no_key

if TYPE_CHECKING:
    from pathlib import Path

pytestmark = pytest.mark.slow


async def test_replay_of_a_recorded_session_reports_no_difference(
    cli: RunCLI, tmp_path: Path
) -> None:
    """A ``demo --transcript`` session replays with no difference (exit 0); replaying with a
    lower bound from ``--config`` reports the difference (exit 1)."""
    transcript = tmp_path / "demo.jsonl"
    recorded = await cli("demo", "--transcript", str(transcript))
    assert recorded.returncode == 0, recorded.stderr

    same = await cli("replay", str(transcript))
    assert same.returncode == 0, same.stderr
    assert "no difference" in same.stdout

    lower = tmp_path / "lower.toml"
    lower.write_text(
        "[tool_loop]\nmax_calls_per_turn = 1\nmax_calls_per_session = 3\n", encoding="utf-8"
    )
    changed = await cli("replay", str(transcript), "--config", str(lower), "--json")
    assert changed.returncode == 1, changed.stderr
    data = changed.json()
    assert data["same"] is False
    assert data["outcome"] == "bound_reached"
    where = {d["where"]: (d["recorded"], d["replayed"]) for d in data["differences"]}
    assert where["session outcome"] == ("completed", "bound_reached")
    assert where["session bound"] == ("None", "calls_per_session")


async def test_report_prints_the_timeline_and_writes_html(cli: RunCLI, tmp_path: Path) -> None:
    """``report`` prints turns, calls and the ending; ``--html`` writes one page with no
    script and nothing loaded from elsewhere."""
    transcript = tmp_path / "demo.jsonl"
    assert (await cli("demo", "--transcript", str(transcript))).returncode == 0
    page = tmp_path / "demo.html"
    shown = await cli("report", str(transcript), "--html", str(page))
    assert shown.returncode == 0, shown.stderr
    first = json.loads(transcript.read_text("utf-8").splitlines()[1])
    assert f"request {first['request_id']}" in shown.stdout
    assert "<- move_to rejected" in shown.stdout
    assert "session ended: completed" in shown.stdout
    html = page.read_text("utf-8")
    assert "<script" not in html.lower()
    assert "src=" not in html
    assert "session ended: completed" in html


async def test_a_transcript_against_a_real_endpoint_holds_no_key(
    cli: RunCLI, write_config: WriteConfig, tmp_path: Path
) -> None:
    """``run --config --transcript``: the key (from the environment) is nowhere in the file,
    and the session replays without its endpoint."""
    transcript = tmp_path / "run.jsonl"
    async with FakeEndpoint(responder=respond) as endpoint:
        config = write_config(endpoint.url)
        result = await cli("run", "--goal", "Explore.", "--config", str(config),
                           "--transcript", str(transcript))  # fmt: skip
    assert result.returncode == 0, result.stderr
    text = transcript.read_text("utf-8")
    assert_no_key(text)
    assert CANARY not in text
    assert json.loads(text.splitlines()[0])["labels"] == {"model": "endpoint"}
    replayed = await cli("replay", str(transcript))
    assert replayed.returncode == 0, replayed.stdout


async def test_unreadable_transcripts_exit_2(cli: RunCLI, tmp_path: Path) -> None:
    """A missing file or a file of another format: exit 2 with the reason."""
    other = tmp_path / "other.jsonl"
    other.write_text('{"event": "session"}\n', encoding="utf-8")
    results = [
        await cli("replay", str(tmp_path / "missing.jsonl")),
        await cli("report", str(other)),
        await cli("replay", str(other), "--json"),
    ]
    assert [r.returncode for r in results] == [2, 2, 2]
    assert "cannot read transcript" in results[0].stderr
    assert "transcript record" in results[1].stderr
    assert results[2].json()["kind"] == "transcript"


async def test_crafted_transcripts_exit_2_with_one_line(cli: RunCLI, tmp_path: Path) -> None:
    """A transcript whose records have the wrong shape (a string time, a reply without its
    calls, a line nested 100,000 deep) makes ``report`` and ``replay`` exit 2 (never 1, which
    means "decisions differ") with exactly one line on stderr, or one JSON object with
    ``--json``: no traceback."""
    transcript = tmp_path / "demo.jsonl"
    assert (await cli("demo", "--transcript", str(transcript))).returncode == 0
    lines = transcript.read_text("utf-8").splitlines()
    records = [json.loads(line) for line in lines]
    reply = next(i for i, r in enumerate(records) if r["type"] == "reply")
    crafted = {
        "string_time": {**records[1], "t": "abc"},
        "no_calls": {k: v for k, v in records[reply].items() if k != "tool_calls"},
        "deep": {**records[1], "request_id": "<deep>"},
    }
    for name, record in crafted.items():
        index = 1 if name != "no_calls" else reply
        bad = tmp_path / f"{name}.jsonl"
        text = json.dumps(record).replace('"<deep>"', "[" * 100_000 + "]" * 100_000)
        bad.write_text("\n".join([*lines[:index], text, *lines[index + 1 :]]) + "\n", "utf-8")
        for command in ("report", "replay"):
            shown = await cli(command, str(bad))
            assert (shown.returncode, shown.stdout) == (2, ""), (name, command, shown.stderr)
            assert len(shown.stderr.splitlines()) == 1, (name, command, shown.stderr)
            assert shown.stderr.startswith(f"grid-agent {command}: error: transcript line ")
            assert "Traceback" not in shown.stderr
        as_json = await cli("replay", str(bad), "--json")
        assert as_json.returncode == 2, (name, as_json.stderr)
        data = as_json.json()
        assert (data["outcome"], data["kind"]) == ("error", "transcript")
        assert f"line {index + 1}" in data["message"]


async def test_a_deep_last_line_without_a_newline_exits_2_with_one_line(
    cli: RunCLI, tmp_path: Path
) -> None:
    """A transcript whose last line is nested 100,000 deep and has no newline (where the
    check for a crashed writer's cut line looks) makes ``report`` and ``replay`` exit 2 with
    one line naming that line, like every other crafted transcript: no RecursionError."""
    transcript = tmp_path / "demo.jsonl"
    assert (await cli("demo", "--transcript", str(transcript))).returncode == 0
    lines = transcript.read_text("utf-8").splitlines()
    last = json.dumps({**json.loads(lines[-1]), "text": "<deep>"})
    deep = last.replace('"<deep>"', "[" * 100_000 + "]" * 100_000)
    bad = tmp_path / "deep-last.jsonl"
    bad.write_text("\n".join([*lines[:-1], deep]), "utf-8")  # no newline at the end
    for command in ("report", "replay"):
        shown = await cli(command, str(bad))
        assert (shown.returncode, shown.stdout) == (2, ""), (command, shown.stderr)
        assert len(shown.stderr.splitlines()) == 1, (command, shown.stderr)
        assert shown.stderr.startswith(f"grid-agent {command}: error: transcript line ")
        assert "nested more than" in shown.stderr
    as_json = await cli("replay", str(bad), "--json")
    assert as_json.returncode == 2, as_json.stderr
    data = as_json.json()
    assert (data["outcome"], data["kind"]) == ("error", "transcript")
    assert f"line {len(lines)}" in data["message"]


async def test_report_json_and_a_killed_session_exit_0(cli: RunCLI, tmp_path: Path) -> None:
    """``report --json`` prints the summary the text shows; a transcript cut mid-line (the
    process killed) is reported and replayed with a one-line note, exit 0."""
    transcript = tmp_path / "demo.jsonl"
    assert (await cli("demo", "--transcript", str(transcript))).returncode == 0
    shown = await cli("report", str(transcript), "--json")
    assert shown.returncode == 0, shown.stderr
    data = shown.json()
    assert data["summary"]["outcome"] == "completed"
    assert data["notes"] == []
    text = await cli("report", str(transcript))
    assert f"outcome: {data['summary']['outcome']}" in text.stdout

    lines = transcript.read_text("utf-8").splitlines()
    cut = tmp_path / "cut.jsonl"
    cut.write_text("\n".join(lines[:-1]) + "\n" + lines[-1][:20], encoding="utf-8")
    for command in ("report", "replay"):
        found = await cli(command, str(cut))
        assert found.returncode == 0, found.stderr
        assert "note: the last record is incomplete (cut mid-line)" in found.stdout
        assert "note: the session ended without a finish record (process killed?)" in found.stdout


async def test_replay_refuses_a_config_over_the_size_bound(cli: RunCLI, tmp_path: Path) -> None:
    """A ``--config`` file over ``MAX_CONFIG_FILE_BYTES`` is refused (exit 2, one line naming
    the bound), never parsed cut at the bound: here the first MiB alone is valid TOML."""
    transcript = tmp_path / "demo.jsonl"
    assert (await cli("demo", "--transcript", str(transcript))).returncode == 0
    big = tmp_path / "big.toml"
    big.write_text(
        "[tool_loop]\nmax_calls_per_turn = 1\n#" + "x" * MAX_CONFIG_FILE_BYTES + "\n",
        encoding="utf-8",
    )
    refused = await cli("replay", str(transcript), "--config", str(big))
    assert refused.returncode == 2, refused.stdout
    assert f"larger than {MAX_CONFIG_FILE_BYTES} bytes" in refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1
