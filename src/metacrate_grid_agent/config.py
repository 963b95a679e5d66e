"""Configuration: the ``[llm]`` and ``[tool_loop]`` tables, validated, frozen and documented.

Every setting has a default and a hard ceiling, both named in :data:`LLM_SETTINGS` and
:data:`TOOL_LOOP_SETTINGS` with a one-line reason each. Validation reports every problem at
once (:class:`~metacrate_grid_agent.errors.ConfigError`), each naming the key, the value and
the limit. Unknown keys are errors, so a typo never passes silently.

Build a configuration from a TOML file (:meth:`AgentConfig.from_toml`), from a mapping
(:meth:`LLMConfig.from_mapping`), or directly in code (``LLMConfig(endpoint_url=...,
api_key=Secret(...))``): all three run the same validation.
"""

from __future__ import annotations

import difflib
import json
import logging
import os
import re
import tomllib
import urllib.parse
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import msgspec
from msgspec.structs import force_setattr

from metacrate_grid_agent import _public, _secret
from metacrate_grid_agent._files import read_regular
from metacrate_grid_agent._mcp_config import (
    McpServerSettings,
    parse_mcp_table,
    servers_from_json,
)
from metacrate_grid_agent._secret import Secret, read_secret_file
from metacrate_grid_agent._settings import (
    LLM_SETTINGS,
    TOOL_LOOP_SETTINGS,
    KiB,
    MiB,
    Setting,
    check_ca_bundle,
    check_numbers,
    check_provider_name,
    check_url,
    parse_url,
)
from metacrate_grid_agent.errors import ConfigError, ConfigProblem

__all__ = [
    "LLM_SETTINGS",
    "TOOL_LOOP_SETTINGS",
    "AgentConfig",
    "LLMConfig",
    "McpServerSettings",
    "Secret",
    "Setting",
    "ToolLoopConfig",
]

logger = logging.getLogger("metacrate_grid_agent.config")

#: Longest API key accepted from any source; longer is a mistake (a whole file, say).
MAX_API_KEY_LENGTH: Final = 4096
#: Largest configuration file read.
MAX_CONFIG_FILE_BYTES: Final = 1 * MiB

#: What every secret shows instead of itself.
REDACTED: Final = _secret.REDACTED
#: The conventional shape of an environment variable's name (upper case, digits, _).
_ENV_NAME: Final = re.compile(r"\A[A-Z_][A-Z0-9_]{0,63}\Z", re.ASCII)


#: A URL parameter whose name holds one of these, in any case, carries a credential:
#: ``api-key``, ``key``, ``access_token``, ``client_secret``, ``sig`` and ``X-Amz-Signature``
#: (signed URLs), ``code`` (Azure Functions), ``password``, ``auth``.
CREDENTIAL_PARAMETER_WORDS: Final = ("key", "token", "secret", "sig", "code", "password", "auth")
#: What :func:`shown_url` shows of a URL that does not parse (any part may be a credential).
INVALID_URL: Final = "<invalid URL>"
# What urlsplit removes from a URL before reading it: tabs and line breaks anywhere, and
# controls and spaces at its start.
_URL_DROPPED: Final = {ord(c): None for c in "\t\n\r"}
_URL_STRIPPED: Final = "".join(map(chr, range(0x21)))
# The user-info of a URL's authority: everything up to its last "@".
_USER_INFO: Final = re.compile(r"\A([^:/?#]*:)?//[^/?#]*@")
# What separates a query's (or fragment's) parameters: "&", and ";" for older servers.
_PARAMETER_SEPARATOR: Final = re.compile(r"([&;])")


def shown_url(url: str) -> str:
    """``url`` as the library shows it anywhere (reprs, errors, output, transcripts).

    The one rule for a credential in a URL: the user-info (``user:password@``) is replaced
    whole by ``[REDACTED]``, and so is the value of each query or fragment parameter whose
    name (percent-escapes decoded) holds a word of :data:`CREDENTIAL_PARAMETER_WORDS` in any
    case; everything else is kept as given. A URL that does not parse is not quoted at all
    (:data:`INVALID_URL`): which part of it is a credential cannot be told.
    """
    url = url.translate(_URL_DROPPED).lstrip(_URL_STRIPPED)  # as urlsplit reads it
    try:
        parse_url(url)  # a port that is not a number raises
    except ValueError:
        return INVALID_URL
    head, hash_mark, fragment = url.partition("#")
    head, query_mark, query = head.partition("?")
    head = _USER_INFO.sub(lambda m: f"{m[1] or ''}//{REDACTED}@", head, count=1)
    return head + query_mark + _shown_parameters(query) + hash_mark + _shown_parameters(fragment)


def _shown_parameters(text: str) -> str:
    """A query or fragment with the value of each credential-named parameter hidden."""
    pieces = _PARAMETER_SEPARATOR.split(text)
    for index in range(0, len(pieces), 2):  # the separators sit at the odd places
        name, equals, _ = pieces[index].partition("=")
        folded = urllib.parse.unquote_plus(name).lower()
        if equals and any(word in folded for word in CREDENTIAL_PARAMETER_WORDS):
            pieces[index] = f"{name}={REDACTED}"
    return "".join(pieces)


def _path_shaped(raw: str) -> bool:
    """Whether ``raw`` looks like a file path rather than a key pasted where a path belongs.

    Only then is it repeated in a message. A path starts with ``/``, ``~`` or ``.``, or ends
    in a file extension, or has a separator and no upper case (keys mix cases and digits).
    """
    if raw.startswith(("/", "~", ".")) or _FILE_EXTENSION.search(raw) is not None:
        return True
    return ("/" in raw or "\\" in raw) and raw == raw.lower()


_FILE_EXTENSION: Final = re.compile(r"\.[A-Za-z0-9]{1,8}\Z", re.ASCII)


def _resolve_path(raw: str, base_dir: Path | None) -> Path:
    """``raw`` (with ``~`` expanded) relative to ``base_dir`` when it is relative."""
    path = Path(raw).expanduser()
    if base_dir is not None and not path.is_absolute():
        path = base_dir / path
    return path


def _resolve_api_key(
    table: Mapping[str, Any],
    env: Mapping[str, str],
    problems: list[ConfigProblem],
    prefix: str,
    base_dir: Path | None = None,
) -> Secret | None:
    sources = [k for k in ("api_key", "api_key_env", "api_key_file") if k in table]
    if len(sources) != 1:
        found = ", ".join(sources) if sources else "none"
        problems.append(
            ConfigProblem(
                prefix + "api_key",
                f"exactly one of api_key, api_key_env, api_key_file is required (found: {found})",
            )
        )
        return None
    source = sources[0]
    raw = table[source]
    key = prefix + source
    origin: str | None
    if isinstance(raw, Secret):
        value = raw.reveal() if source == "api_key" else None
        if value is None:
            problems.append(ConfigProblem(key, "must be a string"))
            return None
        origin = raw.origin
    elif not isinstance(raw, str) or not raw:
        problems.append(ConfigProblem(key, "must be a non-empty string"))
        return None
    elif source == "api_key":
        value, origin = raw, "inline"
    elif source == "api_key_env":
        found_value = env.get(raw)
        # Quoted only when it has the shape of a variable name: a key pasted here by
        # mistake (mixed case, dashes) must not be echoed.
        name = f" {raw}" if _ENV_NAME.match(raw) else ""
        if not found_value:
            problems.append(ConfigProblem(key, f"the environment variable{name} is unset or empty"))
            return None
        value, origin = found_value, f"environment variable{name}"
    else:
        path = _resolve_path(raw, base_dir)
        if _path_shaped(raw):
            tried = f" {str(path)!r}"
        elif base_dir is not None and not Path(raw).is_absolute():
            tried = f" (a name not repeated here, looked up in {str(base_dir)!r})"
        else:
            tried = ""
        value = _read_key_file(path, tried, key, problems)
        if value is None:
            return None
        origin = f"file{tried}"
    return _check_key_value(value, key, problems, origin)


def _read_key_file(path: Path, tried: str, key: str, problems: list[ConfigProblem]) -> str | None:
    """The key a key file holds: the whole file, whitespace around it stripped.

    Only a regular file is read (a link to one is followed); one that other users can read is
    used, with a warning, as ssh does for a private key.
    """
    try:
        value = read_secret_file(
            path, MAX_API_KEY_LENGTH + 1, what=f"the key file{tried}", log=logger
        ).text
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else "not UTF-8"
        problems.append(ConfigProblem(key, f"cannot read the key file{tried} ({reason})"))
        return None
    if not value:
        problems.append(ConfigProblem(key, f"the key file{tried} is empty"))
        return None
    if "\n" in value or "\r" in value:
        problems.append(
            ConfigProblem(
                key, f"the key file{tried} has more than one line; it must hold the key alone"
            )
        )
        return None
    return value


def _check_key_value(
    value: str, key: str, problems: list[ConfigProblem], origin: str | None = None
) -> Secret | None:
    if not value or len(value) > MAX_API_KEY_LENGTH:
        problems.append(
            ConfigProblem(key, f"the key must be 1 to {MAX_API_KEY_LENGTH} characters long")
        )
        return None
    if any(ord(c) < 0x21 or ord(c) > 0x7E for c in value):
        problems.append(
            ConfigProblem(key, "the key must be printable ASCII without spaces (a header value)")
        )
        return None
    return Secret(value, origin=origin)


class LLMConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The ``[llm]`` table: one endpoint, its credential, timeouts and ceilings.

    ``endpoint_url`` is the complete request URL, used exactly as given (query included).
    Construction validates every field and raises :class:`ConfigError` listing all problems.
    ``api_key`` takes a :class:`Secret` or a plain ``str`` (both in the signature type
    checkers see); a ``str`` is wrapped in a ``Secret`` at construction, so the stored key is
    always one and the config's repr and pickle never show it.
    """

    endpoint_url: str
    api_key: Secret
    allow_insecure_http: bool = False
    ca_bundle: str | None = None
    mint_missing_call_ids: bool = False
    provider_name: str = "openai"
    connect_timeout_s: float = 10.0
    request_timeout_s: float = 120.0
    response_idle_timeout_s: float = 60.0
    pool_idle_timeout_s: float = 30.0
    total_timeout_s: float = 300.0
    max_prompt_bytes: int = 4 * MiB
    max_response_bytes: int = 4 * MiB
    max_concurrent_requests: int = 4
    max_retries: int = 2
    max_retry_delay_s: float = 30.0
    max_text_bytes: int = 256 * KiB
    max_tool_calls: int = 32
    max_argument_bytes: int = 64 * KiB
    max_id_length: int = 256
    max_name_length: int = 64

    if TYPE_CHECKING:  # the signature type checkers see: a plain str key is accepted too

        def __init__(
            self,
            *,
            endpoint_url: str,
            api_key: str | Secret,
            allow_insecure_http: bool = ...,
            ca_bundle: str | None = ...,
            mint_missing_call_ids: bool = ...,
            provider_name: str = ...,
            connect_timeout_s: float = ...,
            request_timeout_s: float = ...,
            response_idle_timeout_s: float = ...,
            pool_idle_timeout_s: float = ...,
            total_timeout_s: float = ...,
            max_prompt_bytes: int = ...,
            max_response_bytes: int = ...,
            max_concurrent_requests: int = ...,
            max_retries: int = ...,
            max_retry_delay_s: float = ...,
            max_text_bytes: int = ...,
            max_tool_calls: int = ...,
            max_argument_bytes: int = ...,
            max_id_length: int = ...,
            max_name_length: int = ...,
        ) -> None: ...

    def __post_init__(self) -> None:
        if isinstance(self.api_key, str):  # a plain str: hide it before anything can show it
            force_setattr(self, "api_key", Secret(self.api_key, origin="inline"))
        problems = _validate_llm(self)
        if problems:
            raise ConfigError(problems)

    @classmethod
    def from_mapping(
        cls,
        table: Mapping[str, Any],
        *,
        env: Mapping[str, str] | None = None,
        base_dir: str | os.PathLike[str] | None = None,
    ) -> LLMConfig:
        """Build from a mapping shaped like the ``[llm]`` table.

        ``api_key_env`` is looked up in ``env`` (default: ``os.environ``). ``api_key_file``
        must be a regular file (or a link to one) holding the key alone: whitespace around it
        (a final newline) is stripped, and a file of two lines or more is refused; a key file
        that other users can read is used with a warning logged. A relative
        ``api_key_file`` or ``ca_bundle`` is resolved against ``base_dir`` (default: the
        current directory). Every problem is reported at once.
        """
        return _llm_from_table(
            table, os.environ if env is None else env, prefix="", base_dir=_base(base_dir)
        )

    def to_redacted_dict(self) -> dict[str, Any]:
        """The effective settings as plain data, for display: the key redacted, and the
        endpoint shown by :func:`shown_url` (its user-info and query credentials hidden)."""
        return {**dict(self.__rich_repr__()), "api_key": REDACTED}

    def __rich_repr__(self) -> list[tuple[str, Any]]:
        """The fields, the endpoint shown by :func:`shown_url` (the key is a Secret)."""
        return [
            (name, shown_url(value) if name == "endpoint_url" else value)
            for name, value in ((f, getattr(self, f)) for f in self.__struct_fields__)
        ]

    def __repr__(self) -> str:
        fields = ", ".join(f"{name}={value!r}" for name, value in self.__rich_repr__())
        return f"LLMConfig({fields})"


_LLM_FLAGS: Final = ("allow_insecure_http", "mint_missing_call_ids")
_LLM_KEYS: Final = frozenset(
    {"endpoint_url", "ca_bundle", "provider_name", "api_key", "api_key_env", "api_key_file"}
    | set(_LLM_FLAGS)
    | {s.name for s in LLM_SETTINGS}
)


def _validate_llm(config: LLMConfig, prefix: str = "") -> list[ConfigProblem]:
    values = {f: getattr(config, f) for f in config.__struct_fields__}
    problems = [
        ConfigProblem(prefix + p.key, p.problem)
        for p in check_url(config.endpoint_url, config.allow_insecure_http)
    ]
    if not isinstance(config.api_key, Secret):
        problems.append(
            ConfigProblem(prefix + "api_key", "must be a Secret: wrap it in Secret(...)")
        )
    else:
        _check_key_value(config.api_key.reveal(), prefix + "api_key", problems)
    problems.extend(
        ConfigProblem(prefix + flag, "must be true or false")
        for flag in _LLM_FLAGS
        if not isinstance(values[flag], bool)
    )
    if config.ca_bundle is not None:
        problem = check_ca_bundle(config.ca_bundle)
        if problem:
            problems.append(ConfigProblem(prefix + "ca_bundle", problem))
    problem = check_provider_name(config.provider_name)
    if problem:
        problems.append(ConfigProblem(prefix + "provider_name", problem))
    numeric = check_numbers(LLM_SETTINGS, values, prefix)
    problems.extend(numeric)
    if not numeric:
        if config.connect_timeout_s > config.request_timeout_s:
            problems.append(
                ConfigProblem(
                    prefix + "connect_timeout_s",
                    f"{config.connect_timeout_s!r} is longer than request_timeout_s "
                    f"({config.request_timeout_s!r}), which includes the connect",
                )
            )
        if config.total_timeout_s < config.request_timeout_s:
            problems.append(
                ConfigProblem(
                    prefix + "total_timeout_s",
                    f"{config.total_timeout_s!r} is shorter than one request "
                    f"(request_timeout_s = {config.request_timeout_s!r})",
                )
            )
    return problems


#: How close an unknown key must be to a known one to be suggested (difflib's ratio).
SUGGESTION_CUTOFF: Final = 0.6


#: Keys other clients take in their model table, which this one does not: the complete
#: request URL selects the server and the model, so each gets that answer, not "unknown key".
MODEL_SELECTING_KEYS: Final = frozenset({"model", "provider", "base_url", "api_base"})
#: Where the URL of each known server and gateway route is given.
WORKS_WITH_PAGE: Final = "docs/guide/works-with.md"


def _unknown_key_problem(key: str, known: frozenset[str]) -> str:
    """ "unknown key", with the nearest known key when one is close enough."""
    if key in MODEL_SELECTING_KEYS and "endpoint_url" in known:
        return (
            "not a setting here: endpoint_url selects the model (the complete request URL, "
            "a deployment or gateway route naming it); no model member is ever sent. See "
            f'the routes of each server in {WORKS_WITH_PAGE} ("Works with")'
        )
    close = _nearest(key.replace("-", "_").lower(), known)
    if close is not None:
        return f"unknown key; did you mean `{close}`?"
    return "unknown key (check the spelling)"


def _nearest(word: str, known: Iterable[str]) -> str | None:
    """The known word nearest to ``word`` when one is close enough (the did-you-mean rule of
    every configuration typo: keys here, tool names in an MCP server's tool policy)."""
    close = difflib.get_close_matches(word, sorted(known), n=1, cutoff=SUGGESTION_CUTOFF)
    return close[0] if close else None


def _unknown_keys(
    table: Mapping[str, Any], known: frozenset[str], prefix: str
) -> list[ConfigProblem]:
    return [
        ConfigProblem(prefix + str(k), _unknown_key_problem(str(k), known))
        for k in table
        if k not in known
    ]


def _base(base_dir: str | os.PathLike[str] | None) -> Path | None:
    return None if base_dir is None else Path(base_dir).expanduser().absolute()


def _llm_from_table(
    table: Mapping[str, Any], env: Mapping[str, str], prefix: str, base_dir: Path | None = None
) -> LLMConfig:
    if not isinstance(table, Mapping):
        raise ConfigError([ConfigProblem(prefix.rstrip(".") or "llm", "must be a table")])
    problems = _unknown_keys(table, _LLM_KEYS, prefix)
    if "endpoint_url" not in table:
        problems.append(ConfigProblem(prefix + "endpoint_url", "is required"))
    secret = _resolve_api_key(table, env, problems, prefix, base_dir)
    kwargs = {k: v for k, v in table.items() if k in _LLM_KEYS and not k.startswith("api_key")}
    if isinstance(kwargs.get("ca_bundle"), str) and kwargs["ca_bundle"]:
        kwargs["ca_bundle"] = str(_resolve_path(kwargs["ca_bundle"], base_dir))
    if problems:
        # Report the remaining field problems too, validated with a placeholder.
        kwargs.setdefault("endpoint_url", "https://placeholder.invalid/")
        problems.extend(_field_problems(kwargs, prefix))
        raise ConfigError(problems)
    assert secret is not None  # noqa: S101 - problems would be non-empty otherwise
    try:
        return LLMConfig(api_key=secret, **kwargs)
    except ConfigError as exc:
        raise ConfigError(
            [ConfigProblem(prefix + p.key, p.problem) for p in exc.problems]
        ) from None
    except TypeError as exc:  # a wrong type msgspec would not coerce
        raise ConfigError([ConfigProblem(prefix.rstrip(".") or "llm", str(exc))]) from None


def _field_problems(kwargs: Mapping[str, Any], prefix: str) -> list[ConfigProblem]:
    try:
        LLMConfig(api_key=Secret("placeholder"), **kwargs)
    except ConfigError as exc:
        return [ConfigProblem(prefix + p.key, p.problem) for p in exc.problems]
    return []


class ToolLoopConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The ``[tool_loop]`` table: every bound of a tool-loop session (see TOOL_LOOP_SETTINGS)."""

    max_turns: int = 16
    max_calls_per_turn: int = 8
    max_calls_per_session: int = 64
    max_history_messages: int = 64
    max_history_bytes: int = 512 * KiB
    keep_recent_messages: int = 8
    max_session_s: float = 600.0
    max_observation_bytes: int = 8 * KiB
    max_usage_records: int = 64
    tool_timeout_s: float = 30.0
    summarizer_timeout_s: float = 10.0
    approval_timeout_s: float = 120.0
    max_summary_bytes: int = 4 * KiB
    max_tools: int = 64
    max_description_bytes: int = 1 * KiB
    max_schema_bytes: int = 16 * KiB
    reissue_reused_call_ids: bool = False

    def __post_init__(self) -> None:
        problems = _validate_tool_loop(self)
        if problems:
            raise ConfigError(problems)

    @classmethod
    def from_mapping(cls, table: Mapping[str, Any]) -> ToolLoopConfig:
        """Build from a mapping shaped like the ``[tool_loop]`` table."""
        return _tool_loop_from_table(table, prefix="")

    def to_dict(self) -> dict[str, Any]:
        """The effective settings as plain data."""
        return {f: getattr(self, f) for f in self.__struct_fields__}


#: The ``[tool_loop]`` switches; ``reissue_reused_call_ids`` is off by default because the
#: model is asked for session-unique ids, and a reused one usually means a confused history.
_TOOL_LOOP_FLAGS: Final = ("reissue_reused_call_ids",)
_TOOL_LOOP_KEYS: Final = frozenset(s.name for s in TOOL_LOOP_SETTINGS) | set(_TOOL_LOOP_FLAGS)


def _validate_tool_loop(config: ToolLoopConfig, prefix: str = "") -> list[ConfigProblem]:
    values = config.to_dict()
    problems = [
        ConfigProblem(prefix + flag, "must be true or false")
        for flag in _TOOL_LOOP_FLAGS
        if not isinstance(values[flag], bool)
    ]
    problems.extend(check_numbers(TOOL_LOOP_SETTINGS, values, prefix))
    if not problems:
        if config.max_calls_per_turn > config.max_calls_per_session:
            problems.append(
                ConfigProblem(
                    prefix + "max_calls_per_turn",
                    f"{config.max_calls_per_turn} is above max_calls_per_session "
                    f"({config.max_calls_per_session})",
                )
            )
        if config.keep_recent_messages >= config.max_history_messages:
            problems.append(
                ConfigProblem(
                    prefix + "keep_recent_messages",
                    f"{config.keep_recent_messages} must be below max_history_messages "
                    f"({config.max_history_messages}) so compaction has room to work",
                )
            )
        if config.max_summary_bytes >= config.max_history_bytes:
            problems.append(
                ConfigProblem(
                    prefix + "max_summary_bytes",
                    f"{config.max_summary_bytes} must be below max_history_bytes "
                    f"({config.max_history_bytes})",
                )
            )
    return problems


def _tool_loop_from_table(table: Mapping[str, Any], prefix: str) -> ToolLoopConfig:
    if not isinstance(table, Mapping):
        raise ConfigError([ConfigProblem(prefix.rstrip(".") or "tool_loop", "must be a table")])
    problems = _unknown_keys(table, _TOOL_LOOP_KEYS, prefix)
    kwargs = {k: v for k, v in table.items() if k in _TOOL_LOOP_KEYS}
    try:
        config = ToolLoopConfig(**kwargs)
    except ConfigError as exc:
        problems.extend(ConfigProblem(prefix + p.key, p.problem) for p in exc.problems)
        config = None
    if problems or config is None:
        raise ConfigError(problems)
    return config


class AgentConfig(msgspec.Struct, frozen=True, kw_only=True):
    """A whole configuration file: the ``[llm]`` table, the optional ``[tool_loop]`` table,
    and the optional ``[mcp.servers.NAME]`` tables (``mcp_servers``, in the file's order)."""

    llm: LLMConfig
    tool_loop: ToolLoopConfig = msgspec.field(default_factory=ToolLoopConfig)
    mcp_servers: tuple[McpServerSettings, ...] = ()

    def secrets(self) -> tuple[Secret, ...]:
        """Every credential the configuration holds, for a redactor: the API key, then each
        MCP server's secret ``env`` and ``headers`` entries (bearer tokens), in file order."""
        return (self.llm.api_key, *(s for server in self.mcp_servers for s in server.secrets()))

    @classmethod
    def from_mapping(
        cls,
        document: Mapping[str, Any],
        *,
        env: Mapping[str, str] | None = None,
        base_dir: str | os.PathLike[str] | None = None,
    ) -> AgentConfig:
        """Build from a parsed TOML document; every problem in every table is reported.

        A relative ``api_key_file``, ``ca_bundle``, or MCP server ``cwd``, secret ``file`` or
        ``./command`` is resolved against ``base_dir`` (default: the current directory;
        :meth:`from_toml` passes the file's folder).
        """
        problems = _unknown_keys(document, frozenset({"llm", "tool_loop", "mcp"}), "")
        llm: LLMConfig | None = None
        tool_loop: ToolLoopConfig | None = ToolLoopConfig()
        if "llm" not in document:
            problems.append(ConfigProblem("llm", "the [llm] table is required"))
        else:
            try:
                llm = _llm_from_table(
                    document["llm"],
                    os.environ if env is None else env,
                    prefix="llm.",
                    base_dir=_base(base_dir),
                )
            except ConfigError as exc:
                problems.extend(exc.problems)
        if "tool_loop" in document:
            try:
                tool_loop = _tool_loop_from_table(document["tool_loop"], prefix="tool_loop.")
            except ConfigError as exc:
                problems.extend(exc.problems)
                tool_loop = None
        servers: tuple[McpServerSettings, ...] = ()
        if "mcp" in document:
            servers, found = parse_mcp_table(
                document["mcp"],
                env=os.environ if env is None else env,
                base_dir=_base(base_dir),
                unknown=_unknown_key_problem,
            )
            problems.extend(found)
        if problems or llm is None or tool_loop is None:
            raise ConfigError(problems)
        return cls(llm=llm, tool_loop=tool_loop, mcp_servers=servers)

    def with_mcp_json(
        self,
        text: str | bytes,
        *,
        source: str = "<mcp config>",
        env: Mapping[str, str] | None = None,
        base_dir: str | os.PathLike[str] | None = None,
    ) -> AgentConfig:
        """This configuration with the servers of an ``mcpServers`` JSON document added (the
        form Claude Desktop and VS Code's ``mcp.json`` write), mapped to the
        ``[mcp.servers.NAME]`` fields. What cannot be honoured (SSE, ``envFile``, input
        prompts, a credential written in the file) is a problem naming the reason; a name
        already configured is one too."""
        try:
            document = json.loads(text)
        except (ValueError, RecursionError) as exc:
            raise ConfigError([ConfigProblem(source, f"is not valid JSON: {exc}")]) from None
        servers, problems = servers_from_json(
            document,
            env=os.environ if env is None else env,
            base_dir=_base(base_dir),
            unknown=_unknown_key_problem,
        )
        taken = {server.name for server in self.mcp_servers}
        problems += [
            ConfigProblem(f"mcpServers.{s.name}", "is also a [mcp.servers] table of the config")
            for s in servers
            if s.name in taken
        ]
        if problems:
            raise ConfigError([ConfigProblem(f"{source}: {p.key}", p.problem) for p in problems])
        return msgspec.structs.replace(self, mcp_servers=(*self.mcp_servers, *servers))

    @classmethod
    def from_toml(
        cls, path: str | os.PathLike[str], *, env: Mapping[str, str] | None = None
    ) -> AgentConfig:
        """Read and validate a TOML configuration file.

        A relative ``api_key_file`` or ``ca_bundle`` in it is resolved against the file's
        folder, not the current directory.
        """
        try:
            data = read_regular(path, MAX_CONFIG_FILE_BYTES).data
        except OSError as exc:
            raise ConfigError([ConfigProblem(str(path), f"cannot read: {exc.strerror}")]) from None
        if len(data) > MAX_CONFIG_FILE_BYTES:
            raise ConfigError(
                [ConfigProblem(str(path), f"is larger than {MAX_CONFIG_FILE_BYTES} bytes")]
            )
        return cls.from_toml_text(
            data, source=str(path), env=env, base_dir=Path(path).absolute().parent
        )

    @classmethod
    def from_toml_text(
        cls,
        text: str | bytes,
        *,
        source: str = "<config>",
        env: Mapping[str, str] | None = None,
        base_dir: str | os.PathLike[str] | None = None,
    ) -> AgentConfig:
        """Parse and validate TOML text (relative paths in it resolved against ``base_dir``)."""
        try:
            raw = text.decode("utf-8") if isinstance(text, bytes) else text
            document = tomllib.loads(raw)
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
            raise ConfigError([ConfigProblem(source, f"is not valid TOML: {exc}")]) from None
        return cls.from_mapping(document, env=env, base_dir=base_dir)


_public.claim(globals())
