"""The session transcript: a public, versioned, redacted JSON Lines record of one session.

A :class:`TranscriptWriter` is an event sink: pass it as ``on_event`` to
:meth:`ToolLoop.run <metacrate_grid_agent.ToolLoop.run>` (after :meth:`~TranscriptWriter.begin`
wrote the session's header) and it writes one JSON object per line, per event::

    session      schema, v, library, session_id, generation, endpoint, config, llm (the
                 reply-reading settings), tools, system_prompt, goal (or initial_messages),
                 labels
    request      turn, request_id
    reply        turn, request_id, text, tool_calls [{id, name, arguments}], usage,
                 finish_reason, attempts, latency_s, attempt_records
    tool_call    turn, id, name, arguments, effect
    tool_result  turn, id, name, status, observation, latency_s
    compaction   turn
    finish       outcome, bound, cancel_reason, error {kind, message, status}, turns, calls,
                 usage, attempts, latency_s, compactions, final_text, records_dropped

Every record also has ``type``, ``seq`` (0, 1, 2, ...) and ``t`` (seconds since the header).
Every text from the endpoint or the executor is redacted (the key given to the writer, and
anything credential-shaped) and then cut to ``max_field_bytes``; a record that would still
pass ``max_record_bytes`` keeps its scalars only (``"oversized": true``); once
``max_total_bytes`` would be passed, further records are dropped and counted, and room is
kept for the ``finish`` record. A write error disables the writer (``error`` says why); the
session is never disturbed by its transcript.

:func:`load` reads a transcript back (bounded, schema-checked), :func:`replay` re-runs its
model side against the loopback fake endpoint and reports where the library now decides
differently, and :func:`report` / :func:`report_html` render a readable timeline.
"""

from __future__ import annotations

from metacrate_grid_agent import _public
from metacrate_grid_agent.errors import TranscriptError
from metacrate_grid_agent.transcript._load import Transcript, load
from metacrate_grid_agent.transcript._replay import Difference, ReplayReport, replay
from metacrate_grid_agent.transcript._report import report, report_data, report_html

# The format's bounds are importable here too (``X as X``), outside ``__all__``.
from metacrate_grid_agent.transcript._writer import (
    DEFAULT_MAX_FIELD_BYTES as DEFAULT_MAX_FIELD_BYTES,
)
from metacrate_grid_agent.transcript._writer import (
    DEFAULT_MAX_RECORD_BYTES as DEFAULT_MAX_RECORD_BYTES,
)
from metacrate_grid_agent.transcript._writer import (
    DEFAULT_MAX_TOTAL_BYTES as DEFAULT_MAX_TOTAL_BYTES,
)
from metacrate_grid_agent.transcript._writer import (
    MAX_ERROR_BYTES as MAX_ERROR_BYTES,
)
from metacrate_grid_agent.transcript._writer import (
    MAX_LIST_ITEMS as MAX_LIST_ITEMS,
)
from metacrate_grid_agent.transcript._writer import (
    MAX_RECORDS as MAX_RECORDS,
)
from metacrate_grid_agent.transcript._writer import (
    REPLY_SETTINGS as REPLY_SETTINGS,
)
from metacrate_grid_agent.transcript._writer import (
    SCHEMA,
    SCHEMA_VERSION,
    TextStream,
    TranscriptWriter,
)

__all__ = [
    "SCHEMA",
    "SCHEMA_VERSION",
    "Difference",
    "ReplayReport",
    "TextStream",
    "Transcript",
    "TranscriptError",
    "TranscriptWriter",
    "load",
    "replay",
    "report",
    "report_data",
    "report_html",
]

_public.claim(globals())
