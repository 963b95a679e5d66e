"""What each setting may be: the numeric settings tables, and the checks of one value.

Every numeric setting is a :class:`Setting` row (default, minimum, hard ceiling, unit and the
reason) of :data:`LLM_SETTINGS` or :data:`TOOL_LOOP_SETTINGS`; the guide's configuration
reference is checked against these rows. The checks here each look at one value (a number
against its row, the endpoint URL, the CA bundle) and return what is wrong with it;
``config.py`` builds the structs, reads the sources (mappings, the environment, files, TOML)
and checks what involves several values at once. The public names are importable from
:mod:`metacrate_grid_agent.config`.
"""

from __future__ import annotations

import ipaddress
import math
import re
import ssl
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from metacrate_grid_agent.errors import ConfigProblem

__all__ = [
    "LLM_SETTINGS",
    "MAX_URL_LENGTH",
    "TOOL_LOOP_SETTINGS",
    "KiB",
    "MiB",
    "Setting",
    "check_ca_bundle",
    "check_numbers",
    "check_provider_name",
    "check_url",
    "parse_url",
]

KiB: Final = 1024
MiB: Final = 1024 * KiB

#: Longest endpoint URL accepted.
MAX_URL_LENGTH: Final = 2048


@dataclass(frozen=True, slots=True)
class Setting:
    """A numeric setting: its default, its lower bound, its hard ceiling, and why."""

    name: str
    kind: type[int] | type[float]
    default: float
    minimum: float
    ceiling: float
    unit: str
    reason: str


def _s(  # noqa: PLR0917 - positional, so the settings table below reads as a table
    name: str, kind: type[int] | type[float], default: float, minimum: float, ceiling: float,
    unit: str, reason: str,
) -> Setting:  # fmt: skip
    return Setting(name, kind, default, minimum, ceiling, unit, reason)


#: The numeric ``[llm]`` settings: default, minimum, hard ceiling, and the reason for each.
LLM_SETTINGS: Final[tuple[Setting, ...]] = (
    _s("connect_timeout_s", float, 10.0, 0.001, 120.0, "s",
       "TCP and TLS set-up; a healthy endpoint connects in well under a second"),
    _s("request_timeout_s", float, 120.0, 0.001, 1800.0, "s",
       "one whole attempt, body included; large models can take minutes to answer"),
    _s("response_idle_timeout_s", float, 60.0, 0.001, 600.0, "s",
       "longest silence of the response once the request is written (time to first byte)"),
    _s("pool_idle_timeout_s", float, 30.0, 0.001, 600.0, "s",
       "an idle kept-alive connection is reused only this long; servers drop them near 60 s"),
    _s("total_timeout_s", float, 300.0, 0.001, 3600.0, "s",
       "everything for one call: concurrency wait, all attempts and all retry delays"),
    _s("max_prompt_bytes", int, 4 * MiB, 1, 64 * MiB, "bytes",
       "serialised request body; images travel as data: URLs and make prompts large"),
    _s("max_response_bytes", int, 4 * MiB, 1, 64 * MiB, "bytes",
       "response body bytes read; a completion is rarely above a few hundred KiB"),
    _s("max_concurrent_requests", int, 4, 1, 64, "requests",
       "requests in flight per client; an agent acts one step at a time"),
    _s("max_retries", int, 2, 0, 10, "retries",
       "retries after the first attempt, for transient failures only"),
    _s("max_retry_delay_s", float, 30.0, 0.001, 300.0, "s",
       "ceiling of one retry delay, Retry-After included"),
    _s("max_text_bytes", int, 256 * KiB, 1, 4 * MiB, "bytes",
       "text of one reply (UTF-8)"),
    _s("max_tool_calls", int, 32, 0, 256, "calls",
       "tool calls in one reply"),
    _s("max_argument_bytes", int, 64 * KiB, 2, 1 * MiB, "bytes",
       "arguments string of one tool call"),
    _s("max_id_length", int, 256, 1, 1024, "characters",
       "tool-call id; providers use 9 to about 40 characters"),
    _s("max_name_length", int, 64, 1, 256, "characters",
       "tool name in a reply; the standard allows 64"),
)  # fmt: skip

#: The numeric ``[tool_loop]`` settings: default, minimum, hard ceiling, and the reason for each.
TOOL_LOOP_SETTINGS: Final[tuple[Setting, ...]] = (
    _s("max_turns", int, 16, 1, 256, "turns",
       "model requests per session; an agent that needs more should be given a smaller goal"),
    _s("max_calls_per_turn", int, 8, 1, 64, "calls",
       "tool calls run from one reply"),
    _s("max_calls_per_session", int, 64, 1, 1024, "calls",
       "tool calls run in one session"),
    _s("max_history_messages", int, 64, 4, 1024, "messages",
       "messages sent in one request, after compaction"),
    _s("max_history_bytes", int, 512 * KiB, 1 * KiB, 32 * MiB, "bytes",
       "serialised messages sent in one request, after compaction"),
    _s("keep_recent_messages", int, 8, 1, 256, "messages",
       "the recent tail that compaction always keeps verbatim"),
    _s("max_session_s", float, 600.0, 0.001, 86400.0, "s",
       "wall-clock time of one session"),
    _s("max_observation_bytes", int, 8 * KiB, 64, 256 * KiB, "bytes",
       "one tool observation sent back to the model; longer ones are cut with a marker"),
    _s("max_usage_records", int, 64, 1, 4096, "records",
       "per-request usage records kept; running totals stay exact beyond it"),
    _s("tool_timeout_s", float, 30.0, 0.001, 600.0, "s",
       "default execution timeout of one tool call"),
    _s("summarizer_timeout_s", float, 10.0, 0.001, 120.0, "s",
       "one history summarisation; on expiry a truncation marker is used"),
    _s("approval_timeout_s", float, 120.0, 0.001, 3600.0, "s",
       "an operator's answer on one call (with an approver); no answer counts as denied"),
    _s("max_summary_bytes", int, 4 * KiB, 64, 256 * KiB, "bytes",
       "one summary; a larger one is replaced by the truncation marker"),
    _s("max_tools", int, 64, 1, 256, "tools",
       "registered tools"),
    _s("max_description_bytes", int, 1 * KiB, 1, 16 * KiB, "bytes",
       "description of one tool"),
    _s("max_schema_bytes", int, 16 * KiB, 2, 256 * KiB, "bytes",
       "serialised parameters schema of one tool"),
)  # fmt: skip


def _check_number(setting: Setting, value: object, problems: list[ConfigProblem]) -> None:
    key = setting.name
    if isinstance(value, bool) or not isinstance(value, int | float):
        kind = "an integer" if setting.kind is int else "a number"
        problems.append(ConfigProblem(key, f"must be {kind}, got {value!r}"))
        return
    if setting.kind is int and not isinstance(value, int):
        problems.append(ConfigProblem(key, f"must be an integer, got {value!r}"))
        return
    if isinstance(value, float) and not math.isfinite(value):
        problems.append(ConfigProblem(key, f"must be finite, got {value!r}"))
    elif value < setting.minimum:
        problems.append(
            ConfigProblem(key, f"{value!r} is below the minimum {setting.minimum!r} {setting.unit}")
        )
    elif value > setting.ceiling:
        problems.append(
            ConfigProblem(
                key, f"{value!r} is above the hard ceiling {setting.ceiling!r} {setting.unit}"
            )
        )


def check_numbers(
    settings: tuple[Setting, ...], values: Mapping[str, Any], prefix: str
) -> list[ConfigProblem]:
    """The problems of each setting's value in ``values`` against its row, keys prefixed."""
    problems: list[ConfigProblem] = []
    for setting in settings:
        _check_number(setting, values[setting.name], problems)
    return [ConfigProblem(prefix + p.key, p.problem) for p in problems]


def _is_loopback(host: str) -> bool:
    # Only "localhost" itself and loopback literals: other *.localhost names go to the
    # system resolver, which does not have to keep them on loopback.
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _host_encodes(host: str) -> bool:
    """Whether the HTTP client can put ``host`` on the wire (IDNA, label lengths)."""
    try:
        ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        try:
            host.encode("idna")
        except UnicodeError:
            return False
    return True


#: The default port of each scheme the client speaks.
DEFAULT_PORTS: Final = {"http": 80, "https": 443}
# Every printable ASCII character: kept as written in a request-target (only other
# characters are percent-encoded, as UTF-8).
_TARGET_SAFE: Final = "".join(map(chr, range(0x21, 0x7F)))


@dataclass(frozen=True, slots=True)
class URLParts:
    """A URL read once (:func:`parse_url`): what the client, the checks and the display need.

    ``host`` is lower-cased, without brackets (``None`` when the URL has none); ``port`` is
    the explicit port or the scheme's default (``None`` for another scheme); ``target`` is
    the request-target exactly as written (path, ``/`` when empty, then ``?`` and the query),
    only non-ASCII characters percent-encoded; ``authority`` is the ``Host`` header's value.
    """

    scheme: str
    host: str | None
    port: int | None
    explicit_port: bool
    target: str
    authority: str
    has_userinfo: bool
    has_fragment: bool


def parse_url(url: str) -> URLParts:
    """``url`` read once; ValueError (whose text may quote the URL: never show it) when its
    port is not a number or out of range, or its host does not parse."""
    parts = urllib.parse.urlsplit(url)
    port = parts.port  # raises for a port that is not a number
    scheme = parts.scheme
    host = parts.hostname
    default = DEFAULT_PORTS.get(scheme)
    before_fragment = url.partition("#")[0]
    target = (parts.path or "/") + ("?" + parts.query if "?" in before_fragment else "")
    if not target.isascii():
        target = urllib.parse.quote(target, safe=_TARGET_SAFE)
    authority = ""
    if host:
        shown = f"[{host}]" if ":" in host else _ascii_host(host)
        authority = shown if port is None or port == default else f"{shown}:{port}"
    return URLParts(
        scheme=scheme,
        host=host,
        port=default if port is None else port,
        explicit_port=port is not None,
        target=target,
        authority=authority,
        has_userinfo="@" in parts.netloc,
        has_fragment=bool(parts.fragment) or url.endswith("#"),
    )


def _ascii_host(host: str) -> str:
    try:
        return host.encode("idna").decode("ascii") if not host.isascii() else host
    except UnicodeError:
        return host  # refused by check_url before any client is built


def _unparsed_url(reason: str) -> str:
    """Why a URL does not parse, from urlsplit's reason, quoting nothing of the URL."""
    if reason.startswith("Port out of range"):
        cause = "its port is not between 0 and 65535"
    elif reason.startswith("Port"):
        cause = (
            "what follows the host's ':' is not a port number (a credential belongs in "
            "api_key, never in the URL)"
        )
    elif "IPv6" in reason:
        cause = "an IPv6 host must be written whole in brackets"
    else:
        cause = "its host cannot be read"
    return f"is not a valid URL: {cause}; it is not quoted here, as it may hold a credential"


def check_url(url: object, allow_insecure_http: object) -> list[ConfigProblem]:
    """The problems of ``url`` as the endpoint, all at once; none quotes the URL's host,
    path or query (a credential may hide in them)."""
    key = "endpoint_url"
    if not isinstance(url, str) or not url:
        return [ConfigProblem(key, "must be a non-empty string: the complete request URL")]
    if len(url) > MAX_URL_LENGTH:
        return [ConfigProblem(key, f"is {len(url)} characters; the limit is {MAX_URL_LENGTH}")]
    if any(ord(c) <= 0x20 or ord(c) == 0x7F for c in url):
        return [ConfigProblem(key, "must not contain spaces or control characters")]
    try:
        parts = parse_url(url)
    except ValueError as exc:  # its text quotes the URL's parts: never shown
        return [ConfigProblem(key, _unparsed_url(str(exc)))]
    problems: list[ConfigProblem] = []
    if parts.scheme not in DEFAULT_PORTS:
        problems.append(ConfigProblem(key, f"scheme must be http or https, got {parts.scheme!r}"))
    if not parts.host:
        problems.append(ConfigProblem(key, "has no host"))
    elif not _host_encodes(parts.host):
        problems.append(ConfigProblem(key, "the host is not a valid DNS name or IP address"))
    if parts.has_userinfo:
        problems.append(
            ConfigProblem(key, "must not carry user-info; put the credential in api_key")
        )
    if parts.has_fragment:
        problems.append(ConfigProblem(key, "must not have a fragment"))
    if parts.explicit_port and parts.port == 0:
        problems.append(ConfigProblem(key, "port 0 is not a valid port"))
    if (
        parts.scheme == "http"
        and parts.host
        and not _is_loopback(parts.host)
        and allow_insecure_http is not True
    ):
        problems.append(
            ConfigProblem(
                key,
                "cleartext http to a non-loopback host would send the key over the network "
                "unencrypted; use https, or set allow_insecure_http = true",
            )
        )
    return problems


#: ``[llm] provider_name``: the conventions' form of ``gen_ai.provider.name`` (``openai``,
#: ``aws.bedrock``, ``mistral_ai``): lowercase ASCII words joined by dots, at most 64 characters.
PROVIDER_NAME: Final = re.compile(r"\A(?=.{1,64}\Z)[a-z0-9][a-z0-9_-]*(?:\.[a-z0-9][a-z0-9_-]*)*\Z")


def check_provider_name(value: object) -> str | None:
    """A problem with ``provider_name``, or None (checked before it becomes an attribute)."""
    if isinstance(value, str) and PROVIDER_NAME.match(value):
        return None
    return (
        "must be a provider name as the GenAI conventions write it: lowercase letters, "
        "digits, '_' and '-', words joined by dots, at most 64 characters (e.g. openai, "
        "aws.bedrock, mistral_ai)"
    )


def check_ca_bundle(path: object) -> str | None:
    """A problem with the CA bundle, or None: it must load as PEM certificates."""
    if not isinstance(path, str) or not Path(path).is_file():
        return f"{path!r} is not a readable file"
    try:
        context = ssl.create_default_context(cafile=path)
    except (ssl.SSLError, OSError, ValueError) as exc:
        return f"{path!r} does not load as PEM CA certificates ({type(exc).__name__})"
    if not context.get_ca_certs():
        return f"{path!r} holds no CA certificate"
    return None
