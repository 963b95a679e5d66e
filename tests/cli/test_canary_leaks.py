"""``grid-agent probe`` never prints a key of any shape, whatever the endpoint echoes.

Each test runs once per canary key (``canary_key``), given to the child through the key
variable; the ``cli`` fixture fails the run if that key, or any 12-character slice of it,
appears on stdout or stderr (escaped forms included).
"""

from __future__ import annotations

import html
import json

from metacrate_grid_agent.testing import FakeEndpoint, Reply
from tests.cli.conftest import KEY_ENV, RunCLI, WriteConfig

#: Deep enough that str() of the nesting overflows the interpreter's stack.
DEEP = 988


def _deep_echo(key: str) -> Reply:
    """A 400 quoting the key (whole, split by a newline, escaped), its ``loc`` nested deep."""
    quoted = json.dumps(key)
    message = json.dumps(f"bad key {key} {key[:9]}\n{key[9:]} {html.escape(key)} {key!r}")
    loc = "[" * DEEP + "]" * DEEP
    deep = f'{{"detail":[{{"msg":{message},"loc":["header",{quoted},{loc}]}}]}}'.encode()
    return Reply(status=400, headers=(("Content-Type", "application/json"),), body=deep)


async def test_probe_prints_no_slice_of_an_echoed_key(
    cli: RunCLI, write_config: WriteConfig, canary_key: str
) -> None:
    """JSON and verbose logs stay free of the key; a deep body is a typed report, not a crash."""

    async with FakeEndpoint([_deep_echo(canary_key)]) as ep:
        config = write_config(ep.url, llm={"max_retries": 0})
        args = ("probe", "--config", str(config), "--json", "--verbose")
        result = await cli(*args, env={KEY_ENV: canary_key})
    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stderr
    data = result.json()
    assert (data["outcome"], data["kind"], data["status"]) == ("error", "http_status", 400)
    assert "[REDACTED]" in data["message"]


async def test_probe_shows_the_endpoint_by_the_one_url_rule(
    cli: RunCLI, write_config: WriteConfig
) -> None:
    """The endpoint line shows the query by the library's rule: a credential-named value
    hidden, the other parameters as configured; the credential appears nowhere."""
    secret = "qs-7Hd93kPzQ0vW5mXc"
    path = f"/v1/chat/completions?api-version=2024-10-21&api-key={secret}"
    async with FakeEndpoint([Reply.completion("pong")], path=path) as ep:
        config = write_config(ep.url)
        result = await cli("probe", "--config", str(config), "--verbose")
    assert result.returncode == 0, result.stderr
    shown = f"{ep.origin}/v1/chat/completions?api-version=2024-10-21&api-key=[REDACTED]"
    assert f"grid-agent probe: {shown}" in result.stdout
    assert secret not in result.stdout + result.stderr
