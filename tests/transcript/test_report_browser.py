"""The report page in a real browser: headless Chromium loads it, and the test reads the DOM.

The page must answer at a glance (the outcome in its header), hold every folded text whole,
and run nothing: a transcript full of script payloads changes no title and no DOM marker.
Skipped, with the reason, where Chromium (the Debian package ``chromium``) is not
installed; ``.ci/run`` installs it and sets ``GRID_AGENT_BROWSER=required``, so CI runs it.
"""

from __future__ import annotations

import html
import os
import re
import shutil
import subprocess
from typing import TYPE_CHECKING, Final

import pytest

from metacrate_grid_agent.transcript import SCHEMA, Transcript, report_html

if TYPE_CHECKING:
    from pathlib import Path

pytestmark = pytest.mark.slow

#: The browser binary, as the Debian package installs it (None: not installed).
CHROMIUM: Final = shutil.which("chromium") or shutil.which("chromium-browser")
#: Longest a headless browser may take to load one local page (it takes about a second).
BROWSER_TIMEOUT_S: Final = 120
#: What a payload would write, were it run: a title and a marker on the body.
TITLE_PAYLOAD: Final = "<script>document.title='pwned'</script>"
MARKER_PAYLOAD: Final = "<img src=x onerror=\"document.body.setAttribute('data-pwned','1')\">"
#: A final text longer than a row shows: folded, whole, in <details>.
LONG_TEXT: Final = "The avatar walked to the fountain and looked around. " * 20 + "THE END"


def _chromium(page: Path, *flags: str, home: Path) -> str:
    """Run headless Chromium on ``page`` with ``flags``; its standard output."""
    assert CHROMIUM is not None
    command = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run"]
    command += [f"--user-data-dir={home}", "--window-size=1280,900", *flags, page.as_uri()]
    done = subprocess.run(  # noqa: S603 - a fixed binary and flags, a page this test wrote
        command, capture_output=True, text=True, timeout=BROWSER_TIMEOUT_S, check=False
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def _hostile() -> Transcript:
    header = {
        "type": "session", "seq": 0, "t": 0.0, "schema": SCHEMA, "v": 1, "library": "0.1",
        "session_id": "s-1", "goal": TITLE_PAYLOAD + MARKER_PAYLOAD,
    }  # fmt: skip
    result = {
        "type": "tool_result", "seq": 1, "t": 0.1, "turn": 1, "id": MARKER_PAYLOAD,
        "name": "move", "status": "denied", "observation": TITLE_PAYLOAD, "latency_s": 0.0,
        "arguments": MARKER_PAYLOAD,
    }  # fmt: skip
    finish = {
        "type": "finish", "seq": 2, "t": 0.2, "turn": 1, "outcome": "completed",
        "oversized": True, "final_text": LONG_TEXT + TITLE_PAYLOAD,
    }  # fmt: skip
    return Transcript(header, (result, finish))


@pytest.fixture
def chromium() -> str:
    """The browser; a skip saying why where it is missing, a failure where CI requires it."""
    if CHROMIUM is None:
        reason = "Chromium is not installed (Debian package chromium); .ci/run installs it"
        if os.environ.get("GRID_AGENT_BROWSER") == "required":
            pytest.fail(reason + ", and GRID_AGENT_BROWSER=required")
        pytest.skip(reason)
    return CHROMIUM


@pytest.mark.usefixtures("chromium")
def test_the_page_in_chromium_shows_the_outcome_folds_whole_and_runs_nothing(
    tmp_path: Path,
) -> None:
    """In a real browser: the outcome heads the page, a folded text is whole in the DOM, and
    no script payload from the transcript runs (title and body unchanged).

    Protects the page an operator opens after an incident: readable at a glance, and
    never a way for a hostile transcript to act in their browser.
    """
    page = tmp_path / "report.html"
    page.write_text(report_html(_hostile()), encoding="utf-8")
    dom = _chromium(page, "--dump-dom", home=tmp_path / "profile")
    title = re.search(r"<title>(.*?)</title>", dom, re.DOTALL)
    assert title is not None
    assert title[1] == "session s-1 (generation 0), library 0.1"
    body = re.search(r"<body[^>]*>", dom)
    assert body is not None
    assert body[0] == "<body>"
    assert "<script" not in dom.lower()
    assert "<img" not in dom.lower()
    assert '<td class="completed">completed</td>' in dom
    folded = re.search(r"<details>(.*?)</details>", dom, re.DOTALL)
    assert folded is not None
    assert html.escape(LONG_TEXT, quote=False) in folded[1]
    shot = tmp_path / "report.png"
    _chromium(page, f"--screenshot={shot}", home=tmp_path / "profile")
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
