"""Configuration: every value validated, every problem reported at once, the key never shown.

Numeric settings are checked table-wise from ``LLM_SETTINGS`` and ``TOOL_LOOP_SETTINGS``
(so a setting added to a table is tested without touching this file), and the tables are
checked against the struct defaults so that the documented defaults cannot drift from the
real ones. The endpoint URL, the three key sources and TOML files have their own tables.
"""

from __future__ import annotations

import ast
import math
import pickle
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec
import pytest
import trustme

from metacrate_grid_agent import LLMClient
from metacrate_grid_agent import config as config_module
from metacrate_grid_agent.config import (
    LLM_SETTINGS,
    TOOL_LOOP_SETTINGS,
    AgentConfig,
    LLMConfig,
    Secret,
    Setting,
    ToolLoopConfig,
    shown_url,
)
from metacrate_grid_agent.errors import ConfigError, ConfigProblem
from tests.llm_transport.support import CANARY_KEY

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

URL = "https://llm.example.com/v1/chat/completions"
REDACTED = "[REDACTED]"


def llm(**fields: Any) -> LLMConfig:
    """An LLMConfig with a valid URL and key unless given."""
    fields.setdefault("endpoint_url", URL)
    fields.setdefault("api_key", Secret(CANARY_KEY))
    return LLMConfig(**fields)


def problems(build: Callable[[], object]) -> tuple[ConfigProblem, ...]:
    """The problems of the ConfigError that `build` must raise."""
    with pytest.raises(ConfigError) as caught:
        build()
    assert caught.value.kind == "configuration"
    return caught.value.problems


def keys(build: Callable[[], object]) -> list[str]:
    """The sorted key paths of the problems `build` raises."""
    return sorted(p.key for p in problems(build))


def settings(table: str) -> list[Any]:
    """Parameters for every numeric setting of a table, with ids like llm.max_retries."""
    chosen = LLM_SETTINGS if table == "llm" else TOOL_LOOP_SETTINGS
    return [pytest.param(table, s, id=f"{table}.{s.name}") for s in chosen]


ALL_SETTINGS = settings("llm") + settings("tool_loop")


def build(table: str, values: Mapping[str, Any]) -> Callable[[], object]:
    """A builder of the table's struct with these values (a valid URL and key for [llm])."""
    if table == "llm":
        return lambda: llm(**values)
    return lambda: ToolLoopConfig(**values)


# --- numeric settings -------------------------------------------------------------------------


def over(setting: Setting) -> float:
    """A value just above the ceiling (an int for integer settings)."""
    return int(setting.ceiling) + 1 if setting.kind is int else setting.ceiling * 2


def under(setting: Setting) -> float:
    """A value just below the minimum (an int for integer settings)."""
    return int(setting.minimum) - 1 if setting.kind is int else setting.minimum / 2


@pytest.mark.parametrize(("table", "setting"), ALL_SETTINGS)
def test_a_value_over_the_ceiling_is_rejected_naming_key_and_ceiling(
    table: str, setting: Setting
) -> None:
    """Above its hard ceiling a setting is one problem, naming the key and the ceiling."""
    [problem] = problems(build(table, {setting.name: over(setting)}))
    assert problem.key == setting.name
    assert "ceiling" in problem.problem
    assert repr(setting.ceiling) in problem.problem


@pytest.mark.parametrize(("table", "setting"), ALL_SETTINGS)
def test_a_value_below_the_minimum_is_rejected_naming_key_and_minimum(
    table: str, setting: Setting
) -> None:
    """Below its minimum a setting is one problem, naming the key and the minimum."""
    [problem] = problems(build(table, {setting.name: under(setting)}))
    assert problem.key == setting.name
    assert "minimum" in problem.problem
    assert repr(setting.minimum) in problem.problem


WRONG_TYPES = [
    pytest.param("10", id="string"),
    pytest.param(True, id="bool"),
    pytest.param(None, id="none"),
    pytest.param([1], id="list"),
]


@pytest.mark.parametrize("value", WRONG_TYPES)
@pytest.mark.parametrize(("table", "setting"), ALL_SETTINGS)
def test_a_value_of_the_wrong_type_is_rejected_naming_the_key(
    table: str, setting: Setting, value: object
) -> None:
    """Strings, booleans, None and lists are refused for every numeric setting, by key."""
    [problem] = problems(build(table, {setting.name: value}))
    assert problem.key == setting.name
    assert problem.problem.startswith("must be")


INT_SETTINGS = [p for p in ALL_SETTINGS if p.values[1].kind is int]
FLOAT_SETTINGS = [p for p in ALL_SETTINGS if p.values[1].kind is float]


@pytest.mark.parametrize(("table", "setting"), INT_SETTINGS)
def test_a_fraction_is_rejected_for_an_integer_setting(table: str, setting: Setting) -> None:
    """Counts and sizes are integers: 2.5 is refused, naming the key."""
    [problem] = problems(build(table, {setting.name: 2.5}))
    assert (problem.key, problem.problem) == (setting.name, "must be an integer, got 2.5")


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf], ids=["nan", "inf", "-inf"])
@pytest.mark.parametrize(("table", "setting"), FLOAT_SETTINGS)
def test_a_non_finite_number_is_rejected(table: str, setting: Setting, value: float) -> None:
    """NaN and infinities are refused for every float setting (a NaN timeout never expires)."""
    [problem] = problems(build(table, {setting.name: value}))
    assert problem.key == setting.name
    assert "finite" in problem.problem


@pytest.mark.parametrize("name", ["max_retries", "connect_timeout_s"])
def test_a_number_too_large_for_a_float_is_a_config_error(tmp_path: Path, name: str) -> None:
    """An integer beyond float range (tomllib reads one) is a problem under its key, not a crash."""
    path = toml(tmp_path, f'[llm]\nendpoint_url = "{URL}"\napi_key = "k"\n{name} = {"9" * 400}\n')
    assert keys(lambda: AgentConfig.from_toml(path, env={})) == [f"llm.{name}"]


def consistent_llm(name: str, value: float) -> dict[str, Any]:
    """`name` set to `value`, with the other timeouts chosen so they do not contradict it."""
    connect = value if name == "connect_timeout_s" else 0.001
    total = value if name == "total_timeout_s" else 3600.0
    request = value if name == "request_timeout_s" else min(max(connect, 1.0), total)
    timeouts = {
        "connect_timeout_s": connect,
        "request_timeout_s": request,
        "total_timeout_s": total,
    }
    return {**timeouts, name: value}


def consistent_tool_loop(name: str, value: float) -> dict[str, Any]:
    """`name` set to `value`, with the related bounds chosen so they do not contradict it."""
    related = {
        "max_calls_per_turn": 1,
        "max_calls_per_session": 1024,
        "keep_recent_messages": 1,
        "max_history_messages": 1024,
        "max_summary_bytes": 64,
        "max_history_bytes": 32 * 1024 * 1024,
    }
    return {**related, name: value}


@pytest.mark.parametrize("bound", ["minimum", "ceiling"])
@pytest.mark.parametrize(("table", "setting"), ALL_SETTINGS)
def test_the_minimum_and_the_ceiling_themselves_are_accepted(
    table: str, setting: Setting, bound: str
) -> None:
    """The bounds are inclusive: a setting at its minimum or at its ceiling is valid."""
    value = setting.kind(getattr(setting, bound))
    consistent = consistent_llm if table == "llm" else consistent_tool_loop
    config = build(table, consistent(setting.name, value))()
    assert getattr(config, setting.name) == value


@pytest.mark.parametrize(
    ("struct", "table"),
    [pytest.param(LLMConfig, LLM_SETTINGS, id="llm"),
     pytest.param(ToolLoopConfig, TOOL_LOOP_SETTINGS, id="tool_loop")],
)  # fmt: skip
def test_the_settings_tables_match_the_struct_defaults(
    struct: type[msgspec.Struct], table: tuple[Setting, ...]
) -> None:
    """Every numeric field has a table entry whose default and type are the struct's own."""
    fields = {f.name: f for f in msgspec.structs.fields(struct)}
    numeric = {name for name, f in fields.items() if f.type in (int, float)}
    assert sorted(s.name for s in table) == sorted(numeric)
    for setting in table:
        field = fields[setting.name]
        assert (setting.name, field.type, field.default) == (
            setting.name,
            setting.kind,
            setting.default,
        )
        assert setting.minimum <= setting.default <= setting.ceiling, setting.name
        assert setting.reason.strip() != "", setting.name


def test_defaults_are_applied_and_valid() -> None:
    """A config given only a URL and a key has every documented default."""
    config, tool_loop = llm(), ToolLoopConfig()
    assert {s.name: getattr(config, s.name) for s in LLM_SETTINGS} == {
        s.name: s.default for s in LLM_SETTINGS
    }
    assert tool_loop.to_dict() == {
        **{s.name: s.default for s in TOOL_LOOP_SETTINGS},
        "reissue_reused_call_ids": False,
    }
    assert (config.allow_insecure_http, config.mint_missing_call_ids, config.ca_bundle) == (
        False,
        False,
        None,
    )


# --- all at once, unknown keys, contradictions ------------------------------------------------


def test_every_problem_is_reported_at_once() -> None:
    """One ConfigError lists every problem of the table, each under its own key."""
    assert keys(
        lambda: llm(
            endpoint_url="ftp://llm.example.com/v1",
            api_key=Secret("has space"),
            connect_timeout_s=-1.0,
            max_retries=99,
            max_tool_calls="3",
            allow_insecure_http="yes",
            ca_bundle="/nonexistent/ca.pem",
        )
    ) == sorted(
        [
            "endpoint_url",
            "api_key",
            "connect_timeout_s",
            "max_retries",
            "max_tool_calls",
            "allow_insecure_http",
            "ca_bundle",
        ]
    )


def test_every_problem_in_every_table_is_reported_at_once() -> None:
    """A whole document reports the problems of both tables and unknown keys, with key paths."""
    document = {
        "llm": {"endpoint_url": URL, "api_key": "k", "max_retries": 99, "max_retrys": 1},
        "tool_loop": {"max_turns": 0, "max_turn": 3},
        "tool-loop": {},
    }
    assert keys(lambda: AgentConfig.from_mapping(document, env={})) == [
        "llm.max_retries",
        "llm.max_retrys",
        "tool-loop",
        "tool_loop.max_turn",
        "tool_loop.max_turns",
    ]


def test_key_problems_and_field_problems_are_reported_together() -> None:
    """A bad key source does not hide the problems of the other fields."""
    table = {"endpoint_url": "ftp://x.example/", "api_key_env": "MISSING", "max_retries": 99}
    assert keys(lambda: LLMConfig.from_mapping(table, env={})) == [
        "api_key_env",
        "endpoint_url",
        "max_retries",
    ]


@pytest.mark.parametrize(
    ("build_table", "unknown"),
    [
        pytest.param(
            lambda: LLMConfig.from_mapping(
                {"endpoint_url": URL, "api_key": "k", "max_retrys": 3}, env={}
            ),
            ("max_retrys", "unknown key; did you mean `max_retries`?"),
            id="llm-typo",
        ),
        pytest.param(
            lambda: LLMConfig.from_mapping(
                {"endpoint-url": URL, "endpoint_url": URL, "api_key": "k"}, env={}
            ),
            ("endpoint-url", "unknown key; did you mean `endpoint_url`?"),
            id="llm-dash-for-underscore",
        ),
        pytest.param(
            lambda: ToolLoopConfig.from_mapping({"max_turn": 3}),
            ("max_turn", "unknown key; did you mean `max_turns`?"),
            id="tool-loop-typo",
        ),
        pytest.param(
            lambda: LLMConfig.from_mapping(
                {"endpoint_url": URL, "api_key": "k", "colour": 3}, env={}
            ),
            ("colour", "unknown key (check the spelling)"),
            id="llm-nothing-close",
        ),
        pytest.param(
            lambda: AgentConfig.from_mapping(
                {"llm": {"endpoint_url": URL, "api_key": "k"}, "tools": {}}, env={}
            ),
            ("tools", "unknown key (check the spelling)"),
            id="unknown-table",
        ),
    ],
)
def test_unknown_keys_are_rejected(
    build_table: Callable[[], object], unknown: tuple[str, str]
) -> None:
    """A misspelt key is an error naming it (and the nearest known key), never ignored."""
    assert [(p.key, p.problem) for p in problems(build_table)] == [unknown]


@pytest.mark.parametrize(
    "construct",
    [
        pytest.param(lambda: llm(max_retrys=3), id="llm"),
        pytest.param(lambda: ToolLoopConfig(max_turn=3), id="tool_loop"),  # type: ignore[call-arg]
    ],
)
def test_unknown_keyword_arguments_are_rejected(construct: Callable[[], object]) -> None:
    """Built in code, a misspelt field is a TypeError: nothing is silently dropped."""
    with pytest.raises(TypeError, match="max_"):
        construct()


CONTRADICTIONS = [
    pytest.param(
        {"connect_timeout_s": 30.0, "request_timeout_s": 20.0}, "connect_timeout_s",
        id="connect-longer-than-request",
    ),
    pytest.param(
        {"request_timeout_s": 120.0, "total_timeout_s": 60.0}, "total_timeout_s",
        id="total-shorter-than-request",
    ),
]  # fmt: skip


@pytest.mark.parametrize(("values", "key"), CONTRADICTIONS)
def test_contradictory_timeouts_are_rejected(values: dict[str, float], key: str) -> None:
    """A connect longer than a request, or a total shorter than one request, is refused."""
    [problem] = problems(lambda: llm(**values))
    assert problem.key == key


def test_equal_timeouts_do_not_contradict() -> None:
    """connect == request == total is the tightest valid setting."""
    config = llm(connect_timeout_s=5.0, request_timeout_s=5.0, total_timeout_s=5.0)
    assert (config.connect_timeout_s, config.total_timeout_s) == (5.0, 5.0)


TOOL_LOOP_CONTRADICTIONS = [
    pytest.param(
        {"max_calls_per_turn": 10, "max_calls_per_session": 5}, "max_calls_per_turn",
        id="turn-above-session",
    ),
    pytest.param(
        {"keep_recent_messages": 8, "max_history_messages": 8}, "keep_recent_messages",
        id="keep-recent-not-below-history",
    ),
    pytest.param(
        {"max_summary_bytes": 4096, "max_history_bytes": 4096}, "max_summary_bytes",
        id="summary-not-below-history",
    ),
]  # fmt: skip


@pytest.mark.parametrize(("values", "key"), TOOL_LOOP_CONTRADICTIONS)
def test_contradictory_tool_loop_bounds_are_rejected(values: dict[str, Any], key: str) -> None:
    """Bounds that leave compaction or the per-turn limit no room are refused."""
    [problem] = problems(lambda: ToolLoopConfig(**values))
    assert problem.key == key


@pytest.mark.parametrize("flag", ["allow_insecure_http", "mint_missing_call_ids"])
@pytest.mark.parametrize("value", ["true", 1, None], ids=["string", "int", "none"])
def test_flags_must_be_booleans(flag: str, value: object) -> None:
    """A flag given as "true" or 1 is refused: only true and false are flags."""
    assert keys(lambda: llm(**{flag: value})) == [flag]


def test_ca_bundle_must_be_an_existing_file(tmp_path: Path) -> None:
    """ca_bundle names a readable file; a missing path or a directory is refused."""
    assert keys(lambda: llm(ca_bundle=str(tmp_path / "missing.pem"))) == ["ca_bundle"]
    assert keys(lambda: llm(ca_bundle=str(tmp_path))) == ["ca_bundle"]


# --- endpoint_url -----------------------------------------------------------------------------

BAD_URLS = [
    pytest.param("ftp://llm.example.com/v1", id="ftp"),
    pytest.param("file:///etc/passwd", id="file"),
    pytest.param("ws://127.0.0.1:8000/v1", id="websocket"),
    pytest.param("llm.example.com/v1", id="no-scheme"),
    pytest.param("https://user:secret@llm.example.com/v1", id="user-and-password"),
    pytest.param("https://user@llm.example.com/v1", id="user-only"),
    pytest.param("http://127.0.0.1@llm.example.com/v1", id="loopback-lookalike-user-info"),
    pytest.param("https:///v1/chat/completions", id="missing-host"),
    pytest.param("https://", id="nothing-after-scheme"),
    pytest.param("http://llm.example.com/v1", id="cleartext-to-remote-name"),
    pytest.param("http://10.0.0.7:8000/v1", id="cleartext-to-private-ip"),
    pytest.param("http://0.0.0.0:8000/v1", id="cleartext-to-any-address"),
    pytest.param("http://127.0.0.1.nip.io/v1", id="cleartext-to-loopback-lookalike-name"),
    pytest.param("http://localhost.example.com/v1", id="cleartext-to-localhost-prefix"),
    pytest.param("https://llm.example.com/v1#frag", id="fragment"),
    pytest.param("https://llm.example.com:0/v1", id="port-zero"),
    pytest.param("https://llm.example.com:99999/v1", id="port-out-of-range"),
    pytest.param("https://[::1/v1", id="broken-ipv6"),
    pytest.param("https://llm.example.com/v 1", id="space"),
    pytest.param("https://llm.example.com/v1\n", id="newline"),
    pytest.param("", id="empty"),
    pytest.param("https://llm.example.com/" + "a" * 3000, id="too-long"),
]


@pytest.mark.parametrize("url", BAD_URLS)
def test_bad_endpoint_urls_are_rejected(url: str) -> None:
    """Only http(s) URLs with a host, no user-info, and cleartext only to loopback, are valid."""
    assert set(keys(lambda: llm(endpoint_url=url))) == {"endpoint_url"}


GOOD_URLS = [
    pytest.param("https://llm.example.com/v1/chat/completions", id="https"),
    pytest.param("https://llm.example.com/deploy/chat?api-version=2024-10-21", id="https-query"),
    pytest.param("http://127.0.0.1:8000/v1/chat/completions", id="http-127.0.0.1"),
    pytest.param("http://127.3.2.1:8000/v1/chat/completions", id="http-127/8"),
    pytest.param("http://[::1]:8000/v1/chat/completions", id="http-ipv6-loopback"),
    pytest.param("http://localhost:11434/v1/chat/completions", id="http-localhost"),
    pytest.param("http://LOCALHOST:11434/v1/chat/completions", id="http-localhost-upper-case"),
]


@pytest.mark.parametrize("url", GOOD_URLS)
def test_https_and_loopback_http_endpoint_urls_are_accepted(url: str) -> None:
    """https anywhere and cleartext http to a loopback host are accepted, kept as given."""
    assert llm(endpoint_url=url).endpoint_url == url


@pytest.mark.parametrize(
    "url", ["http://llm.example.com/v1", "http://10.0.0.7:8000/v1"], ids=["name", "private-ip"]
)
def test_cleartext_to_a_remote_host_needs_allow_insecure_http(url: str) -> None:
    """allow_insecure_http = true is the explicit opt-in for cleartext beyond loopback."""
    assert llm(endpoint_url=url, allow_insecure_http=True).endpoint_url == url


#: A credential an operator put in the URL (not the API key): it must never be shown.
QUERY_SECRET = "qs-7Hd93kPzQ0vW5mXc"

SHOWN_URLS = [
    pytest.param(
        f"https://h.example/v1?api-version=2024-10-21&api-key={QUERY_SECRET}",
        "https://h.example/v1?api-version=2024-10-21&api-key=[REDACTED]",
        id="api-key",
    ),
    pytest.param(
        f"https://h.example/v1?key={QUERY_SECRET}", "https://h.example/v1?key=[REDACTED]", id="key"
    ),
    pytest.param(
        f"https://h.example/api/chat?code={QUERY_SECRET}&clientId=default",
        "https://h.example/api/chat?code=[REDACTED]&clientId=default",
        id="code",
    ),
    pytest.param(
        f"https://h.example/v1?sv=2022&X-Amz-Signature={QUERY_SECRET}&Access_Token={QUERY_SECRET}",
        "https://h.example/v1?sv=2022&X-Amz-Signature=[REDACTED]&Access_Token=[REDACTED]",
        id="sig-and-token-any-case",
    ),
    pytest.param(
        f"https://h.example/v1?client_secret={QUERY_SECRET};password={QUERY_SECRET}&AUTH={QUERY_SECRET}",
        "https://h.example/v1?client_secret=[REDACTED];password=[REDACTED]&AUTH=[REDACTED]",
        id="secret-password-auth",
    ),
    pytest.param(
        f"https://h.example/v1?api%2Dkey={QUERY_SECRET}&keyless&=x&k=",
        "https://h.example/v1?api%2Dkey=[REDACTED]&keyless&=x&k=",
        id="escaped-name-and-edges",
    ),
    pytest.param(
        f"https://user:{QUERY_SECRET}@h.example:8443/v1",
        "https://[REDACTED]@h.example:8443/v1",
        id="user-info",
    ),
    pytest.param(
        f"https://{QUERY_SECRET}@h.example/v1#access_token={QUERY_SECRET}",
        "https://[REDACTED]@h.example/v1#access_token=[REDACTED]",
        id="user-only-and-fragment",
    ),
    pytest.param(
        f" \thttps://us\ter:{QUERY_SECRET}@h.example/v1",
        "https://[REDACTED]@h.example/v1",
        id="as-urlsplit-reads-it",
    ),
    pytest.param(
        "https://h.example/deploy/chat?api-version=2024-10-21",
        "https://h.example/deploy/chat?api-version=2024-10-21",
        id="nothing-to-hide",
    ),
    pytest.param(f"https://apikey:{QUERY_SECRET}/v1", "<invalid URL>", id="no-host"),
    pytest.param(f"https://[::1/v1?key={QUERY_SECRET}", "<invalid URL>", id="broken-ipv6"),
]


@pytest.mark.parametrize(("url", "expected"), SHOWN_URLS)
def test_one_rule_hides_a_credential_in_a_url(url: str, expected: str) -> None:
    """User-info and the value of every parameter whose name holds key, token, secret, sig,
    code, password or auth (any case) are hidden; a URL that does not parse is not quoted."""
    assert shown_url(url) == expected


@pytest.mark.parametrize(
    "url",
    [
        f"https://h.example/v1?api-key={QUERY_SECRET}",
        f"https://h.example/v1?x=1&key={QUERY_SECRET}",
        f"https://h.example/api?code={QUERY_SECRET}",
        f"https://h.example/api?sig={QUERY_SECRET}",
    ],
)
async def test_a_query_credential_is_in_no_repr_of_config_or_client(url: str) -> None:
    """LLMConfig, AgentConfig and LLMClient show the URL by the one rule, in repr, str and
    the redacted dict; the URL itself is kept exactly as given."""
    config = llm(endpoint_url=url)
    agent = AgentConfig(llm=config)
    async with LLMClient(config) as client:
        shown = [repr(config), str(config), repr(agent), str(agent), repr(client), str(client)]
    shown.append(repr(config.to_redacted_dict()))
    shown.append(repr(config.__rich_repr__()))
    assert [text for text in shown if QUERY_SECRET in text] == []
    assert all(shown_url(url) in text for text in shown)
    assert config.to_redacted_dict()["endpoint_url"] == shown_url(url)
    assert config.endpoint_url == url


@pytest.mark.parametrize(
    "url",
    [
        f"https://apikey:{QUERY_SECRET}/v1/chat/completions",
        f"https://h.example:{QUERY_SECRET}/v1",
        f"https://h.example:99999/v1?key={QUERY_SECRET}",
        f"https://[{QUERY_SECRET}/v1",
        f"ftp://user:{QUERY_SECRET}@h.example/v1?key={QUERY_SECRET}",
    ],
)
def test_a_refused_url_is_not_quoted_in_its_problem(url: str) -> None:
    """A URL that does not parse (a user-info with no host, a bad port or IPv6 host) or is
    refused for another reason: no problem quotes any part of it that may be a credential."""
    found = problems(lambda: llm(endpoint_url=url))
    assert [p.key for p in found] == ["endpoint_url"] * len(found)
    assert [str(p) for p in found if QUERY_SECRET in str(p) or QUERY_SECRET in repr(p)] == []


# --- the key and its three sources ------------------------------------------------------------


def from_table(table: Mapping[str, Any], env: Mapping[str, str] | None = None) -> LLMConfig:
    """LLMConfig.from_mapping with a URL, and an explicit environment (never os.environ)."""
    return LLMConfig.from_mapping({"endpoint_url": URL, **table}, env=env or {})


def write(path: Path, data: bytes) -> str:
    """Write `data` to `path` and return the path as a string."""
    path.write_bytes(data)
    return str(path)


def test_each_key_source_gives_the_key(tmp_path: Path) -> None:
    """api_key, api_key_env and api_key_file (stripped of its line end) all yield the key."""
    key_file = write(tmp_path / "key", CANARY_KEY.encode() + b"\n")
    configs = [
        from_table({"api_key": CANARY_KEY}),
        from_table({"api_key_env": "GRID_KEY"}, env={"GRID_KEY": CANARY_KEY}),
        from_table({"api_key_file": key_file}),
    ]
    assert [c.api_key.reveal() for c in configs] == [CANARY_KEY] * 3


def key_source_cases(tmp_path: Path) -> dict[str, tuple[dict[str, Any], dict[str, str], str]]:
    """Bad key sources: table, environment, and the key the problem must be filed under."""
    return {
        "none": ({}, {}, "api_key"),
        "key-and-env": ({"api_key": "k", "api_key_env": "GRID_KEY"}, {"GRID_KEY": "k"}, "api_key"),
        "all-three": (
            {"api_key": "k", "api_key_env": "GRID_KEY", "api_key_file": "/x"},
            {"GRID_KEY": "k"},
            "api_key",
        ),
        "env-missing": ({"api_key_env": "GRID_KEY"}, {}, "api_key_env"),
        "env-empty": ({"api_key_env": "GRID_KEY"}, {"GRID_KEY": ""}, "api_key_env"),
        "env-with-space": (
            {"api_key_env": "GRID_KEY"}, {"GRID_KEY": "sk-abc def"}, "api_key_env",
        ),
        "env-name-empty": ({"api_key_env": ""}, {}, "api_key_env"),
        "file-missing": ({"api_key_file": str(tmp_path / "nope")}, {}, "api_key_file"),
        "file-empty": ({"api_key_file": write(tmp_path / "empty", b"")}, {}, "api_key_file"),
        "file-blank": ({"api_key_file": write(tmp_path / "blank", b" \n\t\n")}, {}, "api_key_file"),
        "file-two-lines": (
            {"api_key_file": write(tmp_path / "two", b"sk-one\nsk-two\n")}, {}, "api_key_file",
        ),
        "file-not-utf8": (
            {"api_key_file": write(tmp_path / "bin", b"\xff\xfe")}, {}, "api_key_file",
        ),
        "file-is-a-directory": ({"api_key_file": str(tmp_path)}, {}, "api_key_file"),
        "key-empty": ({"api_key": ""}, {}, "api_key"),
        "key-not-a-string": ({"api_key": 12345}, {}, "api_key"),
        "key-with-space": ({"api_key": "sk-abc def"}, {}, "api_key"),
        "key-with-tab": ({"api_key": "sk-abc\tdef"}, {}, "api_key"),
        "key-with-newline": ({"api_key": "sk-abc\ndef"}, {}, "api_key"),
        "key-with-leading-space": ({"api_key": " sk-abcdef"}, {}, "api_key"),
        "key-non-ascii": ({"api_key": "sk-abcdéf"}, {}, "api_key"),
        "key-too-long": ({"api_key": "k" * 4097}, {}, "api_key"),
    }  # fmt: skip


KEY_SOURCE_IDS = [
    "none", "key-and-env", "all-three", "env-missing", "env-empty", "env-with-space",
    "env-name-empty", "file-missing", "file-empty", "file-blank", "file-two-lines",
    "file-not-utf8", "file-is-a-directory", "key-empty", "key-not-a-string", "key-with-space",
    "key-with-tab", "key-with-newline", "key-with-leading-space", "key-non-ascii", "key-too-long",
]  # fmt: skip


@pytest.mark.parametrize("case", KEY_SOURCE_IDS)
def test_bad_key_sources_are_rejected(tmp_path: Path, case: str) -> None:
    """Exactly one source must give a non-empty, printable, space-free key; else one problem."""
    table, env, key = key_source_cases(tmp_path)[case]
    [problem] = problems(lambda: from_table(table, env))
    assert problem.key == key


@pytest.mark.parametrize(
    "value", ["sk-abc def", " sk-abcdef", "sk-abc\ndef", "", "k" * 4097],
    ids=["space", "leading-space", "newline", "empty", "too-long"],
)  # fmt: skip
def test_a_bad_secret_given_in_code_is_rejected(value: str) -> None:
    """A Secret built in code is held to the same rules as one read from a file."""
    assert keys(lambda: llm(api_key=Secret(value))) == ["api_key"]


@pytest.mark.parametrize("source", ["api_key_env", "api_key_file"])
def test_a_key_pasted_into_a_key_source_name_is_not_echoed(source: str) -> None:
    """Putting the key itself where a variable name or path belongs fails without showing it."""
    with pytest.raises(ConfigError) as caught:
        from_table({source: CANARY_KEY})
    assert [p.key for p in caught.value.problems] == [source]
    assert CANARY_KEY not in str(caught.value)
    assert CANARY_KEY not in repr(caught.value.problems)


# --- TOML files -------------------------------------------------------------------------------


def toml(tmp_path: Path, text: str) -> Path:
    """Write a configuration file."""
    path = tmp_path / "grid-agent.toml"
    path.write_text(text, encoding="utf-8")
    return path


def test_a_toml_file_is_read_and_validated(tmp_path: Path) -> None:
    """from_toml reads both tables; integers are accepted for float settings."""
    key_file = write(tmp_path / "key.txt", CANARY_KEY.encode() + b"\n")
    path = toml(
        tmp_path,
        f"""
        [llm]
        endpoint_url = "{URL}"
        api_key_file = "{key_file}"
        connect_timeout_s = 3
        max_retries = 5
        mint_missing_call_ids = true

        [tool_loop]
        max_turns = 4
        """,
    )
    config = AgentConfig.from_toml(path, env={})
    assert (config.llm.endpoint_url, config.llm.api_key.reveal()) == (URL, CANARY_KEY)
    assert (config.llm.connect_timeout_s, config.llm.max_retries) == (3, 5)
    assert (config.llm.mint_missing_call_ids, config.tool_loop.max_turns) == (True, 4)


def test_a_toml_file_can_take_the_key_from_the_environment(tmp_path: Path) -> None:
    """api_key_env is looked up in the given environment; [tool_loop] defaults when absent."""
    path = toml(tmp_path, f'[llm]\nendpoint_url = "{URL}"\napi_key_env = "GRID_KEY"\n')
    config = AgentConfig.from_toml(path, env={"GRID_KEY": CANARY_KEY})
    assert config.llm.api_key.reveal() == CANARY_KEY
    assert config.tool_loop == ToolLoopConfig()


def test_toml_problems_carry_table_key_paths(tmp_path: Path) -> None:
    """Problems in a file are reported together, each under table.key."""
    path = toml(
        tmp_path,
        f"""
        [llm]
        endpoint_url = "{URL}"
        api_key = "k"
        max_retries = 99
        conect_timeout_s = 1.0

        [tool_loop]
        max_turns = 0
        max_session_s = "long"
        """,
    )
    assert keys(lambda: AgentConfig.from_toml(path, env={})) == [
        "llm.conect_timeout_s",
        "llm.max_retries",
        "tool_loop.max_session_s",
        "tool_loop.max_turns",
    ]


BAD_FILES = [
    pytest.param("[llm\nendpoint_url = 1\n", "is not valid TOML", id="syntax-error"),
    pytest.param("[tool_loop]\nmax_turns = 4\n", "the [llm] table is required", id="no-llm-table"),
    pytest.param("llm = 3\n", "must be a table", id="llm-not-a-table"),
]


@pytest.mark.parametrize(("text", "says"), BAD_FILES)
def test_broken_toml_files_are_config_errors(tmp_path: Path, text: str, says: str) -> None:
    """A broken file is a ConfigError saying what is wrong, never a parser exception."""
    [problem] = problems(lambda: AgentConfig.from_toml(toml(tmp_path, text), env={}))
    assert says in problem.problem


def test_a_missing_toml_file_is_a_config_error(tmp_path: Path) -> None:
    """A path that does not exist is a ConfigError under that path."""
    path = tmp_path / "absent.toml"
    [problem] = problems(lambda: AgentConfig.from_toml(path, env={}))
    assert problem.key == str(path)


def test_an_oversized_toml_file_is_refused(tmp_path: Path) -> None:
    """A file over 1 MiB is refused before it is parsed."""
    path = toml(tmp_path, "# padding\n" * (110 * 1024))
    [problem] = problems(lambda: AgentConfig.from_toml(path, env={}))
    assert (problem.key, "larger than" in problem.problem) == (str(path), True)


# --- the key in derived forms -----------------------------------------------------------------


def test_to_redacted_dict_hides_the_key_and_shows_every_setting() -> None:
    """The display form has every field, with the key replaced by the marker."""
    config = llm(max_retries=4)
    shown = config.to_redacted_dict()
    assert sorted(shown) == sorted(config.__struct_fields__)
    assert shown["api_key"] == REDACTED
    assert {k: v for k, v in shown.items() if k != "api_key"} == {
        k: getattr(config, k) for k in config.__struct_fields__ if k != "api_key"
    }
    assert CANARY_KEY not in repr(shown)


@pytest.mark.parametrize(
    "value",
    [
        pytest.param(lambda: Secret(CANARY_KEY), id="secret"),
        pytest.param(llm, id="llm-config"),
        pytest.param(lambda: AgentConfig(llm=llm()), id="agent-config"),
    ],
)
def test_pickling_never_reveals_the_key(value: Callable[[], object]) -> None:
    """A pickle of a Secret or a configuration holds the marker, never the key."""
    data = pickle.dumps(value())
    assert CANARY_KEY.encode() not in data
    assert REDACTED.encode() in data


def test_configs_are_frozen() -> None:
    """A validated configuration cannot be changed afterwards (and so cannot become invalid)."""
    config = llm()
    with pytest.raises(AttributeError):
        config.max_retries = 99  # type: ignore[misc]


@pytest.mark.parametrize(
    "url",
    [
        "https://a..b.example/v1/chat/completions",
        "https://" + "a" * 64 + ".example/v1",
    ],
)
def test_a_host_that_cannot_be_put_on_the_wire_is_a_config_error(url: str) -> None:
    """A host the HTTP client cannot encode fails at validation, not as a raw UnicodeError."""
    with pytest.raises(ConfigError) as info:
        LLMConfig(endpoint_url=url, api_key=Secret(CANARY_KEY))
    assert [p.key for p in info.value.problems] == ["endpoint_url"]


def test_cleartext_http_to_a_dot_localhost_name_needs_the_opt_in() -> None:
    """Only `localhost` and loopback literals count as loopback: other names are resolved."""
    with pytest.raises(ConfigError):
        LLMConfig(endpoint_url="http://api.localhost/v1", api_key=Secret(CANARY_KEY))
    LLMConfig(endpoint_url="http://localhost/v1", api_key=Secret(CANARY_KEY))


# --- paths relative to the file, where the key came from, plain-str keys ---------------------


def test_relative_paths_are_resolved_against_the_config_files_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """api_key_file and ca_bundle given relative are found beside the file, whatever the cwd."""
    folder = tmp_path / "etc"
    folder.mkdir()
    write(folder / "llm.key", CANARY_KEY.encode() + b"\n")
    trustme.CA().cert_pem.write_to_path(str(folder / "ca.pem"))
    path = toml(
        folder, f'[llm]\nendpoint_url = "{URL}"\napi_key_file = "llm.key"\nca_bundle = "ca.pem"\n'
    )
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    config = AgentConfig.from_toml(path).llm
    assert config.api_key.reveal() == CANARY_KEY
    assert config.api_key.origin == f"file {str(folder / 'llm.key')!r}"
    assert config.ca_bundle == str(folder / "ca.pem")


def test_a_missing_key_file_or_ca_bundle_names_the_path_tried(tmp_path: Path) -> None:
    """A relative path that is not there fails naming the absolute path that was tried."""
    path = toml(
        tmp_path,
        f'[llm]\nendpoint_url = "{URL}"\napi_key_file = "keys/llm.key"\n'
        'ca_bundle = "certs/ca.pem"\n',
    )
    found = {p.key: p.problem for p in problems(lambda: AgentConfig.from_toml(path))}
    key_path, ca_path = tmp_path / "keys" / "llm.key", tmp_path / "certs" / "ca.pem"
    assert found == {
        "llm.api_key_file": (
            f"cannot read the key file {str(key_path)!r} (No such file or directory)"
        ),
        "llm.ca_bundle": f"{str(ca_path)!r} is not a readable file",
    }


def test_each_key_source_records_its_origin(tmp_path: Path) -> None:
    """Secret.origin says inline, which variable, or which file; never the key itself."""
    key_file = write(tmp_path / "key.txt", CANARY_KEY.encode())
    origins = [
        from_table({"api_key": CANARY_KEY}).api_key.origin,
        from_table({"api_key_env": "GRID_KEY"}, {"GRID_KEY": CANARY_KEY}).api_key.origin,
        from_table({"api_key_file": key_file}).api_key.origin,
        llm().api_key.origin,
    ]
    assert origins == ["inline", "environment variable GRID_KEY", f"file {key_file!r}", None]
    assert all(CANARY_KEY not in (o or "") for o in origins)


def test_a_plain_string_key_in_code_is_wrapped_in_a_secret() -> None:
    """LLMConfig(api_key="...") works: the str becomes a Secret, and no repr shows it."""
    config = llm(api_key=CANARY_KEY)
    assert isinstance(config.api_key, Secret)
    assert config.api_key.reveal() == CANARY_KEY
    assert CANARY_KEY not in repr(config)
    assert CANARY_KEY not in str(config.to_redacted_dict())


def test_a_key_of_another_type_says_to_wrap_it_in_secret() -> None:
    """Neither a str nor a Secret: the problem says how to pass it."""
    [problem] = problems(lambda: llm(api_key=b"sk-bytes"))
    assert (problem.key, problem.problem) == ("api_key", "must be a Secret: wrap it in Secret(...)")


def test_a_key_with_slashes_pasted_as_key_file_is_not_echoed(tmp_path: Path) -> None:
    """A key that contains "/" (base64 keys do) is still not a path: never repeated.

    From a file, the message names the folder it was looked up in instead.
    """
    pasted = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYzEXAMPLEKEY"
    path = toml(tmp_path, f'[llm]\nendpoint_url = "{URL}"\napi_key_file = "{pasted}"\n')
    [problem] = problems(lambda: AgentConfig.from_toml(path))
    assert problem.key == "llm.api_key_file"
    assert pasted not in problem.problem
    assert "K7MDENG" not in problem.problem
    assert str(tmp_path) in problem.problem


@pytest.mark.parametrize("key", ["model", "provider", "base_url", "api_base"])
def test_a_model_or_provider_key_says_the_url_selects_the_model(key: str) -> None:
    """``[llm] model`` (and provider, base_url, api_base), the likeliest first mistake, is
    answered with how the model is chosen here and where the recipes are, not "unknown key"."""
    found = problems(
        lambda: AgentConfig.from_mapping(
            {"llm": {"endpoint_url": URL, "api_key": "k", key: "gpt-4o"}}, env={}
        )
    )
    assert [p.key for p in found] == [f"llm.{key}"]
    message = found[0].problem
    assert "endpoint_url selects the model" in message
    assert "docs/guide/works-with.md" in message
    assert "check the spelling" not in message


def test_provider_name_defaults_to_openai_and_is_checked() -> None:
    """``[llm] provider_name`` (reported as ``gen_ai.provider.name``) defaults to ``openai``,
    the API spoken; an operator names a known provider in the conventions' form (lowercase,
    dotted); anything else is a problem under its key, whatever the other problems."""
    assert LLMConfig(endpoint_url=URL, api_key=Secret("k")).provider_name == "openai"
    for name in ("mistral_ai", "aws.bedrock", "x_ai", "my-gateway"):
        table: dict[str, object] = {"endpoint_url": URL, "api_key": "k", "provider_name": name}
        assert LLMConfig.from_mapping(table).provider_name == name
    for bad in ("", "Mistral AI", "a" * 65, ".openai", 7, "open\u202eai"):
        table = {"endpoint_url": URL, "api_key": "k", "provider_name": bad, "max_retries": -1}
        with pytest.raises(ConfigError) as caught:
            LLMConfig.from_mapping(table)
        assert sorted(p.key for p in caught.value.problems) == ["max_retries", "provider_name"]


def test_a_plain_string_key_never_reaches_a_pickle() -> None:
    """A key given as a plain ``str`` is stored as a Secret: a pickle of the configuration
    holds the marker, never the key."""
    data = pickle.dumps(llm(api_key=CANARY_KEY))
    assert CANARY_KEY.encode() not in data
    assert REDACTED.encode() in data


def test_the_type_checked_signature_is_the_structs_fields() -> None:
    """The ``__init__`` that type checkers see for LLMConfig (written out so that ``api_key``
    takes ``str | Secret``) names every field, in order, keyword-only, with the field's type
    and a default exactly where the field has one: it cannot drift from the struct."""
    source = Path(config_module.__file__).read_text(encoding="utf-8")
    (cls,) = [
        n
        for n in ast.walk(ast.parse(source))
        if isinstance(n, ast.ClassDef) and n.name == "LLMConfig"
    ]
    (init,) = [n for n in ast.walk(cls) if isinstance(n, ast.FunctionDef) and n.name == "__init__"]
    arguments = init.args
    assert [a.arg for a in arguments.args] == ["self"]
    names = [a.arg for a in arguments.kwonlyargs]
    assert names == list(LLMConfig.__struct_fields__)
    shown = {a.arg: ast.unparse(a.annotation) for a in arguments.kwonlyargs if a.annotation}
    assert shown == {**LLMConfig.__annotations__, "api_key": "str | Secret"}
    required = len(LLMConfig.__struct_fields__) - len(LLMConfig.__struct_defaults__)
    assert [d is None for d in arguments.kw_defaults] == [i < required for i in range(len(names))]
