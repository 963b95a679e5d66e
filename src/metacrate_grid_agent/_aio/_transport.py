"""The HTTP edge: the client that posts to exactly one configured URL.

It serialises the request once (:func:`~metacrate_grid_agent._core._request.encode_request`),
sends it through the keep-alive pool of :mod:`._http` (our own HTTP/1.1 on llhttp, the only
code that touches a socket), asks the pure retry policy (:mod:`~metacrate_grid_agent._core._retry`)
what to do after each failed attempt, and translates every low-level failure into the
library's own errors at one place (:func:`~._translate.translate`), chaining nothing that
could hold the ``Authorization`` header; every error leaves :meth:`LLMClient.complete` by
one exit (:func:`~._translate.at_exit`). It touches no private part of asyncio.

Guarantees enforced here: no redirect is followed, nothing is decompressed, no cookie is
kept, no proxy is read from the environment, five independent timeouts, at most
``max_concurrent_requests`` requests in flight, and the key appears only in the header.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import logging
import re
import ssl
from collections.abc import Callable, Mapping, Sequence
from typing import Final, NoReturn

from metacrate_grid_agent._aio._cancel import CancelToken
from metacrate_grid_agent._aio._http import (
    DeadlineExpiredError,
    Pool,
    RequestHead,
    Response,
)
from metacrate_grid_agent._aio._progress import Progress, ProgressEvent
from metacrate_grid_agent._aio._slots import Slots
from metacrate_grid_agent._aio._translate import LOW_LEVEL, at_exit, status_hint, translate
from metacrate_grid_agent._core import _error_body, _redact, _request, _wire
from metacrate_grid_agent._core._retry import (
    AttemptRecord,
    GiveUp,
    Retry,
    RetryPolicy,
    parse_retry_after,
)
from metacrate_grid_agent._core._retry import is_retryable_status as _is_retryable_status
from metacrate_grid_agent._core._types import Completion, Message, ToolDefinition
from metacrate_grid_agent._settings import parse_url
from metacrate_grid_agent._version import __version__
from metacrate_grid_agent.config import LLMConfig, shown_url
from metacrate_grid_agent.errors import (
    ContentEncodingError,
    GridAgentError,
    HTTPStatusError,
    InvalidMessageError,
    PromptTooLargeError,
    RedirectRefusedError,
    RequestTimeoutError,
    ResponseTooLargeError,
    TLSError,
    TotalTimeoutError,
)

__all__ = ["LLMClient"]

logger = logging.getLogger("metacrate_grid_agent")
#: Whether an attempt's record would be logged (the check, without a call of ours first).
_INFO_ENABLED: Final = functools.partial(logger.isEnabledFor, logging.INFO)

USER_AGENT: Final = f"metacrate-grid-agent/{__version__}"
#: Longest correlation id (it travels in the X-Request-Id header).
MAX_CORRELATION_ID_LENGTH: Final = 128
_CORRELATION_ID: Final = re.compile(r"\A[A-Za-z0-9._:-]+\Z", re.ASCII)
#: Longest Location excerpt kept on a refused redirect.
MAX_LOCATION_EXCERPT: Final = 200


def _check_correlation_id(value: str) -> str:
    if (
        not isinstance(value, str)
        or len(value) > MAX_CORRELATION_ID_LENGTH
        or _CORRELATION_ID.match(value) is None
    ):
        raise InvalidMessageError(
            f"correlation id must be 1 to {MAX_CORRELATION_ID_LENGTH} of letters, digits "
            "and . _ : -"
        )
    return value


def _build_ssl_context(config: LLMConfig, scheme: str) -> ssl.SSLContext | None:
    """Verification always on, TLS 1.2 at least; built only for https (loading the CA
    store costs ~40 ms)."""
    if scheme != "https":
        return None
    context = ssl.create_default_context(cafile=config.ca_bundle)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    return context


#: Not Modified: the answer to a conditional request (this client sends none), not a
#: redirect: reported as the status it is (its body, which it never has, is never read).
_NOT_MODIFIED: Final = 304


class LLMClient:
    """A client for one OpenAI-compatible chat-completions endpoint.

    Use it as an async context manager (or call :meth:`aclose`)::

        async with LLMClient(config) as client:
            completion = await client.complete([UserMessage(content="hello")])

    Every call POSTs to exactly ``config.endpoint_url``. At most ``max_concurrent_requests``
    calls are in flight; the others wait, and the wait counts toward ``total_timeout_s``.

    ``on_progress`` (optional) is called with a :class:`ProgressEvent` at each attempt's
    start, each phase (connecting, waiting for headers, reading the body), each retry (its
    reason and delay) and each call's end, for every call of this client (a
    :class:`ToolLoop` using it included). Without it, no phase is reported at all.
    """

    def __init__(
        self,
        config: LLMConfig,
        *,
        correlation_id: str = "grid-agent",
        on_progress: Callable[[ProgressEvent], None] | None = None,
    ) -> None:
        if not isinstance(config, LLMConfig):
            raise TypeError("LLMClient takes an LLMConfig")
        self._config = config
        self._progress = None if on_progress is None else Progress(on_progress)
        self._correlation_id = _check_correlation_id(correlation_id)
        self._limits = _wire.ReplyLimits.from_config(config)
        self._policy = RetryPolicy(
            max_retries=config.max_retries, max_retry_delay_s=config.max_retry_delay_s
        )
        self._url = parse_url(config.endpoint_url)  # checked by LLMConfig
        self._sequence = itertools.count(1)
        # Error paths get this, never the key: no frame below complete() holds it.
        self._redactor = _redact.KeyRedactor(config.api_key.reveal())
        self._pool: Pool | None = None
        self._slots: Slots | None = None
        self._closed = False
        # The last tools tuple sent and its JSON: a loop sends the same tuple every turn.
        self._tools_json: tuple[tuple[ToolDefinition, ...], bytes] | None = None
        # The bytes of the last request's messages, for a caller that passes no encoder of
        # its own and sends the same history again (grown): those messages are not encoded
        # again. It holds what the last such request held.
        self._encoder = _request.HistoryEncoder()
        # The request-target byte for byte as configured; only the id and length vary.
        self._head = RequestHead(
            self._url.target,
            self._url.authority,
            [
                ("Authorization", f"Bearer {config.api_key.reveal()}"),
                ("Content-Type", "application/json"),
                ("Accept", "application/json"),
                ("Accept-Encoding", "identity"),
                ("User-Agent", USER_AGENT),
            ],
        )

    def __repr__(self) -> str:
        return f"LLMClient(endpoint_url={shown_url(self._config.endpoint_url)!r})"

    def __reduce__(self) -> NoReturn:
        raise TypeError(
            "an LLMClient holds open connections and a credential; it cannot be pickled"
        )

    @property
    def config(self) -> LLMConfig:
        """The configuration this client was built with."""
        return self._config

    async def __aenter__(self) -> LLMClient:
        self._ensure_pool()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close every connection. The client cannot be used afterwards."""
        self._closed = True
        pool, self._pool = self._pool, None
        if pool is not None:
            await pool.aclose()

    def _ensure_pool(self) -> Pool:
        if self._closed:
            raise RuntimeError("this LLMClient is closed")
        if self._pool is None:
            config = self._config
            url = self._url
            try:
                ssl_context = _build_ssl_context(config, url.scheme)
            except (OSError, ssl.SSLError) as exc:  # the CA bundle changed since validation
                raise TLSError(
                    f"cannot load ca_bundle ({type(exc).__name__}); check the file"
                ) from None
            assert url.host is not None  # noqa: S101 - a checked URL has a host
            assert url.port is not None  # noqa: S101 - and a port of http or https
            self._pool = Pool(
                host=url.host,
                port=url.port,
                ssl_context=ssl_context,
                connect_timeout_s=config.connect_timeout_s,
                idle_s=config.response_idle_timeout_s,
                pool_idle_s=config.pool_idle_timeout_s,
                body_cap=config.max_response_bytes,
                error_cap=min(_error_body.MAX_ERROR_BODY_BYTES, config.max_response_bytes),
            )
            self._slots = Slots(config.max_concurrent_requests)
        return self._pool

    def next_request_id(self, correlation_id: str | None = None) -> str:
        """The next deterministic request id: ``<correlation id>-<sequence number>``."""
        # The client's own prefix was checked in __init__; only a new one is checked here.
        prefix = self._correlation_id if correlation_id is None else correlation_id
        if correlation_id is not None:
            _check_correlation_id(prefix)
        return f"{prefix}-{next(self._sequence)}"

    async def complete(
        self,
        messages: Sequence[Message],
        tools: Sequence[ToolDefinition] = (),
        *,
        request_id: str | None = None,
        cancel: CancelToken | None = None,
        attempt_log: list[AttemptRecord] | None = None,
        encoder: _request.HistoryEncoder | None = None,
    ) -> Completion:
        """Send one chat-completions request, retrying transient failures; return the reply.

        ``request_id`` (default: the next id of this client) goes out as ``X-Request-Id`` and
        seeds the deterministic retry jitter. ``cancel`` cancels the call from outside: the
        connection is closed, no retry starts, and :class:`CancelledByCallerError` is raised.
        Every error raised carries the request id, the attempts made and the time elapsed.
        A tuple of ``tools`` is serialised once and reused while the same tuple is passed
        (pass a new tuple to change the tools). ``attempt_log``, an empty list, receives the
        record of each attempt as it ends, so a call that fails or is cut keeps them too.
        ``encoder``, the conversation's own :class:`HistoryEncoder`, encodes only the
        messages it has not sent before (the same bytes as without it); without one, the
        client's own keeps the last request's messages, so a history sent again is encoded
        only from where it changed.
        """
        rid = (  # next_request_id(), without its call
            f"{self._correlation_id}-{next(self._sequence)}"
            if request_id is None
            else _check_correlation_id(request_id)
        )
        loop = asyncio.get_running_loop()
        started = loop.time()
        records: list[AttemptRecord] = [] if attempt_log is None else attempt_log
        try:
            # The body's pieces as the encoder keeps them (the client never joins them).
            cached = self._tools_json  # the last tuple's JSON, without a call when it is
            tools_json = (
                cached[1]
                if cached is not None and cached[0] is tools
                else self._encoded_tools(tools)
            )
            body, size = (self._encoder if encoder is None else encoder).body_pieces(
                messages, tools, tools_json=tools_json
            )
            if size > self._config.max_prompt_bytes:
                raise PromptTooLargeError(
                    f"the request body is {size} bytes, over max_prompt_bytes = "
                    f"{self._config.max_prompt_bytes}; shorten the history or raise the limit",
                    size=size,
                    limit=self._config.max_prompt_bytes,
                )
            # The attempts run in this coroutine (none of their own: a frame fewer per
            # request), bound to ``cancel`` as ``with cancel.bound(...)`` binds a block:
            # entered here, left with the exception that ends them, or with none.
            scope = None if cancel is None else cancel.bound(f"request {rid}")
            if scope is not None:
                scope.__enter__()
            try:
                config = self._config
                pool = self._pool  # made, and not closed (aclose drops it); else made or refused
                if pool is None:
                    pool = self._ensure_pool()
                slots = self._slots
                assert slots is not None  # noqa: S101 - made with the pool
                # The whole request as its pieces: the head, then the body as the encoder keeps it
                # (the older messages' block and the newer ones), never joined here: a history's
                # bytes are not copied again for every request (see Pool.send).
                request = [self._head.render(rid, size), *body]
                total_deadline = started + config.total_timeout_s
                if not slots.take_free():  # a free slot is taken at once, with no timer
                    try:
                        async with asyncio.timeout_at(total_deadline):
                            await slots.acquire()
                    except TimeoutError:
                        raise _total_timeout(config) from None
                progress = self._progress
                on_phase = None if progress is None else functools.partial(progress.phase, rid)
                try:
                    attempt = 0
                    while True:
                        attempt += 1
                        attempt_started = loop.time()
                        if progress is not None:
                            progress.attempt(rid, attempt, started)
                        # One attempt (no coroutine of its own: one fewer frame per request). One
                        # deadline ends it at the request timeout or at the call's total deadline,
                        # whichever comes first; the pool enforces it with the response-idle limit
                        # on one timer, and its expiry is reported as the timeout that set it.
                        request_deadline = attempt_started + config.request_timeout_s
                        deadline = (  # the earlier of the two (min() costs a call per request)
                            request_deadline
                            if request_deadline <= total_deadline
                            else total_deadline
                        )
                        try:
                            try:
                                response = await pool.send(request, b"", deadline, on_phase)
                            except DeadlineExpiredError:
                                raise _expired(config, request_deadline, total_deadline) from None
                            except LOW_LEVEL as exc:
                                raise translate(exc, config, self._redactor) from None
                            # A whole 2xx identity body within the cap (nearly every reply) is the
                            # reply as it is; anything else is read by _read_response.
                            if (
                                200 <= response.status < 300
                                and response.complete
                                and "content-encoding" not in response.headers
                            ):
                                reply = response.body
                            else:
                                reply = self._read_response(response)
                        except asyncio.CancelledError:
                            # Cut from outside mid-attempt: the attempt was made and counts.
                            records.append(
                                _record(attempt, "cancelled", None, loop.time() - attempt_started)
                            )
                            raise
                        except GridAgentError as exc:
                            latency = loop.time() - attempt_started
                            status = getattr(exc, "status", None)
                            decision = self._policy.decide(
                                attempt=attempt,
                                retryable=exc.retryable,
                                retry_after_s=getattr(exc, "retry_after_s", None),
                                request_id=rid,
                                elapsed_s=loop.time() - started,
                                total_timeout_s=config.total_timeout_s,
                            )
                            # A client closed meanwhile starts nothing new.
                            retry = (
                                None if isinstance(decision, GiveUp) or self._closed else decision
                            )
                            records.append(_record(attempt, exc.kind, status, latency, retry))
                            _log_attempt(rid, attempt, exc.kind, status, latency)
                            if retry is None:
                                raise
                            if progress is not None:
                                shown = (
                                    exc.kind if status is None else f"{exc.kind} (HTTP {status})"
                                )
                                progress.retry(rid, shown, retry.delay_s)
                            await asyncio.sleep(retry.delay_s)
                            continue
                        ended = loop.time()  # one read: the attempt's latency and the call's
                        latency = ended - attempt_started
                        records.append(AttemptRecord(attempt, "ok", 200, None, latency, None, None))
                        if _INFO_ENABLED():
                            _log_attempt(rid, attempt, "ok", 200, latency)
                        parsed = _wire.decode_reply(
                            reply, self._limits, request_id=rid, redactor=self._redactor
                        )
                        return Completion(  # positional, in its order: cheaper than by name
                            parsed.text,
                            parsed.tool_calls,
                            parsed.minted_call_ids,
                            parsed.usage,
                            parsed.finish_reason,
                            rid,
                            attempt,
                            ended - started,
                            tuple(records),
                            parsed.response_id,
                            parsed.response_model,
                        )
                finally:
                    slots.release()
                    if progress is not None:
                        progress.end(rid)
            except BaseException as exc:
                # Neither the request (its head holds the key) nor the reply (what the endpoint
                # echoed) stays in this frame, which the error's traceback keeps (the
                # attempts' own frame used to end with them; the canary tests read it).
                request = []
                reply = b""
                left, scope = scope, None
                # The scope raises its own error for its cut; it never swallows one.
                if left is not None and left.__exit__(type(exc), exc, exc.__traceback__):
                    raise AssertionError("a cancel scope swallowed an exception") from exc
                raise
            finally:
                if scope is not None:
                    scope.__exit__(None, None, None)
        except GridAgentError as exc:
            # The one exit of every error: no implicit context, the key redacted from what
            # the endpoint echoed (at_exit), and no traceback (its frames hold the headers).
            error = at_exit(exc, rid, self._redactor).with_context(
                request_id=rid, attempts=len(records), elapsed_s=loop.time() - started
            )
            error.attempt_records = tuple(records)
            raise error.with_traceback(None) from None

    def _encoded_tools(self, tools: Sequence[ToolDefinition]) -> bytes | None:
        """The JSON of ``tools``, serialised once per tuple (None for any other sequence).

        A tool loop passes its registry's tuple every turn; its definitions are frozen
        copies, so the bytes of the first request stay right for the whole session.
        """
        cached = self._tools_json
        if cached is not None and cached[0] is tools:
            return cached[1]
        if isinstance(tools, tuple) and tools:
            encoded = _request.encode_tools(tools)
            self._tools_json = (tools, encoded)
            return encoded
        return None

    def _read_response(self, response: Response) -> bytes:
        config = self._config
        status = response.status
        headers = response.headers
        if 300 <= status < 400 and status != _NOT_MODIFIED:
            location = headers.get("location")
            raise RedirectRefusedError(
                f"the endpoint answered {status} (a redirect); redirects are never followed, "
                "so set endpoint_url to the final URL",
                status=status,
                location=None
                if location is None
                else _redact.scrub(
                    shown_url(location), redactor=self._redactor, limit=MAX_LOCATION_EXCERPT
                ),
            )
        coding = headers.get("content-encoding")  # folded only when there is one
        encoding = "identity" if coding is None else coding.strip().lower()
        if not 200 <= status < 300:
            self._raise_status(response, encoding)
        if encoding not in ("", "identity"):
            shown = _redact.scrub(encoding, redactor=self._redactor, limit=40)
            raise ContentEncodingError(
                f"the response is {shown!r}-encoded; nothing is decompressed, so the "
                "endpoint must answer 'Accept-Encoding: identity' with an identity body",
                path=None,
            )
        cap = config.max_response_bytes
        if response.declared is not None:
            raise ResponseTooLargeError(
                f"the response declares {response.declared} bytes, over max_response_bytes = {cap}",
            )
        if response.over_cap:
            raise ResponseTooLargeError(
                f"the response passed max_response_bytes = {cap}; reading stopped there",
            )
        return response.body

    def _raise_status(self, response: Response, encoding: str) -> NoReturn:
        status = response.status
        retryable = _is_retryable_status(status)
        details = _error_body.ErrorDetails(message=None, type=None, code=None, excerpt=None)
        if encoding in ("", "identity"):
            # Only as much of an error body as its parser reads (the pool reads no more);
            # a body that breaks off or stalls comes as b"": the status is what matters, and
            # a 401 must not turn into a retryable connection error (and send the key again).
            details = _error_body.parse_error_body(
                response.body,
                redactor=self._redactor,
                content_type=response.headers.get("content-type"),
            )
        retry_after = _retry_after(response.headers)
        reason = _redact.scrub(response.reason or "", redactor=self._redactor)
        summary = details.message or details.excerpt or reason or "no detail"
        raise HTTPStatusError(
            f"the endpoint answered HTTP {status}: {summary}"
            + status_hint(status, details, self._config.endpoint_url)
            + (" (retryable)" if retryable else ""),
            status=status,
            retryable=retryable,
            error_message=details.message,
            error_type=details.type,
            error_code=details.code,
            excerpt=details.excerpt,
            retry_after_s=retry_after,
        )


def _record(
    attempt: int,
    error_kind: str | None,
    status: int | None,
    latency: float,
    retry: Retry | None = None,
) -> AttemptRecord:
    """The record of one attempt: ok when ``error_kind`` is None."""
    return AttemptRecord(
        attempt=attempt,
        outcome="ok" if error_kind is None else "error",
        status=status,
        error_kind=error_kind,
        latency_s=latency,
        delay_s=None if retry is None else retry.delay_s,
        delay_source=None if retry is None else retry.source,
    )


def _expired(config: LLMConfig, request_deadline: float, total_deadline: float) -> GridAgentError:
    """The error of an attempt whose deadline passed: the timeout that set the deadline."""
    if total_deadline <= request_deadline:
        return _total_timeout(config)
    return RequestTimeoutError(
        f"one attempt took longer than request_timeout_s = {config.request_timeout_s}"
    )


def _total_timeout(config: LLMConfig) -> TotalTimeoutError:
    return TotalTimeoutError(
        f"the call did not finish within total_timeout_s = {config.total_timeout_s} "
        "(concurrency wait, attempts and retry delays included)"
    )


def _retry_after(headers: Mapping[str, str]) -> float | None:
    return parse_retry_after(headers.get("retry-after"), headers.get("retry-after-ms"))


def _log_attempt(rid: str, attempt: int, outcome: str, status: int | None, latency: float) -> None:
    if not logger.isEnabledFor(logging.INFO):
        return  # skip building the record's extra fields on the hot path
    logger.info(
        "request %s attempt %d: %s (status %s) in %.1f ms",
        rid,
        attempt,
        outcome,
        status,
        latency * 1000.0,
        extra={
            "request_id": rid,
            "attempt": attempt,
            "outcome": outcome,
            "status": status,
            "latency_s": latency,
        },
    )
