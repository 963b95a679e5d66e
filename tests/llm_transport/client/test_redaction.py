"""The key never leaves the Authorization header: not in reprs, errors, chains, pickles or logs.

Each failure scenario is provoked through the real client against the loopback fake (or a
bound, non-listening port, or an untrusted TLS listener), with two keys: one shaped like
a provider key (``sk-...``, which the credential patterns catch anyway) and one plain
string that only the configured-secret redaction can catch. Every scenario is checked
separately for the error's own text, its exception chain, its pickle and the log records,
so one leak does not hide another.
"""

from __future__ import annotations

import dataclasses
import logging
import pickle
import socket
import ssl
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Literal

import msgspec
import pytest
import trustme

from metacrate_grid_agent import (
    AgentConfig,
    LLMClient,
    LLMConfig,
    Secret,
    UserMessage,
)
from metacrate_grid_agent.errors import (
    ChoiceError,
    ConfigError,
    ConnectError,
    GridAgentError,
    HTTPStatusError,
    MalformedJSONError,
    MalformedResponseError,
    RedirectRefusedError,
    ResponseIdleTimeoutError,
    TLSError,
)
from metacrate_grid_agent.testing import FakeEndpoint, Reply
from tests.conftest import assert_error_clean
from tests.llm_transport.support import CANARY_KEY, FAST

if TYPE_CHECKING:
    from collections.abc import Iterator

REDACTED = "[REDACTED]"
#: A key no credential pattern matches: only redaction of the configured secret can catch it.
PLAIN_KEY = "ZqPlainCanary0Key0Shaped0Like0Nothing42"
KEYS = [pytest.param(CANARY_KEY, id="sk-key"), pytest.param(PLAIN_KEY, id="plain-key")]
HELLO = (UserMessage(content="hello"),)
LOGGERS = ("metacrate_grid_agent", "aiohttp", "aiohttp.client", "aiohttp.internal", "asyncio")
#: A server-side stall far longer than the client limit it is set against.
LONG_STALL_S = 20.0

Listener = Literal["fake", "refused", "tls"]


@dataclasses.dataclass(frozen=True)
class Scenario:
    """One way a call fails; `script` builds the fake's replies from the key it may echo."""

    name: str
    error: type[GridAgentError]
    script: Callable[[str], list[Reply]] = lambda key: []
    listener: Listener = "fake"
    overrides: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    #: The attribute that must show the redaction marker where the server echoed the key.
    redacted: str | None = None


def _html_page(key: str) -> bytes:
    return (
        "<html><head><title>500 Internal Server Error</title>"
        f"<script>var token = '{key}';</script></head>"
        f"<body><h1>Internal Server Error</h1><p>Authorization: Bearer {key}</p>"
        f"<p>api key {key} rejected</p></body></html>"
    ).encode()


SCENARIOS = [
    Scenario("connect-refused", ConnectError, listener="refused", overrides={"max_retries": 1}),
    Scenario(
        "401-key-echoed-in-json-message",
        HTTPStatusError,
        lambda key: [
            Reply.error(
                401,
                f"Incorrect API key provided: {key}. You can find your API key at ...",
                type="invalid_request_error",
                code="invalid_api_key",
            )
        ],
        redacted="error_message",
    ),
    Scenario(
        "400-key-echoed-in-type-and-code",
        HTTPStatusError,
        lambda key: [Reply.error(400, "bad request", type=f"bad_key:{key}", code=key)],
        redacted="error_code",
    ),
    Scenario(
        "401-key-echoed-in-reason-phrase",
        HTTPStatusError,
        lambda key: [Reply(status=401, reason=f"Invalid key {key}")],
        redacted="message",
    ),
    Scenario(
        "500-key-echoed-in-html-body",
        HTTPStatusError,
        lambda key: (
            [Reply(status=500, headers=(("Content-Type", "text/html"),), body=_html_page(key))] * 2
        ),
        overrides={"max_retries": 1},
        redacted="excerpt",
    ),
    Scenario(
        "redirect-with-key-in-location-query",
        RedirectRefusedError,
        lambda key: [Reply.redirect(302, f"https://elsewhere.example/v1?api_key={key}&x=1")],
        overrides={"max_retries": 2},
        redacted="location",
    ),
    Scenario(
        "malformed-json-containing-the-key",
        MalformedJSONError,
        lambda key: [
            Reply(
                headers=(("Content-Type", "application/json"),),
                body=b'{"choices": [{"message": {"content": "' + key.encode() + b'"',
            )
        ],
    ),
    Scenario(
        "choice-error-echoing-the-key",
        ChoiceError,
        lambda key: [
            Reply.completion(
                None, extra_choice={"error": {"message": f"upstream rejected key {key}"}}
            )
        ],
        redacted="message",
    ),
    Scenario(
        "top-level-error-echoing-bearer-key",
        ChoiceError,
        lambda key: [Reply.json({"error": {"message": f"header was Bearer {key}", "code": 401}})],
        redacted="message",
    ),
    Scenario(
        "malformed-status-line-echoing-the-key",
        MalformedResponseError,
        lambda key: [Reply(head=f"HTTP/1.1 2x0 {key}\r\nContent-Length: 0\r\n\r\n".encode())],
        overrides={"max_retries": 0},
        redacted="message",
    ),
    Scenario(
        "reset-mid-body",
        MalformedResponseError,
        lambda key: [
            Reply(
                headers=(("Content-Type", "application/json"),),
                body=b'{"choices": []}' + b" " * 1000,
                fault="reset",
                fault_at=120,
            )
        ],
        overrides={"max_retries": 0},
    ),
    Scenario(
        "response-idle-timeout",
        ResponseIdleTimeoutError,
        lambda key: [Reply(stall_before_headers_s=LONG_STALL_S)],
        overrides={"max_retries": 0, "response_idle_timeout_s": 0.2},
    ),
    Scenario("tls-untrusted-certificate", TLSError, listener="tls"),
]
SCENARIO_PARAMS = [pytest.param(s, id=s.name) for s in SCENARIOS]
ECHOING = [pytest.param(s, id=s.name) for s in SCENARIOS if s.redacted is not None]


@pytest.fixture(scope="module")
def server_tls() -> ssl.SSLContext:
    """A TLS server context with a certificate for 127.0.0.1 from a CA nobody trusts."""
    ca = trustme.CA()
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1").configure_cert(context)
    return context


@pytest.fixture
def logs(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    """Capture every record at DEBUG: the library's logger, aiohttp's, asyncio's and the root."""
    caplog.set_level(logging.DEBUG)
    for name in LOGGERS:
        caplog.set_level(logging.DEBUG, logger=name)
    return caplog


def config_for(url: str, key: str, **overrides: Any) -> LLMConfig:
    """Fast limits with this key (the plain key cannot go through make_config)."""
    return LLMConfig(endpoint_url=url, api_key=Secret(key), **{**FAST, **overrides})


async def call(url: str, key: str, scenario: Scenario) -> GridAgentError:
    """Run one call that must fail with the scenario's error, and return that error."""
    async with LLMClient(config_for(url, key, **scenario.overrides)) as client:
        with pytest.raises(GridAgentError) as caught:
            await client.complete(HELLO)
    assert type(caught.value) is scenario.error
    return caught.value


async def provoke(scenario: Scenario, key: str, server_tls: ssl.SSLContext) -> GridAgentError:
    """Make the scenario happen against a loopback listener and return the error raised."""
    if scenario.listener == "refused":
        with socket.socket() as sock:  # bound but not listening: connects are refused
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
            return await call(f"http://127.0.0.1:{port}/v1/chat/completions", key, scenario)
    context = server_tls if scenario.listener == "tls" else None
    async with FakeEndpoint(scenario.script(key), ssl_context=context) as ep:
        return await call(ep.url, key, scenario)


def linked(error: BaseException) -> Iterator[BaseException]:
    """Every exception reachable from `error` through __cause__ and __context__ (not itself)."""
    seen = {id(error)}
    pending = [error.__cause__, error.__context__]
    while pending:  # bounded: each exception is visited once
        current = pending.pop()
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        yield current
        pending += [current.__cause__, current.__context__]


def leaks(obj: object, key: str) -> list[str]:
    """Where the key shows in an object: its str, repr, or the repr of an attribute value."""
    found = [where for where, text in (("str", str(obj)), ("repr", repr(obj))) if key in text]
    found += [f"attribute {n}" for n, v in getattr(obj, "__dict__", {}).items() if key in repr(v)]
    return found


# --- the error itself -------------------------------------------------------------------------


@pytest.mark.parametrize("key", KEYS)
@pytest.mark.parametrize("scenario", SCENARIO_PARAMS)
async def test_error_text_and_attributes_never_show_the_key(
    scenario: Scenario, key: str, server_tls: ssl.SSLContext
) -> None:
    """str, repr and every attribute of the raised error are free of the key."""
    error = await provoke(scenario, key, server_tls)
    assert leaks(error, key) == []


@pytest.mark.parametrize("key", KEYS)
@pytest.mark.parametrize("scenario", SCENARIO_PARAMS)
async def test_pickled_error_never_holds_the_key(
    scenario: Scenario, key: str, server_tls: ssl.SSLContext
) -> None:
    """An error crossing a process boundary carries no key, and keeps its kind and message."""
    error = await provoke(scenario, key, server_tls)
    data = pickle.dumps(error)
    assert key.encode() not in data
    restored = pickle.loads(data)  # noqa: S301 - our own bytes, just made
    assert (type(restored), restored.kind, str(restored)) == (type(error), error.kind, str(error))


@pytest.mark.parametrize("key", KEYS)
@pytest.mark.parametrize("scenario", SCENARIO_PARAMS)
async def test_error_chain_holds_no_aiohttp_object_and_no_key(
    scenario: Scenario, key: str, server_tls: ssl.SSLContext
) -> None:
    """Nothing is chained explicitly, and the implicit chain holds no aiohttp error and no key.

    aiohttp errors carry ``request_info``, whose repr includes the Authorization header.
    """
    error = await provoke(scenario, key, server_tls)
    assert error.__cause__ is None
    chain = list(linked(error))
    assert [type(e) for e in chain if type(e).__module__.split(".")[0] == "aiohttp"] == []
    assert [(type(e), leaks(e, key)) for e in chain if leaks(e, key)] == []


@pytest.mark.parametrize("key", KEYS)
@pytest.mark.parametrize("scenario", SCENARIO_PARAMS)
async def test_log_records_never_show_the_key(
    scenario: Scenario, key: str, server_tls: ssl.SSLContext, logs: pytest.LogCaptureFixture
) -> None:
    """No record from any logger (library, aiohttp, asyncio, root) shows the key at DEBUG."""
    await provoke(scenario, key, server_tls)
    records = logs.records
    assert [r for r in records if r.name == "metacrate_grid_agent"] != []  # the attempt is logged
    for record in records:
        assert key not in record.getMessage()
        assert [n for n, v in record.__dict__.items() if key in repr(v)] == []
        if record.exc_info:
            assert key not in logging.Formatter().formatException(record.exc_info)


@pytest.mark.parametrize("key", KEYS)
@pytest.mark.parametrize("scenario", ECHOING)
async def test_an_echoed_key_is_replaced_by_the_redaction_marker(
    scenario: Scenario, key: str, server_tls: ssl.SSLContext
) -> None:
    """Where the server echoed the key, the error shows "[REDACTED]" in its place."""
    error = await provoke(scenario, key, server_tls)
    assert scenario.redacted is not None
    shown = getattr(error, scenario.redacted)
    assert isinstance(shown, str)
    assert REDACTED in shown
    assert key not in shown


@pytest.mark.parametrize("scenario", SCENARIO_PARAMS)
async def test_no_key_shape_leaks_from_any_failure(
    scenario: Scenario, canary_key: str, server_tls: ssl.SSLContext
) -> None:
    """Keys no credential pattern knows (hex, JWT, backslash, quotes, <, %) leak nowhere.

    Every check at once: str, repr, attributes, pickle, the locals of the traceback's
    frames, and (through the suite's canary guard) every log record at DEBUG.
    """
    error = await provoke(scenario, canary_key, server_tls)
    assert_error_clean(error)


# --- where the key does go --------------------------------------------------------------------


@pytest.mark.parametrize("key", KEYS)
async def test_the_key_travels_only_in_the_authorization_header(key: str) -> None:
    """On the wire the key appears once: as "Bearer <key>" in Authorization, nowhere else."""
    async with (
        FakeEndpoint([Reply.completion("ok")]) as ep,
        LLMClient(config_for(ep.url, key)) as client,
    ):
        await client.complete(HELLO)
    [request] = ep.requests
    assert request.header_values("Authorization") == (f"Bearer {key}",)
    elsewhere = [(n, v) for n, v in request.headers if n.lower() != "authorization" and key in v]
    assert (elsewhere, key in request.target, key.encode() in request.body) == ([], False, False)


# --- reprs of the public objects --------------------------------------------------------------


@pytest.mark.parametrize("key", KEYS)
async def test_reprs_of_config_secret_client_and_completion_hide_the_key(key: str) -> None:
    """LLMConfig, AgentConfig, Secret, LLMClient and Completion show no key in repr or str."""
    secret = Secret(key)
    async with FakeEndpoint([Reply.completion("ok", usage=(3, 4))]) as ep:
        config = config_for(ep.url, key)
        agent = AgentConfig.from_mapping({"llm": {"endpoint_url": ep.url, "api_key": key}}, env={})
        async with LLMClient(config) as client:
            completion = await client.complete(HELLO)
    shown = [
        repr(secret),
        str(secret),
        f"{secret}",
        f"{secret:>80}",
        "%s %r" % (secret, secret),  # noqa: UP031 - the old formatting path too
        repr(config),
        str(config),
        repr(config.to_redacted_dict()),
        repr(msgspec.structs.asdict(config)),
        repr(agent),
        repr(client),
        str(client),
        repr(completion),
        str(completion),
    ]
    assert [text for text in shown if key in text] == []
    assert secret.reveal() == key  # the value itself is still there for the header
    assert repr(secret) == "Secret('[REDACTED]')"


@pytest.mark.parametrize("key", KEYS)
def test_pickling_a_config_or_secret_never_writes_the_key(key: str) -> None:
    """Pickles of a Secret, an LLMConfig and an AgentConfig hold no copy of the key."""
    config = config_for("https://llm.example.com/v1/chat/completions", key)
    agent = AgentConfig(llm=config)
    for obj in (Secret(key), config, agent):
        assert key.encode() not in pickle.dumps(obj)


@pytest.mark.parametrize("key", KEYS)
def test_configuration_errors_never_show_the_key(key: str) -> None:
    """A configuration rejected for other reasons never quotes the key it was given."""
    with pytest.raises(ConfigError) as caught:
        LLMConfig(endpoint_url="ftp://llm.example.com/v1", api_key=Secret(key + " x"))
    assert leaks(caught.value, key) == []
    assert [p for p in caught.value.problems if key in str(p) or key in repr(p)] == []
    assert key.encode() not in pickle.dumps(caught.value)
