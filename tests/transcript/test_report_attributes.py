"""The report page's markup comes only from the library: no value read from a transcript
becomes an attribute or a class, whatever it holds."""

from __future__ import annotations

import json

from metacrate_grid_agent.transcript import load, report_html
from tests.core.test_display_safe import _hostile_transcript

#: A status that would close the class attribute and open an event handler.
BREAKOUT = 'failed" onmouseover="document.title=1" x="'


def test_a_status_from_the_file_never_becomes_markup() -> None:
    """A tool result's status picks the row's colour from a closed set; the status itself
    is shown only as escaped text, so it can neither add an attribute nor a class."""
    lines = _hostile_transcript()
    records = [json.loads(line) for line in lines]
    for record in records:
        if record["type"] == "tool_result":
            record["status"] = BREAKOUT
    page = report_html(load([json.dumps(r) for r in records]))
    assert 'onmouseover="' not in page
    assert "failed&quot; onmouseover=&quot;document.title=1&quot;" in page
    assert '<tr class="tool_result failed">' in page
