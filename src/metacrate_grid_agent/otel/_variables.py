"""The standard variables the GenAI instrumentations read, read the same way here.

``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT`` turns content capture on when the
application did not choose. Its values moved with the conventions: by default ``true`` turns
it on (any case); with ``gen_ai_latest_experimental`` in the comma-separated
``OTEL_SEMCONV_STABILITY_OPT_IN`` it takes the latest values instead (``NO_CONTENT``,
``SPAN_ONLY``, ``EVENT_ONLY``, ``SPAN_AND_EVENT``, any case), as
opentelemetry-instrumentation's ``_semconv`` and opentelemetry-util-genai read them. Content
goes on spans only (this package emits no log events), so ``SPAN_ONLY`` and ``SPAN_AND_EVENT``
turn it on; anything else, unknown values included, leaves it off. Nothing else moves: the
names emitted are the latest ones whatever the opt-in says.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

__all__ = ["CAPTURE_CONTENT_VARIABLE", "STABILITY_VARIABLE", "capture_content"]

#: The standard switch for content capture, read when the application did not choose.
CAPTURE_CONTENT_VARIABLE: Final = "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"
#: The conventions' opt-in list; only its GenAI value is read here.
STABILITY_VARIABLE: Final = "OTEL_SEMCONV_STABILITY_OPT_IN"
#: The opt-in value that selects the latest experimental GenAI conventions.
LATEST_EXPERIMENTAL: Final = "gen_ai_latest_experimental"
#: Under that opt-in, the capture modes that put content on spans.
_ON_SPANS: Final = frozenset({"SPAN_ONLY", "SPAN_AND_EVENT"})


def latest_experimental(environ: Mapping[str, str]) -> bool:
    """Whether ``OTEL_SEMCONV_STABILITY_OPT_IN`` lists ``gen_ai_latest_experimental``."""
    listed = environ.get(STABILITY_VARIABLE, "")
    return LATEST_EXPERIMENTAL in (value.strip() for value in listed.split(","))


def capture_content(environ: Mapping[str, str]) -> bool:
    """Whether the standard variables turn content capture on (see the module docstring)."""
    value = environ.get(CAPTURE_CONTENT_VARIABLE, "").strip()
    if latest_experimental(environ):
        return value.upper() in _ON_SPANS
    return value.lower() == "true"
