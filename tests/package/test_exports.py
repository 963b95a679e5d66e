"""The public API is exactly what `__all__` says, and `__all__` is pinned here."""

from __future__ import annotations

import importlib

import pytest

PUBLIC = {
    "metacrate_grid_agent": [
        "AgentConfig", "Ambiguous", "ApprovalRequest", "Approved", "Approver",
        "AssistantMessage", "AttemptRecord", "CallRecord", "CancelToken", "Completion", "Denied",
        "Effect", "Failure", "FunctionCall", "FunctionDefinition", "GC_THRESHOLDS",
        "GridAgentError", "HistoryEncoder", "ImagePart", "ImageURL", "Journal", "JournalRun",
        "LLMClient", "LLMConfig",
        "LoopEvent",
        "LoopResult", "Message", "Outcome", "OversizedToolCall", "ProgressEvent", "Secret",
        "SessionGeneration", "RegisteredTool", "ToolRegistry",
        "Success",
        "Summarizer", "SystemMessage", "TextPart", "Tool", "ToolCall", "ToolDefinition",
        "ToolExecutor", "ToolLoop", "ToolLoopConfig", "ToolMessage", "ToolOutcome", "Usage",
        "UsageRecord", "UsageTotals", "UserMessage", "ValidatedCall", "__version__",
        "tune_gc_for_many_sessions", "validate_tools",
    ],
    "metacrate_grid_agent.testing": [
        "ConnectionRecord", "FakeEndpoint", "RecordedRequest", "Reply", "Responder",
        "ScriptItem", "ToolCallSpec",
    ],
    "metacrate_grid_agent.otel": [
        "GenAITelemetry",
        "RequestTelemetry",
        "SessionTelemetry",
        "TelemetryExport",
        "configure_from_environment",
        "export_requested",
    ],
    "metacrate_grid_agent.transcript": [
        "SCHEMA", "SCHEMA_VERSION", "Difference", "ReplayReport", "Transcript", "TranscriptError",
        "TranscriptWriter", "load", "replay", "report", "report_data", "report_html", "TextStream",
    ],
    "metacrate_grid_agent.journal": [
        "AMBIGUOUS_ON_RESUME", "Call", "Cut", "DroppedArguments", "FileJournal",
        "Finish", "FinishReport", "Header", "Journal", "JournalRun", "ModelError", "Record",
        "Reply", "Request", "Result", "ShownCall", "Summary", "ToolPrint", "Verdict",
        "decode_record", "encode_record", "is_commit", "parse_run_id", "run_id",
    ],
    "metacrate_grid_agent.dbos": [
        "CallSummary", "DBOSApprover", "DBOSJournal", "DBOSJournalRun", "DurableSessions",
        "LoopBuilder", "MsgspecJSON", "SessionOutcome", "SessionSpec", "application_version",
        "dbos_config", "take_over",
    ],
    "metacrate_grid_agent.config": [
        "LLM_SETTINGS", "TOOL_LOOP_SETTINGS", "AgentConfig", "LLMConfig", "McpServerSettings",
        "Secret", "Setting", "ToolLoopConfig",
    ],
}  # fmt: skip


@pytest.mark.parametrize("module_name", sorted(PUBLIC))
def test_all_is_pinned(module_name: str) -> None:
    """Adding or removing a public name is a deliberate change to this list."""
    module = importlib.import_module(module_name)
    assert sorted(module.__all__) == sorted(PUBLIC[module_name])


@pytest.mark.parametrize("module_name", [*sorted(PUBLIC), "metacrate_grid_agent.errors"])
def test_every_exported_name_exists_and_is_public(module_name: str) -> None:
    """Every name in `__all__` resolves, and no private module leaks through a name."""
    module = importlib.import_module(module_name)
    for name in module.__all__:
        assert hasattr(module, name), name


def test_errors_export_every_error_class() -> None:
    """Every class of the error tree is importable from `metacrate_grid_agent.errors`."""
    from metacrate_grid_agent import errors

    classes = {
        name
        for name, value in vars(errors).items()
        if isinstance(value, type) and issubclass(value, errors.GridAgentError)
    }
    assert classes <= set(errors.__all__)


#: The public home of what an application writing its own front end needs: the one escaping
#: rule, the redactor of a secret, and the file reader and writer (the command uses these).
SAFETY = [
    "ReadFile", "RefusedFileError", "SecretRedactor", "display_safe", "open_private",
    "read_regular",
]  # fmt: skip


def test_safety_all_is_pinned_sorted_and_resolves() -> None:
    """``metacrate_grid_agent.safety`` exports exactly these names, sorted, each defined."""
    module = importlib.import_module("metacrate_grid_agent.safety")
    assert module.__all__ == SAFETY
    assert sorted(SAFETY) == SAFETY
    assert [name for name in SAFETY if not hasattr(module, name)] == []
