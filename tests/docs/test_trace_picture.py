"""The README's picture of a trace is the demo's real trace.

The README shows the span tree of ``grid-agent demo`` as a trace viewer lists it. This test
runs the README's own command (``OTEL_TRACES_EXPORTER=console grid-agent demo``), reads the
spans the console exporter writes on stderr, renders them the same way and compares: the
picture changes only with what the command really sends. To refresh it after a deliberate
change, run ``python -m tests.docs.test_trace_picture`` and paste its output.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Final

import pytest

ROOT: Final = Path(__file__).resolve().parents[2]
#: The line before the picture's fenced block in the README.
MARKER: Final = "<!-- trace picture: tests/docs/test_trace_picture.py -->"
#: Set to ``required`` (as in CI) to fail, rather than skip, without the SDK.
REQUIRED_ENV: Final = "GRID_AGENT_OTEL"
#: What each span's line shows after its name and kind, when the span has it.
SHOWN: Final = {
    "grid_agent.session.outcome": "outcome",
    "gen_ai.response.finish_reasons": "finish",
    "gen_ai.usage.input_tokens": "in",
    "gen_ai.usage.output_tokens": "out",
    "grid_agent.tool.status": "status",
    "error.type": "error.type",
}


def demo_spans() -> list[dict[str, Any]]:
    """The spans of one ``grid-agent demo`` with the console exporter (a child process)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env["OTEL_TRACES_EXPORTER"] = "console"
    done = subprocess.run(
        [sys.executable, "-m", "metacrate_grid_agent", "demo", "--quiet"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env=env,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr
    decoder = json.JSONDecoder()
    spans = []
    text = done.stderr
    start = text.find("{\n")
    while start != -1:
        span, end = decoder.raw_decode(text, start)
        spans.append(span)
        start = text.find("{\n", end)
    return spans


def render(spans: list[dict[str, Any]]) -> str:
    """The span tree, children in start order: name, kind, and the attributes of SHOWN."""

    def line(span: dict[str, Any], branch: str = "") -> str:
        attributes = span["attributes"]
        shown = []
        for key, label in SHOWN.items():
            if key in attributes:
                value = attributes[key]
                value = ",".join(value) if isinstance(value, list) else value
                shown.append(f"{label}={value}")
        kind = span["kind"].removeprefix("SpanKind.")
        return f"{branch + span['name']:<32}{kind:<10}{' '.join(shown)}".rstrip()

    ordered = sorted(spans, key=lambda s: s["start_time"])
    (root,) = [s for s in ordered if s["parent_id"] is None]
    children = [s for s in ordered if s is not root]
    assert {s["parent_id"] for s in children} == {root["context"]["span_id"]}
    lines = [line(root)]
    for index, span in enumerate(children):
        branch = "└── " if index == len(children) - 1 else "├── "
        lines.append(line(span, branch))
    return "\n".join(lines)


def readme_picture() -> str:
    """The fenced block after MARKER in the README."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    after = text.split(MARKER, 1)[1].lstrip("\n")
    assert after.startswith("```text\n")
    return after.removeprefix("```text\n").split("\n```", 1)[0]


@pytest.mark.slow
def test_the_readme_trace_picture_is_the_demo_trace() -> None:
    """The README's span tree is the one ``OTEL_TRACES_EXPORTER=console grid-agent demo``
    exports, re-rendered from a real run."""
    if importlib.util.find_spec("opentelemetry.sdk") is None:
        reason = "the OpenTelemetry SDK is not installed (the otel-test dependency group)"
        if os.environ.get(REQUIRED_ENV) == "required":
            pytest.fail(f"{REQUIRED_ENV}=required, but {reason}", pytrace=False)
        pytest.skip(reason)
    assert readme_picture() == render(demo_spans())


if __name__ == "__main__":
    print(render(demo_spans()))  # noqa: T201 - the picture to paste into the README
