"""The one exception tree of the library.

Every error the library raises is a :class:`GridAgentError`. Each class has a stable,
machine-readable ``kind`` (snake_case, listed on the guide's "Error kinds" page,
docs/guide/errors.md, and never renamed), a ``retryable`` flag, and the context of the call
that failed: ``request_id``, ``attempts`` and ``elapsed_s``. Messages say what happened and
what to do; they never contain the API key or a whole response body (at most a short,
scrubbed excerpt).

::

    GridAgentError
    ├── ConfigError                    configuration
    ├── InvalidMessageError            invalid_message
    ├── PromptTooLargeError            prompt_too_large
    ├── CancelledByCallerError         cancelled
    ├── TransportError
    │   ├── ConnectError               connect
    │   ├── TLSError                   tls
    │   ├── ConnectionLostError        connection_lost
    │   └── TimeoutExpiredError
    │       ├── ConnectTimeoutError    connect_timeout
    │       ├── RequestTimeoutError    request_timeout
    │       ├── ResponseIdleTimeoutError  response_idle_timeout
    │       └── TotalTimeoutError      total_timeout
    ├── HTTPStatusError                http_status
    │   └── RedirectRefusedError       redirect_refused
    ├── ResponseError
    │   ├── MalformedResponseError     malformed_response
    │   ├── ResponseTooLargeError      response_too_large
    │   ├── ContentEncodingError       content_encoding
    │   ├── MalformedJSONError         malformed_json
    │   ├── MissingMemberError         missing_member
    │   ├── InvalidValueError          invalid_value
    │   ├── OversizedValueError        oversized_value
    │   ├── EmptyChoicesError          empty_choices
    │   ├── MissingCallIdError         missing_call_id
    │   ├── DuplicateCallIdError       duplicate_call_id
    │   └── ChoiceError                choice_error
    ├── ToolLoopError
    │   ├── ToolDefinitionError        tool_definition
    │   ├── EmptyReplyError            empty_reply
    │   └── HistoryOverflowError       history_overflow
    ├── TranscriptError                transcript
    └── JournalError                   journal
        ├── JournalLockedError         journal_locked
        ├── JournalFencedError         journal_fenced
        └── JournalDivergenceError     journal_divergence

Errors pickle (``__reduce__``) so they can cross process boundaries intact.
"""

from __future__ import annotations

from typing import Any, ClassVar

__all__ = [
    "CancelledByCallerError",
    "ChoiceError",
    "ConfigError",
    "ConfigProblem",
    "ConnectError",
    "ConnectTimeoutError",
    "ConnectionLostError",
    "ContentEncodingError",
    "DuplicateCallIdError",
    "EmptyChoicesError",
    "EmptyReplyError",
    "GridAgentError",
    "HTTPStatusError",
    "HistoryOverflowError",
    "InvalidMessageError",
    "InvalidValueError",
    "JournalDivergenceError",
    "JournalError",
    "JournalFencedError",
    "JournalLockedError",
    "MalformedJSONError",
    "MalformedResponseError",
    "MissingCallIdError",
    "MissingMemberError",
    "OversizedValueError",
    "PromptTooLargeError",
    "RedirectRefusedError",
    "RequestTimeoutError",
    "ResponseError",
    "ResponseIdleTimeoutError",
    "ResponseTooLargeError",
    "TLSError",
    "TimeoutExpiredError",
    "ToolDefinitionError",
    "ToolLoopError",
    "TotalTimeoutError",
    "TranscriptError",
    "TransportError",
    "error_kinds",
]


def _restore(cls: type[GridAgentError], args: tuple[Any, ...], state: dict[str, Any]) -> Any:
    """Rebuild a pickled error without calling its ``__init__``."""
    error = Exception.__new__(cls)
    error.args = args
    error.__dict__.update(state)
    return error


class GridAgentError(Exception):
    """Base of every error raised by the library (abstract: never raised itself).

    Attributes:
        kind: stable snake_case identifier of the failure, for machines.
        retryable: whether the same request may succeed if sent again.
        request_id: the ``X-Request-Id`` of the call, when the error belongs to one.
        attempts: how many HTTP attempts the call made before this error.
        elapsed_s: seconds from the start of the call to this error.
        attempt_records: for a request that failed, the ``AttemptRecord`` of each attempt
            (statuses, error kinds, retry delays), as a successful reply carries them.
    """

    kind: ClassVar[str] = "error"
    default_retryable: ClassVar[bool] = False
    attempt_records: tuple[Any, ...] = ()

    def __init__(
        self,
        message: str,
        *,
        retryable: bool | None = None,
        request_id: str | None = None,
        attempts: int = 0,
        elapsed_s: float = 0.0,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.retryable = self.default_retryable if retryable is None else retryable
        self.request_id = request_id
        self.attempts = attempts
        self.elapsed_s = elapsed_s

    def with_context(
        self, *, request_id: str | None, attempts: int, elapsed_s: float
    ) -> GridAgentError:
        """Stamp the call's context on the error (once the call knows it) and return it."""
        self.request_id = request_id
        self.attempts = attempts
        self.elapsed_s = elapsed_s
        return self

    def __str__(self) -> str:
        return self.message

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(kind={self.kind!r}, message={self.message!r}, "
            f"retryable={self.retryable!r}, request_id={self.request_id!r}, "
            f"attempts={self.attempts!r})"
        )

    def __reduce__(self) -> tuple[Any, ...]:
        return (_restore, (type(self), self.args, dict(self.__dict__)))


# --- configuration and requests -------------------------------------------------------------


class ConfigProblem:
    """One problem found while validating a configuration: the key path, what is wrong."""

    __slots__ = ("key", "problem")

    def __init__(self, key: str, problem: str) -> None:
        self.key = key
        self.problem = problem

    def __str__(self) -> str:
        return f"{self.key}: {self.problem}"

    def __repr__(self) -> str:
        return f"ConfigProblem({self.key!r}, {self.problem!r})"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ConfigProblem):
            return NotImplemented
        return (self.key, self.problem) == (other.key, other.problem)

    def __hash__(self) -> int:
        return hash((self.key, self.problem))

    def __reduce__(self) -> tuple[Any, ...]:
        return (ConfigProblem, (self.key, self.problem))


class ConfigError(GridAgentError):
    """The configuration is invalid; ``problems`` lists every problem found, each with its key."""

    kind = "configuration"

    def __init__(self, problems: list[ConfigProblem] | tuple[ConfigProblem, ...]) -> None:
        self.problems = tuple(problems)
        lines = "; ".join(str(p) for p in self.problems)
        count = len(self.problems)
        noun = "problem" if count == 1 else "problems"
        super().__init__(f"invalid configuration ({count} {noun}): {lines}")


class InvalidMessageError(GridAgentError, ValueError):
    """A message, content part or tool definition was built with invalid values."""

    kind = "invalid_message"


class PromptTooLargeError(GridAgentError):
    """The serialised request body exceeds ``max_prompt_bytes``; nothing was sent."""

    kind = "prompt_too_large"

    def __init__(self, message: str, *, size: int, limit: int) -> None:
        super().__init__(message)
        self.size = size
        self.limit = limit


class CancelledByCallerError(GridAgentError):
    """The call was cancelled through its cancellation handle; ``reason`` says why."""

    kind = "cancelled"

    def __init__(self, message: str, *, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


# --- transport ------------------------------------------------------------------------------


class TransportError(GridAgentError):
    """The connection failed: nothing, or only part of a response, was received.

    Raised as itself (kind ``transport``) only for a client failure no subclass describes.
    """

    kind = "transport"
    default_retryable = True


class ConnectError(TransportError):
    """The endpoint could not be reached (refused, unreachable, name not resolved)."""

    kind = "connect"


class TLSError(TransportError):
    """The TLS handshake failed, for instance an untrusted certificate. Never retried."""

    kind = "tls"
    default_retryable = False


class ConnectionLostError(TransportError):
    """The connection was reset or closed before any response byte, or inside the body."""

    kind = "connection_lost"


class TimeoutExpiredError(TransportError):
    """One of the configured timeouts expired."""

    kind = "timeout"


class ConnectTimeoutError(TimeoutExpiredError):
    """No connection within ``connect_timeout_s``."""

    kind = "connect_timeout"


class RequestTimeoutError(TimeoutExpiredError):
    """One attempt, body included, took longer than ``request_timeout_s``."""

    kind = "request_timeout"


class ResponseIdleTimeoutError(TimeoutExpiredError):
    """The endpoint was silent for longer than ``response_idle_timeout_s``."""

    kind = "response_idle_timeout"


class TotalTimeoutError(TimeoutExpiredError):
    """The whole call (all attempts, waits and delays) passed ``total_timeout_s``."""

    kind = "total_timeout"
    default_retryable = False


# --- HTTP status ----------------------------------------------------------------------------


class HTTPStatusError(GridAgentError):
    """The endpoint answered with a non-2xx status.

    ``error_message``, ``error_type`` and ``error_code`` come from a JSON error body when it
    has one of the common shapes; ``excerpt`` is a short, scrubbed piece of any other body.
    """

    kind = "http_status"

    def __init__(
        self,
        message: str,
        *,
        status: int,
        retryable: bool,
        error_message: str | None = None,
        error_type: str | None = None,
        error_code: str | None = None,
        excerpt: str | None = None,
        retry_after_s: float | None = None,
    ) -> None:
        super().__init__(message, retryable=retryable)
        self.status = status
        self.error_message = error_message
        self.error_type = error_type
        self.error_code = error_code
        self.excerpt = excerpt
        self.retry_after_s = retry_after_s


class RedirectRefusedError(HTTPStatusError):
    """The endpoint answered with a redirect; it is never followed, so the key stays put."""

    kind = "redirect_refused"

    def __init__(self, message: str, *, status: int, location: str | None) -> None:
        super().__init__(message, status=status, retryable=False)
        self.location = location


# --- response protocol ----------------------------------------------------------------------


class ResponseError(GridAgentError):
    """A response could not be used. ``path`` is the JSON path of the offending member.

    The response arrived, so the endpoint may have acted on the request: never retried.
    """

    kind = "response"

    def __init__(self, message: str, *, path: str | None = None) -> None:
        super().__init__(message)
        self.path = path


class MalformedResponseError(ResponseError):
    """The response is not valid HTTP (status line, headers or framing), or the connection
    was lost partway through its head; ``path`` is None.

    Bytes of a response arrived, so the endpoint received the request and may have acted on
    it (and billed it): unlike a connection lost before any response, it is not retried.
    """

    kind = "malformed_response"


class ResponseTooLargeError(ResponseError):
    """The response body passed ``max_response_bytes``; reading stopped at the cap."""

    kind = "response_too_large"


class ContentEncodingError(ResponseError):
    """The response declared a ``Content-Encoding`` other than identity; nothing is decompressed."""

    kind = "content_encoding"


class MalformedJSONError(ResponseError):
    """The response body is not valid JSON (or not UTF-8)."""

    kind = "malformed_json"


class MissingMemberError(ResponseError):
    """A required member of the response is absent."""

    kind = "missing_member"


class InvalidValueError(ResponseError):
    """A member of the response has the wrong JSON type or an invalid value."""

    kind = "invalid_value"


class OversizedValueError(ResponseError):
    """A value of the response exceeds its configured bound (text, arguments, ids, calls)."""

    kind = "oversized_value"


class EmptyChoicesError(ResponseError):
    """The response has an empty ``choices`` array."""

    kind = "empty_choices"


class MissingCallIdError(ResponseError):
    """A tool call has an empty or absent id (see ``mint_missing_call_ids``)."""

    kind = "missing_call_id"


class DuplicateCallIdError(ResponseError):
    """Two tool calls share an id (within one response, or within one tool-loop session)."""

    kind = "duplicate_call_id"


class ChoiceError(ResponseError):
    """The choice reports an error (an ``error`` member or ``finish_reason`` "error")."""

    kind = "choice_error"


# --- tool loop ------------------------------------------------------------------------------


class ToolLoopError(GridAgentError):
    """The tool loop could not go on."""

    kind = "tool_loop"


class ToolDefinitionError(ToolLoopError):
    """A tool definition is invalid (name, description, schema); raised at registration."""

    kind = "tool_definition"


class EmptyReplyError(ToolLoopError):
    """The model ended the session with neither tool calls nor text: no action summary."""

    kind = "empty_reply"


class HistoryOverflowError(ToolLoopError):
    """The history cannot fit its envelope even after compaction; nothing was sent."""

    kind = "history_overflow"


# --- transcripts ----------------------------------------------------------------------------


class TranscriptError(GridAgentError, ValueError):
    """A transcript cannot be used: unreadable, not JSON Lines, another schema or version, a
    record of the wrong shape, or past a bound. Also a ``ValueError``, as it always was.

    ``line`` is the 1-based line to blame and ``path`` the field in it (``tool_calls[0].id``),
    when one is; the message names both and quotes at most a short, escaped excerpt.
    """

    kind = "transcript"

    def __init__(self, message: str, *, line: int | None = None, path: str | None = None) -> None:
        super().__init__(message)
        self.line = line
        self.path = path


# --- journals (durable sessions) -----------------------------------------------------------


class JournalError(GridAgentError):
    """A session journal cannot be used: it cannot be written or made durable (the action
    it guarded did not run), read back (not a journal, a broken hash chain, a record of the
    wrong shape, past a bound), or the run named has no journal (or already has one).
    ``run_id`` names the run when one is known."""

    kind = "journal"

    def __init__(self, message: str, *, run_id: str | None = None) -> None:
        super().__init__(message)
        self.run_id = run_id


class JournalLockedError(JournalError):
    """Another process holds the run's journal (it is running or resuming it): nothing was
    done. Resume it once that process has ended."""

    kind = "journal_locked"


class JournalFencedError(JournalError):
    """A newer generation of the session started since this run began: the run may not
    run a mutating call (it ends ``superseded``)."""

    kind = "journal_fenced"


class JournalDivergenceError(JournalError):
    """The journal does not match the resuming code (a changed tool, schema or loop
    setting), or a re-derived decision differs from the recorded one: nothing was done.
    ``difference`` names what differs."""

    kind = "journal_divergence"

    def __init__(self, message: str, *, run_id: str | None = None, difference: str = "") -> None:
        super().__init__(message, run_id=run_id)
        self.difference = difference


#: Branches of the tree that are never raised themselves.
_ABSTRACT: frozenset[type[GridAgentError]] = frozenset(
    {GridAgentError, ResponseError, TimeoutExpiredError, ToolLoopError}
)


def error_kinds() -> dict[str, type[GridAgentError]]:
    """Every kind the library can raise, mapped to its class (the guide's "Error kinds"
    page, docs/guide/errors.md, is checked against it)."""
    kinds: dict[str, type[GridAgentError]] = {}
    pending: list[type[GridAgentError]] = [GridAgentError]
    while pending:
        cls = pending.pop()
        pending.extend(cls.__subclasses__())
        if cls not in _ABSTRACT:
            kinds.setdefault(cls.kind, cls)
    return dict(sorted(kinds.items()))
