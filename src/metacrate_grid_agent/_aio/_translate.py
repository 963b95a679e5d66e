"""Our errors for what fails at the HTTP edge, and the one exit every error leaves by.

:func:`translate` maps a failure of the HTTP layer (:mod:`._http`), of ssl or of the OS
(:data:`LOW_LEVEL`) to the library's most specific error, keeping only a short, scrubbed
description of it and chaining nothing (no frame that held the request head stays
reachable). :func:`status_hint` says what an operator most likely got wrong
when the endpoint refused a request. :func:`at_exit` is what the client's one exit does to
every error before it is raised to the caller: drop the implicit context and redact the key
from every text the error carries.
"""

from __future__ import annotations

import re
import ssl
from typing import Final

from metacrate_grid_agent._aio._http import (
    BadResponseError,
    BodyCutOffError,
    ConnectExpiredError,
    HeadCutOffError,
    HTTPLayerError,
    IdleExpiredError,
    LostError,
)
from metacrate_grid_agent._core import _error_body, _redact
from metacrate_grid_agent._settings import parse_url
from metacrate_grid_agent.config import LLMConfig, shown_url
from metacrate_grid_agent.errors import (
    CancelledByCallerError,
    ConnectError,
    ConnectionLostError,
    ConnectTimeoutError,
    GridAgentError,
    MalformedResponseError,
    ResponseIdleTimeoutError,
    TLSError,
    TransportError,
)

__all__ = ["LOW_LEVEL", "at_exit", "status_hint", "translate"]


#: Everything the I/O edge translates: the HTTP layer's failures, TLS errors, and OS-level
#: errors (a connect that fails). The attempt's deadline is mapped by the client itself.
LOW_LEVEL: Final = (HTTPLayerError, ssl.SSLError, OSError, UnicodeError)
#: How a TLS handshake the endpoint ended without an alert comes back from connecting (the
#: TCP connection was made, so the server is up): asyncio and uvloop report a reset, or a
#: close as a ConnectionResetError without errno; the ssl module an EOF.
_HANDSHAKE_CUT: Final = (ConnectionResetError, ConnectionAbortedError, BrokenPipeError,
                         ssl.SSLEOFError)  # fmt: skip


def translate(
    exc: BaseException, config: LLMConfig, redactor: _redact.KeyRedactor
) -> GridAgentError:
    """Our error for a failure of the HTTP layer, ssl or the OS, to be raised ``from None``.

    Only a short, scrubbed description of the failure is kept, and nothing is chained.
    """
    if isinstance(exc, _HANDSHAKE_CUT) and parse_url(config.endpoint_url).scheme == "https":
        # Nothing of the request was sent, and a server restarting or a balancer under load
        # cuts handshakes too: retried, unlike a handshake the server refused with an alert.
        return TLSError(
            "the TLS handshake was cut: the endpoint took the connection, then ended it "
            f"without a TLS alert ({_short(exc, redactor)}); check that endpoint_url's port "
            "serves TLS, and that the server accepts TLS 1.2 or later",
            retryable=True,
        )
    if isinstance(exc, ssl.SSLError):
        return TLSError(
            f"TLS handshake with the endpoint failed ({_short(exc, redactor)}); check the "
            "certificate, or set ca_bundle for a private CA"
        )
    if isinstance(exc, ConnectExpiredError):
        return ConnectTimeoutError(
            f"no connection to the endpoint within connect_timeout_s = {config.connect_timeout_s}"
        )
    if isinstance(exc, IdleExpiredError):
        return ResponseIdleTimeoutError(
            "the endpoint was silent for longer than response_idle_timeout_s = "
            f"{config.response_idle_timeout_s}"
        )
    if isinstance(exc, HeadCutOffError):
        # Part of the head arrived: the endpoint answered, so it received the request and
        # may have acted on it. Not retried, like any response that does not parse.
        return MalformedResponseError(
            f"the connection was lost ({exc.lost_as}) after {exc.received} bytes of the "
            "response head; the request is not retried, as the endpoint may have acted on it",
            path=None,
        )
    if isinstance(exc, BodyCutOffError):
        # The 2xx head arrived: the endpoint acted on the request (and bills a 2xx), so
        # sending it again would run and pay for it twice. Not retried, like a head cut off.
        return MalformedResponseError(
            f"the connection was lost ({exc.lost_as}) inside the response body, after "
            f"{exc.received} bytes of it; the request is not retried, as the endpoint has "
            "answered it (and may bill it)",
            path=None,
        )
    if isinstance(exc, LostError):
        return ConnectionLostError(
            f"the connection was lost before any byte of the response arrived ({exc.lost_as})"
        )
    if isinstance(exc, BadResponseError):  # a response that does not parse
        # Not retried: the endpoint answered, so it received the request and may have acted
        # on it (and billed it). Only a connection lost before any response is retried.
        return MalformedResponseError(
            f"the endpoint sent an invalid HTTP response ({_short(exc, redactor)}); the "
            "request is not retried, as the endpoint may have acted on it",
            path=None,
        )
    if isinstance(exc, OSError):  # raised only while connecting
        return ConnectError(
            f"cannot connect to the endpoint ({_short(exc, redactor)}); check endpoint_url and "
            "that the server is up"
        )
    return TransportError(f"the request failed ({_short(exc, redactor)})", retryable=False)


def _short(exc: BaseException, redactor: _redact.KeyRedactor) -> str:
    """A short description of a low-level error."""
    text = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
    return _redact.scrub(f"{type(exc).__name__}: {text}" if text else type(exc).__name__,
                       redactor=redactor, limit=160)  # fmt: skip


#: Statuses of a refused request whose error, when it names a model, means "send a model".
_MODEL_STATUSES: Final = frozenset({400, 404, 422})
#: An error about the model member itself (absent, unknown), not one that merely mentions a
#: model ("this model's maximum context length is ...").
_ABOUT_MODEL: Final = re.compile(
    r"\bmodel\b[^.;]{0,60}?\b(?:required|missing|invalid|not found|does not exist|unknown|"
    r"not supplied|must be)|\b(?:invalid|unknown|missing|no|provide an?|specify an?)\b"
    r"[^.;]{0,30}?\bmodel\b|\bmodel=None\b",
    re.IGNORECASE,
)


#: Statuses of a refusal that, when its error speaks of auth or keys, means the key is wrong.
_KEY_STATUSES: Final = frozenset({400, 401, 403})
#: An error about the credential: auth, a key or token, or a gateway that cannot reach the
#: database of its keys (LiteLLM answers a key it does not know with "No connected db.").
_ABOUT_KEY: Final = re.compile(
    r"\bauth|\bunauthori[sz]ed\b|\b(?:api[ _-]?)?keys?\b|\btoken\b|\bcredential|"
    r"\bconnected db\b|\bdatabase\b",
    re.IGNORECASE,
)


def status_hint(status: int, details: _error_body.ErrorDetails, url: str) -> str:
    """What an operator most likely got wrong for this refusal, or "" when nothing fits.

    A 400/404/422 whose error is about the model: this client never sends a ``model``
    member, so the URL (or a gateway route) must select it. A 400/401/403 whose error
    speaks of auth, a key or the gateway's database: the key. A 304: something other than
    the endpoint answered a conditional request never sent. Otherwise a 404/405:
    ``endpoint_url`` is not the complete request URL; say what was sent.
    """
    said = " ".join(filter(None, (details.message, details.excerpt)))
    if status in _MODEL_STATUSES and _ABOUT_MODEL.search(said):
        return (
            " (hint: the endpoint wants a 'model' member, which this client never sends: "
            "endpoint_url must select the model (check the name in it), or a gateway route "
            'in front must; see "Works with" in the README)'
        )
    if status in _KEY_STATUSES and _ABOUT_KEY.search(said):
        return (
            " (hint: check the key: its source (api_key, api_key_env, api_key_file) and "
            "that this endpoint or gateway issued it)"
        )
    if status == 304:
        return (
            " (hint: a 304 Not Modified answers a conditional request (If-None-Match, "
            "If-Modified-Since), which this client never sends: a cache or proxy between it "
            "and the endpoint answered in the endpoint's place)"
        )
    if status in (404, 405):
        return (
            " (hint: endpoint_url is the complete request URL, usually ending in "
            f"/chat/completions; sent: POST {shown_url(url)})"
        )
    return ""


def at_exit(error: GridAgentError, rid: str, redactor: _redact.KeyRedactor) -> GridAgentError:
    """``error`` made fit to leave the client by its one exit, and returned.

    Its implicit context is dropped (a low-level error whose frames held the request
    head), and the key is redacted from whatever the endpoint
    echoed into it, unless it is the token's own cancellation of request ``rid``.
    """
    error.__context__ = None
    if not _own_cancellation(error, rid, redactor):
        _redact_error(error, redactor)
    return error


def _own_cancellation(error: GridAgentError, rid: str, redactor: _redact.KeyRedactor) -> bool:
    """Whether ``error`` is the token's cancellation of request ``rid`` and nothing else.

    Then its only texts are the library's wording, the request id (not secret: it goes out
    as ``X-Request-Id`` and is stamped unredacted on every error) and the cancellation's
    reason, which is the operator's text: the reason alone is checked (a short word, not the
    whole message), and any other shape of error gets the full redaction. A supersession of
    thousands of sessions at once pays for one short check each, not four redactions.
    """
    if type(error) is not CancelledByCallerError:
        return False
    reason = error.reason
    message = f"request {rid} was cancelled ({reason})"
    if error.args != (message,) or error.message != message:
        return False
    for name, value in vars(error).items():
        if isinstance(value, str) and name not in ("message", "reason"):
            return False
    return redactor.redact(reason) == reason


def _redact_error(error: GridAgentError, redactor: _redact.KeyRedactor) -> None:
    """Redact the key from every text the error carries (message, excerpt, location...)."""
    for name, value in vars(error).items():
        if isinstance(value, str):
            setattr(error, name, _redact.redact(value, redactor=redactor))
    error.args = tuple(
        _redact.redact(arg, redactor=redactor) if isinstance(arg, str) else arg
        for arg in error.args
    )
