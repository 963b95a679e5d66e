"""The CLI's redactor: every printed line is scrubbed, even of a key cut by a bound."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import metacrate_grid_agent.cli
from metacrate_grid_agent.cli._output import Redactor, bounded
from metacrate_grid_agent.config import Secret
from tests.conftest import assert_no_canary

KEY = "sk-CANARY-5f0c2e9a7b31d84e"


def redactor() -> Redactor:
    """A redactor that knows the key."""
    r = Redactor()
    r.add(KEY)
    return r


def test_a_whole_key_is_replaced() -> None:
    """The key anywhere in a line becomes the marker."""
    assert redactor().scrub(f"text {KEY} more") == "text [REDACTED] more"


def test_a_key_cut_by_a_bound_is_replaced_too() -> None:
    """Text cut before scrubbing must not show most of a key at the cut."""
    line = bounded("a" * 20 + KEY, 20 + len(KEY) - 2)
    scrubbed = redactor().scrub(line)
    assert KEY[:8] not in scrubbed
    assert scrubbed.endswith("[REDACTED]…")


def test_a_key_cut_at_the_end_of_a_line_is_replaced() -> None:
    """A line that ends inside the key loses that beginning."""
    assert redactor().scrub("token=" + KEY[:12]) == "token=[REDACTED]"


def test_text_merely_starting_like_a_key_is_kept() -> None:
    """Only a beginning of the key that runs into a cut is taken for a cut key."""
    assert redactor().scrub("sk-CANARY is a word here") == "sk-CANARY is a word here"


def test_a_shaped_key_is_replaced_in_every_form(canary_key: str) -> None:
    """Keys no pattern knows are replaced whole, by 12-character slices and when escaped."""
    r = Redactor()
    r.add(canary_key)
    texts = [
        f"text {canary_key} more",
        f"text {canary_key[5:17]} more",
        json.dumps({"message": f"key {canary_key}"}),
        f"quoted {canary_key!r}",
        bounded("a" * 20 + canary_key, 20 + len(canary_key) - 2),
    ]
    scrubbed = [r.scrub(text) for text in texts]
    assert all("[REDACTED]" in text for text in scrubbed)
    assert_no_canary(*scrubbed)


def test_the_commands_secrets_reach_its_redactor_in_one_place() -> None:
    """The command registers the configuration's secrets with its redactor from one place
    (``cli/_config.py``'s ``_hidden``, one ``Redactor.hide`` call), from what the loaded
    configuration says it holds: no loader below it takes the redactor."""
    cli = Path(metacrate_grid_agent.cli.__file__).parent
    calls = {
        (path.name, node.func.attr)
        for path in sorted(cli.glob("*.py"))
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr in ("add", "hide")
        and "redactor" in ast.unparse(node.func.value)
    }
    assert calls == {("_config.py", "hide")}
    source = (cli / "_config.py").read_text(encoding="utf-8")
    assert source.count(".hide(") == 1


def test_hide_registers_each_secret_once_and_skips_none() -> None:
    """``Redactor.hide`` takes Secrets and strings (and None, for an unset variable), and
    registers each secret once however often the configuration names it."""
    r = Redactor()
    r.hide([Secret(KEY), KEY, None, "", Secret(KEY)])
    assert repr(r) == "Redactor(1 secrets)"
    assert r.scrub(f"key={KEY}") == "key=[REDACTED]"
