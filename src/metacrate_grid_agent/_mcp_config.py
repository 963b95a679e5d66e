"""The ``[mcp.servers.NAME]`` tables: MCP servers whose tools a session may call.

One table per server, mirroring ``metacrate_grid_agent.mcp.McpServer``: a stdio server
(``command``, ``args``, ``env``, ``inherit_env``, ``cwd``) or a streamable HTTP one (``url``,
``headers``), its ``tool_prefix``, ``effects`` overriding the effect of named tools, and its
start-up and call timeouts. Nothing here imports the MCP SDK, starts a server or does
network I/O: the values are read and checked, every problem at once, with the same rules as
the rest of the configuration (did-you-mean on unknown keys, paths relative to the
configuration file).

A value of ``env`` or ``headers`` is a plain string, or a secret given as
``{ env = "NAME" }`` (an environment variable) or ``{ file = "path" }`` (a file holding it
alone, read by the key file's rule: a regular file, a warning when others can read it). A
name that speaks of a credential (``GITHUB_TOKEN``, ``Authorization``...) must be given the
second way, so that no credential is written in the file; a secret is held as a
:class:`~metacrate_grid_agent.config.Secret` and never shown. ``inherit_env`` names
variables the stdio server takes from the command's own environment as they are when it
starts (settings such as ``SSL_CERT_FILE``, not credentials: those go through ``env``).
"""

from __future__ import annotations

import logging
import math
import re
import urllib.parse
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, Final, Literal

from metacrate_grid_agent._secret import Secret, read_secret_file
from metacrate_grid_agent.errors import ConfigProblem

__all__ = ["McpServerSettings", "parse_mcp_table", "servers_from_json"]

#: Where a secret file other users can read is warned about (the configuration's logger).
logger = logging.getLogger("metacrate_grid_agent.config")

#: A server's name (its table's name): the label of logs, prompts and reports.
_NAME: Final = re.compile(r"\A[A-Za-z0-9._-]{1,64}\Z", re.ASCII)
#: A tool-name prefix: the loop's name alphabet, short enough to leave room for the name.
_PREFIX: Final = re.compile(r"\A[A-Za-z0-9_-]{1,32}\Z", re.ASCII)
#: An environment variable's or a header's name.
_VARIABLE: Final = re.compile(r"\A[A-Za-z_][A-Za-z0-9_]{0,127}\Z", re.ASCII)
_HEADER: Final = re.compile(r"\A[!#$%&'*+.^_`|~0-9A-Za-z-]{1,128}\Z", re.ASCII)
#: Words that make an ``env`` or ``headers`` name a credential's (any case): its value must
#: come from the environment or a file, never the configuration file itself.
CREDENTIAL_NAME_WORDS: Final = (
    "key", "token", "secret", "password", "passwd", "auth", "credential", "cookie", "session",
)  # fmt: skip
#: Largest secret read from a ``{ file = ... }``: a token or a key, never a whole document.
MAX_SECRET_FILE_BYTES: Final = 16 * 1024
#: Most MCP servers in one configuration: each is a process or a connection held open.
MAX_SERVERS: Final = 16
#: Most entries of one server's ``args``, ``env``, ``headers`` or ``effects``.
MAX_ENTRIES: Final = 256
#: ``startup_timeout_s``: default, floor and ceiling (starting one server, listing its tools;
#: an ``npx`` or ``uvx`` server may download itself on its first start).
STARTUP_TIMEOUT_S: Final = (10.0, 0.001, 300.0)
#: ``tool_timeout_s``: floor and ceiling (the loop's own per-tool ceiling); by default the
#: server's calls take ``tool_loop.tool_timeout_s``.
TOOL_TIMEOUT_S: Final = (0.001, 600.0)
#: The effects a tool may be given by an override.
EFFECTS: Final = ("read_only", "mutating")

_KNOWN: Final = frozenset(
    {"command", "args", "env", "inherit_env", "cwd", "url", "headers", "tool_prefix", "effects"}
    | {"startup_timeout_s", "tool_timeout_s", "allow_tools", "block_tools"}
)
#: Keys other clients' files use, and what to write here instead.
_INSTEAD: Final = {
    "type": "the transport follows from command (stdio) or url (streamable HTTP)",
    "transport": "the transport follows from command (stdio) or url (streamable HTTP)",
    "prefix": "write tool_prefix",
    "timeout": "write startup_timeout_s or tool_timeout_s",
}

Transport = Literal["stdio", "http"]


@dataclass(frozen=True, slots=True)
class McpServerSettings:
    """One ``[mcp.servers.NAME]`` table, checked; the secrets in it are :class:`Secret`."""

    name: str
    transport: Transport
    command: str | None = None
    args: tuple[str, ...] = ()
    env: Mapping[str, str | Secret] = field(default_factory=lambda: MappingProxyType({}))
    #: Variables of the command's own environment passed on to the stdio server, by name.
    inherit_env: tuple[str, ...] = ()
    cwd: str | None = None
    url: str | None = None
    headers: Mapping[str, str | Secret] = field(default_factory=lambda: MappingProxyType({}))
    tool_prefix: str = ""
    effects: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    startup_timeout_s: float = STARTUP_TIMEOUT_S[0]
    tool_timeout_s: float | None = None
    #: Only these tools (by their name on the server) are offered; None: every tool.
    allow_tools: tuple[str, ...] | None = None
    #: These tools (by their name on the server) are never offered.
    block_tools: tuple[str, ...] = ()

    def filtered_out(self, remote_name: str) -> str | None:
        """Why the tool named ``remote_name`` on the server is not offered, or None."""
        if self.allow_tools is not None and remote_name not in self.allow_tools:
            return f"not in [mcp.servers.{self.name}] allow_tools"
        if remote_name in self.block_tools:
            return f"in [mcp.servers.{self.name}] block_tools"
        return None

    def revealed(self, part: Literal["env", "headers"]) -> dict[str, str]:
        """``env`` or ``headers`` with each secret's value: only to start the server."""
        values = self.env if part == "env" else self.headers
        return {k: v if isinstance(v, str) else v.reveal() for k, v in values.items()}

    def secrets(self) -> list[Secret]:
        """Every secret of the table (to scrub from whatever is printed)."""
        return [v for v in (*self.env.values(), *self.headers.values()) if not isinstance(v, str)]

    def to_redacted_dict(self, shown_url: Callable[[str], str]) -> dict[str, Any]:
        """The table as plain data for display: secrets as ``[REDACTED]`` with their source,
        the URL shown by ``shown_url`` (its credentials hidden), unset keys left out."""

        def value(v: str | Secret) -> str:
            return v if isinstance(v, str) else f"[REDACTED] ({v.origin})"

        shown: dict[str, Any] = {"transport": self.transport}
        if self.command is not None:
            shown |= {"command": self.command, "args": list(self.args)}
        if self.inherit_env:
            shown["inherit_env"] = list(self.inherit_env)
        if self.cwd is not None:
            shown["cwd"] = self.cwd
        if self.url is not None:
            shown["url"] = shown_url(self.url)
        if self.env:
            shown["env"] = {k: value(v) for k, v in self.env.items()}
        if self.headers:
            shown["headers"] = {k: value(v) for k, v in self.headers.items()}
        if self.tool_prefix:
            shown["tool_prefix"] = self.tool_prefix
        if self.effects:
            shown["effects"] = dict(self.effects)
        shown["startup_timeout_s"] = self.startup_timeout_s
        if self.tool_timeout_s is not None:
            shown["tool_timeout_s"] = self.tool_timeout_s
        if self.allow_tools is not None:
            shown["allow_tools"] = list(self.allow_tools)
        if self.block_tools:
            shown["block_tools"] = list(self.block_tools)
        return shown


def _credential_name(name: str) -> bool:
    folded = name.lower()
    return any(word in folded for word in CREDENTIAL_NAME_WORDS)


def _resolve(raw: str, base_dir: Path | None) -> Path:
    path = Path(raw).expanduser()
    return base_dir / path if base_dir is not None and not path.is_absolute() else path


class _Reader:
    """Reads one server's table, gathering its problems under ``mcp.servers.NAME.``."""

    def __init__(
        self,
        prefix: str,
        env: Mapping[str, str],
        base_dir: Path | None,
        unknown: Callable[[str, frozenset[str]], str],
    ) -> None:
        self.prefix = prefix
        self.env = env
        self.base_dir = base_dir
        self.unknown = unknown
        self.problems: list[ConfigProblem] = []

    def problem(self, key: str, text: str) -> None:
        self.problems.append(ConfigProblem((self.prefix + key).rstrip("."), text))

    def text(self, table: Mapping[str, Any], key: str) -> str | None:
        value = table.get(key)
        if value is None:
            return None
        if not isinstance(value, str) or not value:
            self.problem(key, "must be a non-empty string")
            return None
        return value

    def number(self, table: Mapping[str, Any], key: str, low: float, high: float) -> float | None:
        value = table.get(key)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int | float):
            self.problem(key, f"must be a number of seconds, got {value!r}")
        elif not math.isfinite(value) or not low <= value <= high:
            self.problem(key, f"{value!r} is outside {low:g} to {high:g} s")
        else:
            return float(value)
        return None

    def values(self, table: Mapping[str, Any], key: str) -> dict[str, str | Secret]:
        """``env`` or ``headers``: names checked, each value a string or a sourced secret."""
        given = table.get(key, {})
        if not isinstance(given, Mapping):
            self.problem(key, 'must be a table: NAME = "value" or NAME = { env = "VAR" }')
            return {}
        if len(given) > MAX_ENTRIES:
            self.problem(key, f"has {len(given)} entries; the limit is {MAX_ENTRIES}")
            return {}
        pattern = _VARIABLE if key == "env" else _HEADER
        found: dict[str, str | Secret] = {}
        for name, raw in given.items():
            where = f"{key}.{name}"
            if pattern.match(name) is None:
                what = "an environment variable's" if key == "env" else "a header's"
                self.problem(where, f"is not {what} name")
                continue
            value = self._value(where, name, raw)
            if value is not None:
                found[name] = value
        return found

    def _value(self, where: str, name: str, raw: object) -> str | Secret | None:
        if isinstance(raw, str):
            if _credential_name(name):
                self.problem(
                    where,
                    'names a credential: give it as { env = "VAR" } or { file = "path" }, '
                    "never written in the configuration file",
                )
                return None
            return raw
        if not isinstance(raw, Mapping) or len(raw) != 1 or next(iter(raw)) not in ("env", "file"):
            self.problem(where, 'must be a string, { env = "VAR" } or { file = "path" }')
            return None
        source, ref = next(iter(raw.items()))
        if not isinstance(ref, str) or not ref:
            self.problem(f"{where}.{source}", "must be a non-empty string")
            return None
        if source == "env":
            shown = ref if _VARIABLE.match(ref) else "(a name not repeated here)"
            value = self.env.get(ref)
            if not value:
                self.problem(where, f"the environment variable {shown} is unset or empty")
                return None
            return Secret(value, origin=f"environment variable {shown}")
        path = _resolve(ref, self.base_dir)
        try:
            text, oversized = read_secret_file(
                path, MAX_SECRET_FILE_BYTES, what=f"the file {str(path)!r}", log=logger
            )
        except (OSError, UnicodeDecodeError) as exc:
            reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else "not UTF-8"
            self.problem(where, f"cannot read the file {str(path)!r} ({reason})")
            return None
        if oversized or not text or "\n" in text or "\r" in text:
            self.problem(
                where,
                f"the file {str(path)!r} must hold the value alone: one line, at most "
                f"{MAX_SECRET_FILE_BYTES} bytes",
            )
            return None
        return Secret(text, origin=f"file {str(path)!r}")


def _server(name: str, table: object, reader: _Reader) -> McpServerSettings | None:
    if _NAME.match(name) is None:
        reader.problem("", "a server's name must be 1 to 64 of letters, digits and . _ -")
        return None
    if not isinstance(table, Mapping):
        reader.problem("", "must be a table")
        return None
    for key in table:
        if key not in _KNOWN:
            hint = _INSTEAD.get(str(key))
            said = f"unknown key; {hint}" if hint else reader.unknown(str(key), _KNOWN)
            reader.problem(str(key), said)
    command, url = reader.text(table, "command"), reader.text(table, "url")
    transport: Transport = "stdio" if command is not None else "http"
    if ("command" in table) == ("url" in table):
        reader.problem(
            "command",
            "give command (a server started over stdio) or url (streamable HTTP), not both"
            if "command" in table
            else "give command (a server started over stdio) or url (streamable HTTP)",
        )
    stdio_only = [k for k in ("args", "env", "inherit_env", "cwd") if k in table]
    if "url" in table and stdio_only:
        reader.problem(stdio_only[0], "goes with command (a stdio server), not url")
    if "command" in table and "headers" in table:
        reader.problem("headers", "goes with url (an HTTP server), not command")
    args = table.get("args", [])
    if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
        reader.problem("args", "must be a list of strings")
        args = []
    elif len(args) > MAX_ENTRIES:
        reader.problem("args", f"has {len(args)} entries; the limit is {MAX_ENTRIES}")
    if command is not None and command.startswith(("./", "../")):
        command = str(_resolve(command, reader.base_dir))  # a path beside the file
    cwd = reader.text(table, "cwd")
    if cwd is not None:
        cwd = str(_resolve(cwd, reader.base_dir))
        if not Path(cwd).is_dir():
            reader.problem("cwd", f"{cwd!r} is not a folder")
    if url is not None:
        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            reader.problem("url", "must be an absolute http:// or https:// URL")
        elif parts.username is not None or parts.password is not None:
            reader.problem("url", "must not carry credentials; send them in headers")
    prefix = table.get("tool_prefix", "")
    if not isinstance(prefix, str) or (prefix and _PREFIX.match(prefix) is None):
        reader.problem("tool_prefix", "must be 1 to 32 of letters, digits, _ and -")
        prefix = ""
    effects = table.get("effects", {})
    if not isinstance(effects, Mapping):
        reader.problem("effects", 'must be a table: TOOL = "read_only" or "mutating"')
        effects = {}
    for tool, effect in effects.items():
        if effect not in EFFECTS:
            reader.problem(f"effects.{tool}", 'must be "read_only" or "mutating"')
    allow = _names(table, "allow_tools", reader)
    block = _names(table, "block_tools", reader)
    env, headers = reader.values(table, "env"), reader.values(table, "headers")
    inherit = _inherited(table, env, reader)
    startup = reader.number(table, "startup_timeout_s", *STARTUP_TIMEOUT_S[1:])
    tool_timeout = reader.number(table, "tool_timeout_s", *TOOL_TIMEOUT_S)
    return McpServerSettings(
        name=name,
        transport=transport,
        command=command,
        args=tuple(args),
        env=MappingProxyType(env),
        inherit_env=inherit,
        cwd=cwd,
        url=url,
        headers=MappingProxyType(headers),
        tool_prefix=prefix,
        effects=MappingProxyType({str(k): str(v) for k, v in effects.items()}),
        startup_timeout_s=STARTUP_TIMEOUT_S[0] if startup is None else startup,
        tool_timeout_s=tool_timeout,
        allow_tools=allow,
        block_tools=block or (),
    )


def _inherited(
    table: Mapping[str, Any], env: Mapping[str, object], reader: _Reader
) -> tuple[str, ...]:
    """``inherit_env``: names of variables, none a credential's, none also set in ``env``."""
    value = table.get("inherit_env", [])
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        reader.problem("inherit_env", "must be a list of environment variable names")
        return ()
    if len(value) > MAX_ENTRIES:
        reader.problem("inherit_env", f"has {len(value)} entries; the limit is {MAX_ENTRIES}")
        return ()
    for name in value:
        if _VARIABLE.match(name) is None:
            reader.problem("inherit_env", "holds a name that is not an environment variable's name")
        elif _credential_name(name):
            reader.problem(
                "inherit_env",
                f"{name} names a credential: pass it as "
                f'env = {{ {name} = {{ env = "{name}" }} }}, so that it is redacted like every '
                "secret",
            )
        elif name in env:
            reader.problem("inherit_env", f"{name} is also set in env: give it one source")
    return tuple(dict.fromkeys(value))


def _names(table: Mapping[str, Any], key: str, reader: _Reader) -> tuple[str, ...] | None:
    """``allow_tools`` or ``block_tools``: a list of tool names, or None when not given."""
    if key not in table:
        return None
    value = table[key]
    if (
        not isinstance(value, list)
        or not all(isinstance(v, str) and v for v in value)
        or len(value) > MAX_ENTRIES
    ):
        reader.problem(key, f"must be a list of tool names (at most {MAX_ENTRIES})")
        return None
    return tuple(value)


def parse_mcp_table(
    table: object,
    *,
    env: Mapping[str, str],
    base_dir: Path | None,
    unknown: Callable[[str, frozenset[str]], str],
) -> tuple[tuple[McpServerSettings, ...], list[ConfigProblem]]:
    """The servers of an ``[mcp]`` table and every problem found in it."""
    if not isinstance(table, Mapping):
        return (), [ConfigProblem("mcp", "must be a table")]
    problems = [
        ConfigProblem(f"mcp.{k}", unknown(str(k), frozenset({"servers"})))
        for k in table
        if k != "servers"
    ]
    servers_table = table.get("servers", {})
    if not isinstance(servers_table, Mapping):
        return (), [*problems, ConfigProblem("mcp.servers", "must be a table of servers")]
    if len(servers_table) > MAX_SERVERS:
        problems.append(
            ConfigProblem("mcp.servers", f"names {len(servers_table)}; the limit is {MAX_SERVERS}")
        )
        return (), problems
    servers = []
    for name, server_table in servers_table.items():
        reader = _Reader(f"mcp.servers.{name}.", env, base_dir, unknown)
        server = _server(str(name), server_table, reader)
        problems.extend(reader.problems)
        if server is not None and not reader.problems:
            servers.append(server)
    return tuple(servers), problems + _shared_prefixes(servers)


def _shared_prefixes(servers: list[McpServerSettings]) -> list[ConfigProblem]:
    """Two servers without a prefix may offer tools of one name: that is found at start-up;
    two servers with the same non-empty prefix are a mistake found here."""
    problems = []
    seen: dict[str, str] = {}
    for server in servers:
        if server.tool_prefix and server.tool_prefix in seen:
            problems.append(
                ConfigProblem(
                    f"mcp.servers.{server.name}.tool_prefix",
                    f"{server.tool_prefix!r} is also the prefix of {seen[server.tool_prefix]!r}",
                )
            )
        seen.setdefault(server.tool_prefix, server.name)
    return problems


#: A value that is a whole ``${env:NAME}`` reference (VS Code's form): a secret from there.
_ENV_REFERENCE: Final = re.compile(r"\A\$\{env:([A-Za-z_][A-Za-z0-9_]{0,127})\}\Z", re.ASCII)
#: Keys of the JSON forms that are read, by the name they take in the TOML table.
_JSON_KEYS: Final = {
    "command": "command", "args": "args", "env": "env", "cwd": "cwd", "url": "url",
    "headers": "headers", "inherit_env": "inherit_env",
}  # fmt: skip
#: Keys of the JSON forms that cannot be honoured, and why.
_JSON_REFUSED: Final = {
    "envFile": "envFile is not read: list the variables in env",
    "autoApprove": "approval is the command's own (run --approve asks before mutating calls)",
    "alwaysAllow": "approval is the command's own (run --approve asks before mutating calls)",
}


def _json_value(value: object, where: str, problems: list[ConfigProblem]) -> object:
    """A JSON ``env``/``headers`` value in the TOML table's form (``${env:NAME}`` as an
    environment reference), or None with a problem."""
    if isinstance(value, str):
        match = _ENV_REFERENCE.match(value)
        if match is not None:
            return {"env": match[1]}
        if "${" in value:
            problems.append(
                ConfigProblem(
                    where,
                    "a ${...} substitution other than a whole ${env:NAME} cannot be honoured "
                    "(inputs and workspace variables are the editor's)",
                )
            )
            return None
    return value


def _json_server(name: str, raw: object, problems: list[ConfigProblem]) -> dict[str, Any] | None:
    where = f"mcpServers.{name}"
    if not isinstance(raw, Mapping):
        problems.append(ConfigProblem(where, "must be an object"))
        return None
    if raw.get("disabled") is True:
        return None
    table: dict[str, Any] = {}
    kind = raw.get("type")
    if kind not in (None, "stdio", "http", "streamable-http", "streamableHttp"):
        problems.append(
            ConfigProblem(
                f"{where}.type",
                f"{str(kind)[:40]!r} is not supported: stdio or streamable HTTP (type http) only",
            )
        )
    for key, value in raw.items():
        if key in ("type", "disabled"):
            continue
        if key in _JSON_REFUSED:
            problems.append(ConfigProblem(f"{where}.{key}", _JSON_REFUSED[key]))
        elif key not in _JSON_KEYS:
            problems.append(ConfigProblem(f"{where}.{key}", "not supported here; left unread"))
        elif key in ("env", "headers") and isinstance(value, Mapping):
            table[key] = {
                k: _json_value(v, f"{where}.{key}.{k}", problems) for k, v in value.items()
            }
        elif isinstance(value, str) and "${" in value:
            _refuse_substitution(value, f"{where}.{key}", problems)
        elif isinstance(value, list) and any(isinstance(v, str) and "${" in v for v in value):
            for index, item in enumerate(value):
                if isinstance(item, str) and "${" in item:
                    _refuse_substitution(item, f"{where}.{key}[{index}]", problems)
        else:
            table[_JSON_KEYS[key]] = value
    return table


def _refuse_substitution(value: str, where: str, problems: list[ConfigProblem]) -> None:
    """A ``${...}`` in a plain value (not env or headers) would reach the server as its
    literal text: a problem saying why, whatever the substitution."""
    if _json_value(value, where, problems) is not None:
        problems.append(
            ConfigProblem(
                where, "a ${env:NAME} reference is read in env and headers only; write the value"
            )
        )


def servers_from_json(
    document: object,
    *,
    env: Mapping[str, str],
    base_dir: Path | None,
    unknown: Callable[[str, frozenset[str]], str],
) -> tuple[tuple[McpServerSettings, ...], list[ConfigProblem]]:
    """The servers of an ``mcpServers`` JSON document (Claude Desktop; VS Code's ``mcp.json``
    names the object ``servers``), mapped to the TOML tables' fields, and every problem:
    what cannot be honoured (SSE, ``envFile``, input prompts) is refused with its reason."""
    if not isinstance(document, Mapping):
        return (), [ConfigProblem("mcpServers", "the file must hold a JSON object")]
    servers = document.get("mcpServers", document.get("servers"))
    if not isinstance(servers, Mapping):
        return (), [ConfigProblem("mcpServers", "no mcpServers (or servers) object found")]
    problems: list[ConfigProblem] = []
    tables = {}
    for name, raw in servers.items():
        table = _json_server(str(name), raw, problems)
        if table is not None:
            tables[str(name)] = table
    found, more = parse_mcp_table({"servers": tables}, env=env, base_dir=base_dir, unknown=unknown)
    problems += [
        ConfigProblem("mcpServers." + p.key.removeprefix("mcp.servers."), p.problem) for p in more
    ]
    return found, problems
