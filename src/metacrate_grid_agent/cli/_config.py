"""The configuration a command runs with: a ``--config`` file, or ``--endpoint`` and its key.

A configuration file is read once (a regular file only, bounded, through
:func:`metacrate_grid_agent.safety.read_regular`) and parsed once; that one document gives
both the secrets to scrub, learnt before validation so that an invalid file's key is hidden
too, and the validated :class:`AgentConfig`, which says which secrets it holds
(:meth:`AgentConfig.secrets`). They reach the command's :class:`Redactor` in one place
(``_hidden``), when loading ends, before anything can be printed. The configuration's
warnings (a key file other users can read) are shown as the command's own warning lines.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import re
import tomllib
from collections.abc import Iterator, Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any, Final

from metacrate_grid_agent import AgentConfig, LLMConfig, Secret
from metacrate_grid_agent.cli import _output as output
from metacrate_grid_agent.cli._common import UsageError
from metacrate_grid_agent.cli._output import Console, Redactor
from metacrate_grid_agent.config import MAX_CONFIG_FILE_BYTES
from metacrate_grid_agent.errors import ConfigError, ConfigProblem
from metacrate_grid_agent.safety import read_regular

__all__ = [
    "SCRIPTED_LLM",
    "agent_config",
    "config_warnings",
    "hide_secrets",
    "load_agent_config",
    "show_config_warnings",
]

#: The library's logger for warnings about a configuration that loaded (a shared key file).
CONFIG_LOGGER_NAME: Final = "metacrate_grid_agent.config"
#: Why --endpoint refuses cleartext http to a non-loopback host, and the switch that allows it.
INSECURE_ENDPOINT: Final = (
    "cleartext http to a non-loopback host would send the key over the network unencrypted; "
    "use https, or pass --allow-insecure-http"
)
#: The [llm] table of a scripted model: a loopback placeholder (the scripted endpoint's address
#: replaces it when it starts) and a dummy key, never sent; it is registered as a secret like
#: any configured key, so it shares no beginning or slice with words the command prints.
SCRIPTED_LLM: Final[Mapping[str, Any]] = MappingProxyType(
    {
        "endpoint_url": "http://127.0.0.1/v1/chat/completions",
        "api_key": Secret("~~~~no-key~~~~"),
    }
)
_ENV_NAME: Final = re.compile(r"\A[A-Za-z_][A-Za-z0-9_]{0,127}\Z", re.ASCII)


def show_config_warnings(console: Console, command: str, *, verbose: bool) -> None:
    """Print the configuration's warnings as the command's own lines (with --verbose, the
    log handler prints them already)."""
    logger = logging.getLogger(CONFIG_LOGGER_NAME)
    for old in [h for h in logger.handlers if isinstance(h, _WarningLines)]:
        logger.removeHandler(old)
    if not verbose:
        logger.addHandler(_WarningLines(console, command))


class _WarningLines(logging.Handler):
    """Writes each warning record as ``grid-agent COMMAND: warning: ...`` on stderr."""

    def __init__(self, console: Console, command: str) -> None:
        super().__init__(logging.WARNING)
        self._console = console
        self._command = command

    def emit(self, record: logging.LogRecord) -> None:
        """Write the record's message as a warning line."""
        message = output.printable(record.getMessage())
        self._console.err(f"grid-agent {self._command}: warning: {message}")


class _Collected(logging.Handler):
    """Keeps each warning record's message (for check-config's JSON)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        """Keep the record's message."""
        self.messages.append(record.getMessage())


@contextlib.contextmanager
def config_warnings() -> Iterator[list[str]]:
    """The configuration's warnings given while the block runs."""
    collected = _Collected()
    logger = logging.getLogger(CONFIG_LOGGER_NAME)
    logger.addHandler(collected)
    try:
        yield collected.messages
    finally:
        logger.removeHandler(collected)


def read_config_document(path: str) -> dict[str, Any]:
    """The TOML document of the configuration file at ``path``, read and parsed once.

    Read as the library reads it (a regular file only, at most
    :data:`~metacrate_grid_agent.config.MAX_CONFIG_FILE_BYTES`); a file that cannot be read
    or parsed is reported in the words of :meth:`AgentConfig.from_toml`.
    """
    try:
        data = read_regular(path, MAX_CONFIG_FILE_BYTES).data
    except OSError as exc:
        raise ConfigError([ConfigProblem(path, f"cannot read: {exc.strerror}")]) from None
    if len(data) > MAX_CONFIG_FILE_BYTES:
        raise ConfigError([ConfigProblem(path, f"is larger than {MAX_CONFIG_FILE_BYTES} bytes")])
    try:
        return tomllib.loads(data.decode("utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError([ConfigProblem(path, f"is not valid TOML: {exc}")]) from None


def _config_secrets(document: Mapping[str, Any]) -> list[str]:
    """The key a configuration document names (inline or through the environment).

    Taken before validation: an invalid file may still hold a key worth hiding.
    """
    llm = document.get("llm")
    if not isinstance(llm, dict):
        return []
    found = _mcp_secrets(document.get("mcp"))
    if isinstance(llm.get("api_key"), str):
        found.append(llm["api_key"])
    if isinstance(llm.get("api_key_env"), str):
        found.append(os.environ.get(llm["api_key_env"], ""))
    return found


def _mcp_secrets(mcp: object) -> list[str]:
    """The values of the MCP servers' ``{ env = "NAME" }`` entries (a credential written in
    the file is refused by a problem that never quotes it)."""
    servers = mcp.get("servers") if isinstance(mcp, dict) else None
    found: list[str] = []
    for table in servers.values() if isinstance(servers, dict) else ():
        for part in ("env", "headers"):
            values = table.get(part) if isinstance(table, dict) else None
            found.extend(
                os.environ.get(value["env"], "")
                for value in (values.values() if isinstance(values, dict) else ())
                if isinstance(value, dict) and isinstance(value.get("env"), str)
            )
    return found


@contextlib.contextmanager
def _hidden(redactor: Redactor) -> Iterator[list[str | Secret | None]]:
    """The one place a configuration's secrets reach the command's redactor.

    The loaders below add what a document names (learnt before validation, so that an
    invalid file's key is hidden too), then what the loaded configuration says it holds
    (:meth:`AgentConfig.secrets`); all of it is registered when loading ends, however it
    ends, so before any line about it can be printed.
    """
    found: list[str | Secret | None] = []
    try:
        yield found
    finally:
        redactor.hide(found)


def hide_secrets(redactor: Redactor, secrets: list[str]) -> None:
    """Register secrets a command learnt outside a configuration (the takeover command's
    database URL and its password) with its redactor, through the same one place."""
    with _hidden(redactor) as found:
        found.extend(secrets)


def load_agent_config(
    path: str | None,
    redactor: Redactor,
    *,
    mcp_config: str | None = None,
    base: AgentConfig | None = None,
    llm_unused: bool = False,
) -> AgentConfig:
    """The configuration file at ``path`` (``base`` without one), with the servers of
    ``--mcp-config FILE`` added; its secrets registered with ``redactor`` (one read and one
    parse of each file give both). ``llm_unused``: the command sends no request, so a file
    without an ``[llm]`` table is read as if it had :data:`SCRIPTED_LLM`'s."""
    with _hidden(redactor) as found:
        config = (
            base
            if path is None
            else _load_file(path, found, llm=SCRIPTED_LLM if llm_unused else None, keep=True)
        )
        if config is None:
            raise UsageError("name a configuration file")
        found.extend(config.secrets())  # hidden even if --mcp-config is refused
        config = _with_mcp_config(config, mcp_config)
        found.extend(config.secrets())  # and the servers it added (each secret kept once)
        return config


def _load_file(
    path: str,
    found: list[str | Secret | None],
    *,
    llm: Mapping[str, Any] | None = None,
    keep: bool = False,
) -> AgentConfig:
    """The configuration file at ``path``; the secrets its document names go to ``found``
    before it is validated. ``llm``, when given, replaces the file's ``[llm]`` table, unread
    (a scripted model needs no endpoint and no key); with ``keep``, only stands in for a
    table the file does not have."""
    document = read_config_document(path)
    if llm is not None and not (keep and "llm" in document):
        document = {**document, "llm": dict(llm)}
    found.extend(_config_secrets(document))
    return AgentConfig.from_mapping(document, base_dir=Path(path).absolute().parent)


def _with_mcp_config(config: AgentConfig, path: str | None) -> AgentConfig:
    """``config`` with the servers of ``--mcp-config FILE`` (an ``mcpServers`` JSON file);
    ``config`` itself without the option."""
    if path is None:
        return config
    try:
        data = read_regular(path, MAX_CONFIG_FILE_BYTES).data
    except OSError as exc:
        raise ConfigError([ConfigProblem(path, f"cannot read: {exc.strerror}")]) from None
    if len(data) > MAX_CONFIG_FILE_BYTES:
        raise ConfigError([ConfigProblem(path, f"is larger than {MAX_CONFIG_FILE_BYTES} bytes")])
    return config.with_mcp_json(data, source=path, base_dir=Path(path).absolute().parent)


def agent_config(args: argparse.Namespace, redactor: Redactor) -> AgentConfig | None:
    """The configuration named by --config or by --endpoint and --api-key-env (or None),
    with the servers of --mcp-config added; its secrets registered with ``redactor``."""
    with _hidden(redactor) as found:
        if getattr(args, "model_script", None) is not None:
            config: AgentConfig | None = _scripted_config(args, found)
        else:
            config = _agent_config(args, found)
        mcp_config = getattr(args, "mcp_config", None)
        if mcp_config is not None and config is None:
            raise UsageError(
                "--mcp-config goes with --config or --endpoint: the built-in scripted model "
                "knows only the sandbox's tools"
            )
        if config is None:
            return None
        found.extend(config.secrets())  # hidden even if --mcp-config is refused
        config = _with_mcp_config(config, mcp_config)
        found.extend(config.secrets())  # and the servers it added (each secret kept once)
        return config


def _scripted_config(args: argparse.Namespace, found: list[str | Secret | None]) -> AgentConfig:
    """The configuration of ``run --model-script``: --config's, its [llm] table replaced by
    :data:`SCRIPTED_LLM` (the scripted endpoint's own address is set when it starts)."""
    if args.endpoint is not None or args.api_key_env is not None or args.allow_insecure_http:
        raise UsageError(
            "--model-script plays the model itself: it goes without --endpoint, "
            "--api-key-env and --allow-insecure-http"
        )
    if args.config is None:
        return AgentConfig(llm=LLMConfig.from_mapping(SCRIPTED_LLM))
    return _load_file(args.config, found, llm=SCRIPTED_LLM)


def _agent_config(args: argparse.Namespace, found: list[str | Secret | None]) -> AgentConfig | None:
    if args.config is not None:
        if args.api_key_env is not None or args.allow_insecure_http:
            raise UsageError(
                "--api-key-env and --allow-insecure-http go with --endpoint; a --config file "
                "names its own key and settings"
            )
        return _load_file(args.config, found)
    if args.endpoint is None:
        if args.api_key_env is not None or args.allow_insecure_http:
            raise UsageError("--api-key-env and --allow-insecure-http go with --endpoint URL")
        return None
    return AgentConfig(llm=_endpoint_llm_config(args, found))


def _endpoint_llm_config(args: argparse.Namespace, found: list[str | Secret | None]) -> LLMConfig:
    """The [llm] settings of --endpoint URL --api-key-env NAME (defaults for the rest)."""
    if not args.api_key_env:
        raise UsageError(
            "--endpoint needs --api-key-env NAME (the environment variable holding the key; "
            "the key itself is never taken on the command line)"
        )
    if _ENV_NAME.match(args.api_key_env) is None:
        # Not echoed: a key pasted here by mistake must not be printed back.
        raise UsageError(
            "--api-key-env takes the NAME of an environment variable (letters, digits and "
            "underscores), not the key itself"
        )
    found.append(os.environ.get(args.api_key_env))  # hidden even if the URL is refused
    table: dict[str, Any] = {"endpoint_url": args.endpoint, "api_key_env": args.api_key_env}
    if args.allow_insecure_http:
        table["allow_insecure_http"] = True
    try:
        return LLMConfig.from_mapping(table)
    except ConfigError as exc:
        raise _in_flag_words(exc, table) from None


def _in_flag_words(error: ConfigError, table: Mapping[str, Any]) -> ConfigError:
    """``error`` with each problem that ``--allow-insecure-http`` would lift worded for the
    command line: the operator has that flag, not the file's ``allow_insecure_http`` key."""
    if table.get("allow_insecure_http"):
        return error
    try:
        LLMConfig.from_mapping({**table, "allow_insecure_http": True})
    except ConfigError as allowed:
        lifted = [p for p in error.problems if p not in allowed.problems]
    else:
        lifted = list(error.problems)
    return ConfigError(
        [
            ConfigProblem("--endpoint", INSECURE_ENDPOINT) if p in lifted else p
            for p in error.problems
        ]
    )
