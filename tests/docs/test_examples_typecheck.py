"""Every Python example of the README and the docs type-checks under ``mypy --strict``, as a
reader's editor would check it: the call the docs write is a call the types accept.

The examples are those :mod:`tests.docs.test_examples` runs, each written to a module of its
own in a temporary folder. An ``in-session`` block (or a ``no-run`` one that awaits at top
level) continues "The tool loop": it becomes the body of a coroutine, after the names it
continues declared with their types; a ``no-run`` block is checked too (it needs what the
suite cannot run, not what mypy cannot read). The locked mypy (this interpreter's) checks
them with the project's settings, in one run.
"""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
from typing import TYPE_CHECKING, Final

import pytest

from tests.docs.test_examples import EXAMPLES, ROOT

if TYPE_CHECKING:
    from pathlib import Path

    from tests.docs.test_examples import Example

#: The names an ``in-session`` block continues, with the types "The tool loop" gives them.
IN_SESSION_NAMES: Final = textwrap.dedent(
    """\
    from metacrate_grid_agent import (
        AgentConfig, CancelToken, Failure, LLMClient, SessionGeneration, Success, Tool,
        ToolLoop, ValidatedCall,
    )


    class Grid:
        async def execute(self, call: ValidatedCall, cancel: CancelToken) -> Success | Failure:
            return Success("done")


    config: AgentConfig
    client: LLMClient
    loop: ToolLoop
    session: SessionGeneration
    goal: str
    SYSTEM: str
    MOVE: Tool


    async def example() -> None:
    """
)
#: Bound on the one mypy run over every example (a cold run takes about 20 s).
MYPY_TIMEOUT_S: Final = 300


def _awaits_at_top_level(code: str) -> bool:
    """Whether ``code`` awaits outside a function (so only runs inside a session)."""
    try:
        compile(code, "<example>", "exec", dont_inherit=True)
    except SyntaxError:
        return True
    return False


def module_of(example: Example) -> str:
    """The module text mypy checks for ``example``."""
    if example.mode == "in-session" or _awaits_at_top_level(example.code):
        return IN_SESSION_NAMES + textwrap.indent(example.code, "    ")
    return example.code


def _module_name(example: Example) -> str:
    return "example_" + re.sub(r"\W", "_", example.name)


@pytest.mark.slow
def test_every_example_type_checks_under_mypy_strict(tmp_path: Path) -> None:
    """``mypy --strict`` finds nothing in any example of the README and the docs (e.g. the
    documented ``LLMConfig(endpoint_url=..., api_key="sk-...")``); an error names the page
    and the line of the example."""
    names = {}
    for example in EXAMPLES:
        name = _module_name(example)
        names[name] = example
        (tmp_path / f"{name}.py").write_text(module_of(example), encoding="utf-8")
    done = subprocess.run(  # noqa: S603 - our own interpreter's mypy
        [
            sys.executable,
            "-m",
            "mypy",
            "--config-file",
            str(ROOT / "pyproject.toml"),
            "--cache-dir",
            str(tmp_path / ".mypy_cache"),
            *sorted(f"{name}.py" for name in names),
        ],
        capture_output=True,
        text=True,
        timeout=MYPY_TIMEOUT_S,
        check=False,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_every_example_is_written_to_a_module_of_its_own() -> None:
    """Each example gets its own module name (two blocks never overwrite each other), and an
    in-session block is checked with the names it continues."""
    assert len({_module_name(e) for e in EXAMPLES}) == len(EXAMPLES)
    in_session = [e for e in EXAMPLES if e.mode == "in-session"]
    assert in_session
    assert all(module_of(e).startswith(IN_SESSION_NAMES) for e in in_session)
