"""What the operator configures: one :class:`McpServer` per server, and :class:`McpLimits`.

Plain frozen values, checked when built; nothing here imports the MCP SDK or does I/O.
"""

from __future__ import annotations

import ipaddress
import math
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from types import MappingProxyType
from typing import Final, Literal
from urllib.parse import urlsplit

from metacrate_grid_agent._core._tools import Effect
from metacrate_grid_agent.config import shown_url
from metacrate_grid_agent.errors import ConfigError, ConfigProblem

__all__ = ["McpLimits", "McpServer"]

#: A server's label: it names the server in logs and error messages, never on the wire.
_LABEL: Final = re.compile(r"\A[A-Za-z0-9._-]{1,64}\Z", re.ASCII)
#: A tool-name prefix: the loop's name alphabet, short enough to leave room for the name.
_PREFIX: Final = re.compile(r"\A[A-Za-z0-9_-]{1,32}\Z", re.ASCII)
#: Header names that carry a credential: refused over cleartext http to a remote host.
_CREDENTIAL_HEADER: Final = re.compile(r"auth|token|key|secret|cookie|session", re.IGNORECASE)
#: An environment variable's name (``bearer_token_env``).
_VARIABLE: Final = re.compile(r"\A[A-Za-z_][A-Za-z0-9_]{0,127}\Z", re.ASCII)
#: Longest per-tool timeout the loop accepts (``_schema.MAX_TOOL_TIMEOUT_S``).
_MAX_TOOL_TIMEOUT_S: Final = 600.0

Transport = Literal["stdio", "http"]


def _is_loopback(host: str) -> bool:
    # The LLM endpoint's rule: "localhost" itself and loopback literals only.
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _names(names: Iterable[str]) -> frozenset[str]:
    # A lone string would be taken letter by letter: refused by the check as not a name set.
    return frozenset(names) if not isinstance(names, str) else frozenset({names})


def _frozen_env(env: Mapping[str, str] | None) -> Mapping[str, str] | None:
    return None if env is None else MappingProxyType(dict(env))


@dataclass(frozen=True, slots=True, repr=False)
class McpServer:
    """One MCP server whose tools the loop may call. Build with :meth:`stdio` or :meth:`http`.

    ``prefix`` is put before each of the server's tool names (``prefix + name``): two servers
    that offer a tool of the same name are an error at start-up unless a prefix tells them
    apart. ``effects`` overrides the effect of named tools (by their name on the server);
    every other tool is read-only only when the server declares ``readOnlyHint: true``.
    ``tool_timeout_s`` overrides ``tool_loop.tool_timeout_s`` for this server's tools.
    ``allow_tools`` (when given) and ``block_tools`` filter the server's tools by their name
    on the server, before anything else is checked: only allowed, unblocked tools are kept,
    so a server offering more tools than the loop accepts can still be used.
    """

    def wants(self, name: str) -> bool:
        """Whether the tool filter keeps the server's tool ``name``."""
        return self.filtered_out(name) is None

    def filtered_out(self, name: str) -> str | None:
        """Why the tool filter leaves out the server's tool ``name``, or None if it keeps it."""
        if self.allow_tools is not None and name not in self.allow_tools:
            return "not in the server's allow_tools"
        if name in self.block_tools:
            return "in the server's block_tools"
        return None

    label: str
    transport: Transport
    command: str | None = None
    args: tuple[str, ...] = ()
    env: Mapping[str, str] | None = field(default=None, repr=False)
    inherit_env: tuple[str, ...] = ()
    cwd: str | None = None
    url: str | None = None
    headers: Mapping[str, str] | None = field(default=None, repr=False)
    prefix: str = ""
    effects: Mapping[str, Effect] = field(default_factory=lambda: MappingProxyType({}))
    tool_timeout_s: float | None = None
    allow_insecure_http: bool = False
    allow_tools: frozenset[str] | None = None
    block_tools: frozenset[str] = frozenset()
    bearer_token_env: str | None = None
    bearer_token_file: str | None = None

    def __repr__(self) -> str:
        """The fields, with ``env`` and ``headers`` left out and ``url`` shown by the one rule
        for credentials in a URL (``config.shown_url``)."""
        shown = {f.name: getattr(self, f.name) for f in fields(self) if f.repr}
        if self.url is not None:
            shown["url"] = shown_url(self.url)
        return f"McpServer({', '.join(f'{name}={value!r}' for name, value in shown.items())})"

    @classmethod
    def stdio(
        cls,
        label: str,
        command: str,
        args: Sequence[str] = (),
        *,
        env: Mapping[str, str] | None = None,
        inherit_env: Iterable[str] = (),
        cwd: str | None = None,
        prefix: str = "",
        effects: Mapping[str, Effect] | None = None,
        tool_timeout_s: float | None = None,
        allow_tools: Iterable[str] | None = None,
        block_tools: Iterable[str] = (),
    ) -> McpServer:
        """A server the adapter starts as a subprocess and talks to over its stdin/stdout.

        The subprocess gets a minimal environment (``PATH``, ``HOME`` and a few more), the
        variables of this process named by ``inherit_env`` (as they are when it starts; one
        that is not set is skipped), then ``env``; it is stopped when the toolset closes.
        Credentials belong in ``env``: its values are redacted from the server's stderr.
        """
        server = cls(
            label=label,
            transport="stdio",
            command=command,
            args=tuple(args),
            env=_frozen_env(env),
            # A lone string is kept whole, and refused by the check as not a list of names.
            inherit_env=(f"{inherit_env} (one string)",)
            if isinstance(inherit_env, str)
            else tuple(inherit_env),
            cwd=cwd,
            prefix=prefix,
            effects=MappingProxyType(dict(effects or {})),
            tool_timeout_s=tool_timeout_s,
            allow_tools=None if allow_tools is None else _names(allow_tools),
            block_tools=_names(block_tools),
        )
        server._check()
        return server

    @classmethod
    def http(
        cls,
        label: str,
        url: str,
        *,
        headers: Mapping[str, str] | None = None,
        prefix: str = "",
        effects: Mapping[str, Effect] | None = None,
        tool_timeout_s: float | None = None,
        allow_insecure_http: bool = False,
        allow_tools: Iterable[str] | None = None,
        block_tools: Iterable[str] = (),
        bearer_token_env: str | None = None,
        bearer_token_file: str | os.PathLike[str] | None = None,
    ) -> McpServer:
        """A server at exactly ``url`` over streamable HTTP (``http://`` or ``https://``).

        Every request goes to that URL and nowhere else: redirects are refused, no proxy is
        read from the environment, no cookie is kept. ``headers`` (an authorization header,
        say) are sent with every request and never logged. As for the LLM endpoint, a
        credential header over cleartext ``http://`` to a host other than loopback is
        refused unless ``allow_insecure_http`` is true.

        ``bearer_token_env`` (a variable's name) or ``bearer_token_file`` (a path) give the
        token of an ``Authorization: Bearer`` header instead, read each time the server is
        started, never held here: the file by the API key file's rule (a regular file
        holding the token alone; one other users can read is used with a warning). The
        token is in no repr, error or log line, and counts as a credential header for the
        cleartext rule. OAuth discovery is not done: it would send requests to URLs other
        than ``url``.
        """
        server = cls(
            label=label,
            transport="http",
            url=url,
            headers=_frozen_env(headers),
            prefix=prefix,
            effects=MappingProxyType(dict(effects or {})),
            tool_timeout_s=tool_timeout_s,
            allow_insecure_http=allow_insecure_http,
            allow_tools=None if allow_tools is None else _names(allow_tools),
            block_tools=_names(block_tools),
            bearer_token_env=bearer_token_env,
            bearer_token_file=None if bearer_token_file is None else os.fspath(bearer_token_file),
        )
        server._check()
        return server

    def _bearer_sources(self) -> list[str]:
        """Where the ``Authorization`` header comes from: ``headers``, a variable, a file."""
        found = ["headers"] if any(k.lower() == "authorization" for k in self.headers or {}) else []
        found += [key for key in ("bearer_token_env", "bearer_token_file") if getattr(self, key)]
        return found

    def _bearer_problems(self) -> list[tuple[str, str]]:
        problems: list[tuple[str, str]] = []
        env, file = self.bearer_token_env, self.bearer_token_file
        if env is not None and (not isinstance(env, str) or _VARIABLE.match(env) is None):
            problems.append(("bearer_token_env", "must be an environment variable's name"))
        if file is not None and (not isinstance(file, str) or not file):
            problems.append(("bearer_token_file", "must be a non-empty path"))
        if (env is not None or file is not None) and self.transport != "http":
            problems.append(("bearer_token_env", "goes with an HTTP server"))
        if len(self._bearer_sources()) > 1:
            problems.append(
                (
                    "bearer_token_env",
                    (
                        "give the Authorization header one source: headers, "
                        "bearer_token_env or bearer_token_file"
                    ),
                )
            )
        return problems

    def _check(self) -> None:
        problems: list[tuple[str, str]] = []
        if not isinstance(self.label, str) or _LABEL.match(self.label) is None:
            problems.append(("label", "must be 1 to 64 of letters, digits and . _ -"))
        if self.prefix and _PREFIX.match(self.prefix) is None:
            problems.append(("prefix", "must be empty or 1 to 32 of letters, digits, _ and -"))
        if self.transport == "stdio" and not self.command:
            problems.append(("command", "must not be empty"))
        if not all(isinstance(n, str) and _VARIABLE.match(n) for n in self.inherit_env):
            problems.append(("inherit_env", "must be a list of environment variable names"))
        if self.transport == "http":
            parts = urlsplit(self.url or "")
            if parts.scheme not in ("http", "https") or not parts.hostname:
                problems.append(("url", "must be an absolute http:// or https:// URL"))
            elif parts.username is not None or parts.password is not None:
                problems.append(("url", "must not carry credentials; send them in headers"))
            elif parts.fragment:
                problems.append(("url", "must not have a fragment"))
            elif (
                parts.scheme == "http"
                and not _is_loopback(parts.hostname)
                and self.allow_insecure_http is not True
                and (
                    self._bearer_sources()
                    or any(_CREDENTIAL_HEADER.search(name) for name in self.headers or {})
                )
            ):
                problems.append(
                    (
                        "url",
                        (
                            "cleartext http to a non-loopback host would send the credential "
                            "header unencrypted; use https, or set allow_insecure_http = true"
                        ),
                    )
                )
        problems.extend(self._bearer_problems())
        for key in ("allow_tools", "block_tools"):
            names = getattr(self, key)
            if names is not None and not all(isinstance(name, str) for name in names):
                problems.append((key, "must be a set of tool names (strings)"))
        for name, effect in self.effects.items():
            if not isinstance(effect, Effect):
                problems.append((f"effects[{name[:64]!r}]", "must be an Effect"))
        timeout = self.tool_timeout_s
        if timeout is not None and (
            isinstance(timeout, bool)
            or not isinstance(timeout, int | float)
            or not math.isfinite(timeout)
            or not 0 < timeout <= _MAX_TOOL_TIMEOUT_S
        ):
            problems.append(
                ("tool_timeout_s", f"must be None or above 0 and at most {_MAX_TOOL_TIMEOUT_S:g}")
            )
        if problems:
            where = f"mcp.{str(self.label)[:64]}"
            raise ConfigError([ConfigProblem(f"{where}.{key}", text) for key, text in problems])


@dataclass(frozen=True, slots=True)
class McpLimits:
    """Bounds on the adapter's own I/O. Every one has a default, a floor and a reason.

    * ``startup_timeout_s`` (10 s): starting one server and listing its tools.
    * ``http_connect_timeout_s`` (5 s): opening a connection to an HTTP server.
    * ``http_read_timeout_s`` (60 s): silence allowed on an HTTP response; raised for a
      server to its tools' timeout plus 5 s, so that a slow call is ended by the loop's
      tool timeout (which cancels that one request) and not by the connection failing.
    * ``max_response_bytes`` (4 MiB): one HTTP response body, one server-sent event.
    * ``max_observation_bytes`` (64 KiB): the text built from one result, before the
      loop cuts it to ``tool_loop.max_observation_bytes``.
    * ``max_list_pages`` (16): pages of a paginated tool listing.
    """

    startup_timeout_s: float = 10.0
    http_connect_timeout_s: float = 5.0
    http_read_timeout_s: float = 60.0
    max_response_bytes: int = 4 * 1024 * 1024
    max_observation_bytes: int = 64 * 1024
    max_list_pages: int = 16

    def __post_init__(self) -> None:
        problems = [
            ConfigProblem(f"mcp.{name}", "must be a positive number")
            for name in ("startup_timeout_s", "http_connect_timeout_s", "http_read_timeout_s")
            if not _positive(getattr(self, name))
        ]
        problems.extend(
            ConfigProblem(f"mcp.{name}", "must be a positive int")
            for name in ("max_response_bytes", "max_observation_bytes", "max_list_pages")
            if isinstance(getattr(self, name), bool)
            or not isinstance(getattr(self, name), int)
            or getattr(self, name) < 1
        )
        if problems:
            raise ConfigError(problems)


def _positive(value: object) -> bool:
    return (
        not isinstance(value, bool)
        and isinstance(value, int | float)
        and math.isfinite(value)
        and value > 0
    )
