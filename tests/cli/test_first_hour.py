"""What an operator meets in the first hour: each line of the command says what it means.

In process, without a terminal: the probe's status line, the heartbeat's retry wait, the
run summary's total row, check-config's settings (TOML as printed) and the plain-http
refusal of ``--endpoint`` (it names the flag, not the file's key).
"""

from __future__ import annotations

import re
import tomllib
from typing import TYPE_CHECKING, Final

from metacrate_grid_agent import ProgressEvent
from metacrate_grid_agent.cli import main
from metacrate_grid_agent.cli._heartbeat import Heartbeat
from metacrate_grid_agent.cli._output import ProbeSummary, probe_report
from metacrate_grid_agent.errors import HTTPStatusError
from tests.cli.conftest import CANARY, KEY_ENV, assert_no_key
from tests.cli.test_heartbeat_line import FakeTerminal

if TYPE_CHECKING:
    from pathlib import Path

    import pytest

#: A turns-table row: its latency column ("12 ms" or "-") sits before the attempts column.
_ROW: Final = re.compile(r"^\s*(\d+|total)\s.*?\s(\d+) ms\s+\d+\s*$")


def test_the_probe_status_line_shows_only_what_the_endpoint_said() -> None:
    """An error body with a type and no code says the type alone, never ``code None``."""
    error = HTTPStatusError(
        "the endpoint answered HTTP 400: bad", status=400, retryable=False,
        error_type="invalid_request_error",
    )  # fmt: skip
    summary = ProbeSummary("https://x.example/", asked_tools=False, sent_image=False,
                           request_id="r-1", error=error)  # fmt: skip
    status = next(line for line in probe_report(summary) if line.startswith("status:"))
    expected = "error (http_status, HTTP 400, not retryable, type invalid_request_error)"
    assert status == f"status:      {expected}"


def test_the_retry_wait_counts_from_the_start_of_the_wait() -> None:
    """ "waiting to retry, N s" is the time spent waiting, not since the call began."""
    now = [100.0]
    beat = Heartbeat(FakeTerminal(), scrub=str, max_attempts=3, color=False, clock=lambda: now[0])
    now[0] += 5.0  # the first attempt failed after 5 s
    beat.on_progress(ProgressEvent(kind="retry", request_id="r-1", attempt=1, elapsed_s=5.0,
                                   delay_s=3.0, reason="http_status (HTTP 503)"))  # fmt: skip
    now[0] += 1.0
    assert beat.status_line() == "grid-agent: waiting to retry, 1.0 s (attempt 1 of 3, r-1)"


def test_the_total_row_sums_the_latency_column(capsys: pytest.CaptureFixture[str]) -> None:
    """The turns table's total is the sum of the latencies above it; the session's wall time
    is said on a line of its own, named as such."""
    assert main(["demo"]) == 0
    out = capsys.readouterr().out
    rows = [m for m in map(_ROW.match, out.splitlines()) if m is not None]
    turns = [int(m[2]) for m in rows if m[1] != "total"]
    total = [int(m[2]) for m in rows if m[1] == "total"]
    assert (5, [sum(turns)]) == (len(turns), total)
    assert re.search(r"^wall time: \d+ ms \(the whole session\)$", out, re.MULTILINE)


def test_check_config_prints_toml(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                  monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """The settings check-config prints parse as TOML (an unset ca_bundle is no ``null``)."""
    path = tmp_path / "agent.toml"
    path.write_text(f'[llm]\nendpoint_url = "https://x.example/v1/chat/completions"\n'
                    f'api_key_env = "{KEY_ENV}"\n', encoding="utf-8")  # fmt: skip
    monkeypatch.setenv(KEY_ENV, CANARY)
    assert main(["check-config", str(path)]) == 0
    out = capsys.readouterr().out
    assert_no_key(out)
    settings = tomllib.loads(out[out.index("[llm]") :])
    assert "null" not in out
    assert "ca_bundle" not in settings["llm"]
    assert "# ca_bundle: not set (the system's CA certificates)" in out


def test_endpoint_plain_http_names_the_flag(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """With --endpoint, the refusal of cleartext http names --allow-insecure-http, the switch
    the operator has, not the configuration file's key."""
    monkeypatch.setenv(KEY_ENV, CANARY)
    status = main(["probe", "--endpoint", "http://llm.example.com/v1/chat/completions",
                   "--api-key-env", KEY_ENV])  # fmt: skip
    err = capsys.readouterr().err
    assert status == 2
    assert "--allow-insecure-http" in err
    assert "allow_insecure_http = true" not in err
