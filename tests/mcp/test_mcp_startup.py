"""Starting MCP servers is bounded, and a server that cannot start is a clear error."""

from __future__ import annotations

import sys
import time

import pytest

pytest.importorskip("mcp", reason="the mcp extra is not installed (metacrate-grid-agent[mcp])")

from metacrate_grid_agent.errors import ConnectError
from metacrate_grid_agent.mcp import McpLimits, McpServer, McpToolset

#: The start-up limit set against a server that never answers.
STARTUP_S = 0.5


@pytest.mark.slow
async def test_a_silent_server_fails_start_up_within_the_limit() -> None:
    """A process that never speaks MCP fails start-up at startup_timeout_s, and is stopped.

    Protects: start-up is bounded: a wrong command cannot hang the agent, and the process
    it started does not outlive the failed toolset.
    """
    silent = McpServer.stdio("silent", sys.executable, ["-c", "import time; time.sleep(60)"])
    started = time.monotonic()
    with pytest.raises(
        ConnectError, match=r"did not start and list its tools: no initialize answer within 0\.5 s"
    ):
        async with McpToolset([silent], limits=McpLimits(startup_timeout_s=STARTUP_S)):
            pass  # pragma: no cover - start-up fails
    assert time.monotonic() - started < 10.0


async def test_a_missing_command_is_a_connect_error() -> None:
    """A command that does not exist is a ConnectError naming the server, not a raw OSError.

    Protects: every start-up failure reaches the caller as one typed error.
    """
    missing = McpServer.stdio("ghost", "/nonexistent/region-mcp")
    with pytest.raises(ConnectError, match="MCP server 'ghost' could not be started"):
        async with McpToolset([missing]):
            pass  # pragma: no cover - start-up fails


async def test_a_missing_command_is_named() -> None:
    """A command that does not exist is named in the error, with what to check.

    Protects: the operator sees which command the configuration runs, not a bare
    "No such file or directory".
    """
    missing = McpServer.stdio("ghost", "region-mcp-that-is-not-installed")
    with pytest.raises(ConnectError) as caught:
        async with McpToolset([missing]):
            pass  # pragma: no cover - start-up fails
    assert "command 'region-mcp-that-is-not-installed' not found" in str(caught.value)


#: A server that writes three lines to stderr (one holding the secret of its env, one a
#: terminal escape) and exits with status 3 before answering anything.
EXITING = (
    "import os, sys\n"
    "for n in range(1, 8): print(f'noise {n}', file=sys.stderr)\n"
    "print('token is ' + os.environ['REGION_TOKEN'], file=sys.stderr)\n"
    "print('bad \\x1b[31mred\\x1b[0m', file=sys.stderr)\n"
    "print('fatal: no region configured', file=sys.stderr)\n"
    "sys.exit(3)\n"
)
TOKEN = "region-secret-7f3a9c2e5b1d"


async def test_a_server_that_exits_at_start_says_its_status_and_last_stderr_lines() -> None:
    """A stdio server that exits before the handshake: the error gives its exit status and
    the last lines of its stderr, bounded, escaped and with its env's secrets redacted.

    Protects: "could not be started (MCP error -32000: Connection closed)" alone left the
    operator to rerun with -v to learn why.
    """
    server = McpServer.stdio("region", sys.executable, ["-c", EXITING], env={"REGION_TOKEN": TOKEN})
    with pytest.raises(ConnectError) as caught:
        async with McpToolset([server]):
            pass  # pragma: no cover - start-up fails
    text = str(caught.value)
    assert "exited with status 3" in text
    assert "fatal: no region configured" in text
    assert "noise 7" in text  # the last lines...
    assert "noise 1" not in text  # ...and only those
    assert TOKEN not in text
    assert TOKEN[:12] not in text
    assert "\x1b" not in text
    assert "red" in text


async def test_a_server_killed_by_a_signal_says_which() -> None:
    """A stdio server ended by a signal at start: the error names the signal."""
    killed = "import os, signal; os.kill(os.getpid(), signal.SIGABRT)"
    server = McpServer.stdio("region", sys.executable, ["-c", killed])
    with pytest.raises(ConnectError) as caught:
        async with McpToolset([server]):
            pass  # pragma: no cover - start-up fails
    assert "ended by signal SIGABRT" in str(caught.value)


async def test_inherit_env_passes_named_variables_of_this_process(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``inherit_env`` hands the named variables of this process's environment to a stdio
    server as they are at start; a variable not named stays out (the minimal environment),
    and a named one that is not set is skipped.

    Protects: a server behind a private CA (``SSL_CERT_FILE``) can be started without
    writing the variable's value into the configuration.
    """
    monkeypatch.setenv("GRID_TEST_CA", "/etc/region/ca.pem")
    monkeypatch.setenv("GRID_TEST_OTHER", "not-for-the-server")
    monkeypatch.delenv("GRID_TEST_UNSET", raising=False)
    shows = (
        "import os, sys\n"
        "for name in ('GRID_TEST_CA', 'GRID_TEST_OTHER', 'GRID_TEST_UNSET'):\n"
        "    print(name + '=' + os.environ.get(name, '<unset>'), file=sys.stderr)\n"
        "sys.exit(1)\n"
    )
    server = McpServer.stdio(
        "region",
        sys.executable,
        ["-c", shows],
        inherit_env=["GRID_TEST_CA", "GRID_TEST_UNSET"],
    )
    assert server.inherit_env == ("GRID_TEST_CA", "GRID_TEST_UNSET")
    with pytest.raises(ConnectError) as caught:
        async with McpToolset([server]):
            pass  # pragma: no cover - start-up fails
    text = str(caught.value)
    assert "GRID_TEST_CA=/etc/region/ca.pem" in text
    assert "GRID_TEST_OTHER=<unset>" in text
    assert "GRID_TEST_UNSET=<unset>" in text


def test_inherit_env_takes_variable_names_only() -> None:
    """A name that is not a variable's is refused when the server is built."""
    from metacrate_grid_agent.errors import ConfigError

    with pytest.raises(ConfigError, match="inherit_env"):
        McpServer.stdio("region", "region-mcp", inherit_env=["SSL CERT"])
    with pytest.raises(ConfigError, match="inherit_env"):
        McpServer.stdio("region", "region-mcp", inherit_env="SSL_CERT_FILE")
