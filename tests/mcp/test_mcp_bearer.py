"""A bearer token for an HTTP server, read from a file or an environment variable at start.

The loopback fake endpoint answers every request 401: start-up fails, and the tests assert on
the header the fake recorded and on every message the failure left.
"""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING

import pytest

pytest.importorskip("mcp", reason="the mcp extra is not installed (metacrate-grid-agent[mcp])")

from metacrate_grid_agent.errors import ConfigError, ConnectError
from metacrate_grid_agent.mcp import McpLimits, McpServer, McpToolset
from metacrate_grid_agent.testing import FakeEndpoint, Reply

if TYPE_CHECKING:
    from pathlib import Path

TOKEN = "mcp-bearer-5e2a9f"
ENV = "GRID_AGENT_TEST_MCP_BEARER"
MCP_LOGGER = "metacrate_grid_agent.mcp"


def unauthorized(_: object) -> Reply:
    """Every request is refused: the header it carried is what the test looks at."""
    return Reply.json({"error": "unauthorized"}, status=401)


def token_file(tmp_path: Path, text: str, mode: int = 0o600) -> Path:
    """A file holding ``text`` with permission bits ``mode``."""
    path = tmp_path / "token"
    path.write_text(text, encoding="utf-8")
    path.chmod(mode)
    return path


async def start_error(server: McpServer) -> ConnectError:
    """The error starting ``server`` raises."""
    with pytest.raises(ConnectError) as caught:
        async with McpToolset([server], limits=McpLimits(startup_timeout_s=5.0)):
            pass  # pragma: no cover - start-up fails
    return caught.value


@pytest.mark.parametrize("source", ["file", "env"])
async def test_a_bearer_token_from_a_file_or_the_environment_is_sent_and_shown_nowhere(
    source: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """``bearer_token_file=`` / ``bearer_token_env=``: read when the server starts, sent as
    ``Authorization: Bearer ...`` with every request, and in no repr, error or log line.

    Protects: a token need not be written in code or in the configuration; it is read at
    start (a rotated file is picked up by the next session) and shown nowhere.
    """
    caplog.set_level(logging.DEBUG)
    monkeypatch.setenv(ENV, TOKEN)
    path = token_file(tmp_path, TOKEN + "\n")
    async with FakeEndpoint(responder=unauthorized) as ep:
        server = (
            McpServer.http("api", ep.url, bearer_token_file=path)
            if source == "file"
            else McpServer.http("api", ep.url, bearer_token_env=ENV)
        )
        error = await start_error(server)
    assert ep.requests
    assert {request.header("Authorization") for request in ep.requests} == {f"Bearer {TOKEN}"}
    assert "HTTP status 401" in str(error)
    for text in (str(error), repr(error), repr(server), caplog.text):
        assert TOKEN not in text


async def test_a_token_file_readable_by_others_is_used_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """As for the key file: a token file with group or other read bits is used, with one
    warning naming the file and its mode (like ssh for a private key); 0600 gives none."""
    caplog.set_level(logging.WARNING, logger=MCP_LOGGER)
    shared = token_file(tmp_path, TOKEN, 0o644)
    async with FakeEndpoint(responder=unauthorized) as ep:
        await start_error(McpServer.http("api", ep.url, bearer_token_file=shared))
        warned = [r for r in caplog.record_tuples if "readable by other users" in r[2]]
        shared.chmod(0o600)
        caplog.clear()
        await start_error(McpServer.http("api", ep.url, bearer_token_file=shared))
        quiet = [r for r in caplog.record_tuples if "readable by other users" in r[2]]
    assert ep.requests[0].header("Authorization") == f"Bearer {TOKEN}"
    assert warned == [
        (
            MCP_LOGGER,
            logging.WARNING,
            (
                f"the bearer token file {str(shared)!r} is readable by other users "
                "(mode 0644); chmod 600 it"
            ),
        )
    ]
    assert quiet == []


async def test_a_token_that_cannot_be_had_fails_start_up_naming_its_source(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An unset variable, a missing file, a FIFO, a file of two lines, a token with a space:
    start-up fails at once with a ``ConnectError`` naming the source (never the token), and
    nothing is sent.

    Protects: the file rule of the key file (a regular file only, read without blocking);
    no request goes out without the credential the operator configured.
    """
    monkeypatch.delenv(ENV, raising=False)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    two_lines = tmp_path / "two"
    two_lines.write_text(f"{TOKEN}\nmore\n", encoding="utf-8")
    async with FakeEndpoint(responder=unauthorized) as ep:
        unset = await start_error(McpServer.http("api", ep.url, bearer_token_env=ENV))
        missing = await start_error(
            McpServer.http("api", ep.url, bearer_token_file=tmp_path / "gone")
        )
        piped = await start_error(McpServer.http("api", ep.url, bearer_token_file=fifo))
        long = await start_error(McpServer.http("api", ep.url, bearer_token_file=two_lines))
        monkeypatch.setenv(ENV, f"{TOKEN} and more")
        spaced = await start_error(McpServer.http("api", ep.url, bearer_token_env=ENV))
    assert ep.requests == []
    assert str(spaced) == (
        f"MCP server 'api' could not be started (the environment variable {ENV} holds "
        "characters a bearer token cannot have)"
    )
    assert str(unset) == (
        f"MCP server 'api' could not be started (the environment variable {ENV} for its "
        "bearer token is unset or empty)"
    )
    assert "(No such file or directory)" in str(missing)
    assert "(it is a FIFO, not a regular file)" in str(piped)
    assert "must hold the token alone" in str(long)
    assert TOKEN not in str(long)


def test_a_token_source_is_checked_when_built() -> None:
    """One source of the token at most (a header, a file or a variable), a variable's name
    that is one, and the cleartext rule of the ``Authorization`` header: refused over
    ``http://`` to a non-loopback host unless ``allow_insecure_http``."""
    remote = "http://market.example.net/mcp"
    with pytest.raises(ConfigError) as caught:
        McpServer.http("m", remote, bearer_token_env=ENV)
    assert "mcp.m.url" in str(caught.value)
    assert "allow_insecure_http" in str(caught.value)
    assert McpServer.http("m", remote, bearer_token_env=ENV, allow_insecure_http=True)
    assert McpServer.http("m", "http://127.0.0.1:9/mcp", bearer_token_file="token")
    with pytest.raises(ConfigError, match="one source"):
        McpServer.http("m", "https://m.example.net/", bearer_token_env=ENV, bearer_token_file="t")
    with pytest.raises(ConfigError, match="one source"):
        McpServer.http(
            "m", "https://m.example.net/", headers={"authorization": "x"}, bearer_token_env=ENV
        )
    with pytest.raises(ConfigError, match="bearer_token_env"):
        McpServer.http("m", "https://m.example.net/", bearer_token_env="not a name")
