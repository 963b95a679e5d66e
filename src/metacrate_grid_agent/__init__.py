"""metacrate-grid-agent: a grid agent's hardened connection to one language-model endpoint.

Two parts:

- :class:`LLMClient` posts to exactly one OpenAI-compatible chat-completions URL, with
  redirects refused, nothing decompressed, five independent timeouts, hard ceilings on
  every size, and retries of transient failures only.
- :class:`ToolLoop` turns the model's tool calls into validated calls of your
  :class:`ToolExecutor`, one at a time, within bounds on turns, calls, history, time and
  usage, and stops superseded work (:class:`SessionGeneration`) before it acts. An
  optional :class:`Approver` lets an operator allow or refuse each mutating call first.

With thousands of sessions in one process, call :func:`tune_gc_for_many_sessions` once at
start-up.

Errors live in :mod:`metacrate_grid_agent.errors`, configuration in
:mod:`metacrate_grid_agent.config`, and a loopback fake endpoint for tests in
:mod:`metacrate_grid_agent.testing`.
"""

from metacrate_grid_agent import _public
from metacrate_grid_agent._aio._cancel import CancelToken
from metacrate_grid_agent._aio._gc import GC_THRESHOLDS, tune_gc_for_many_sessions
from metacrate_grid_agent._aio._generation import SessionGeneration
from metacrate_grid_agent._aio._progress import ProgressEvent
from metacrate_grid_agent._aio._protocols import Approver, Summarizer, ToolExecutor
from metacrate_grid_agent._aio._tool_loop import LoopEvent, ToolLoop
from metacrate_grid_agent._aio._transport import LLMClient
from metacrate_grid_agent._core._request import HistoryEncoder
from metacrate_grid_agent._core._results import (
    CallRecord,
    LoopResult,
    Outcome,
    UsageRecord,
    UsageTotals,
)
from metacrate_grid_agent._core._retry import AttemptRecord
from metacrate_grid_agent._core._schema import RegisteredTool, ToolRegistry, validate_tools
from metacrate_grid_agent._core._tools import (
    Ambiguous,
    ApprovalRequest,
    Approved,
    Denied,
    Effect,
    Failure,
    Success,
    Tool,
    ToolOutcome,
    ValidatedCall,
)
from metacrate_grid_agent._core._types import (
    AssistantMessage,
    Completion,
    FunctionCall,
    FunctionDefinition,
    ImagePart,
    ImageURL,
    Message,
    SystemMessage,
    TextPart,
    ToolCall,
    ToolDefinition,
    ToolMessage,
    Usage,
    UserMessage,
)
from metacrate_grid_agent._core._wire import OversizedToolCall
from metacrate_grid_agent._version import __version__
from metacrate_grid_agent.config import AgentConfig, LLMConfig, Secret, ToolLoopConfig
from metacrate_grid_agent.errors import GridAgentError
from metacrate_grid_agent.journal import Journal, JournalRun

__all__ = [
    "GC_THRESHOLDS",
    "AgentConfig",
    "Ambiguous",
    "ApprovalRequest",
    "Approved",
    "Approver",
    "AssistantMessage",
    "AttemptRecord",
    "CallRecord",
    "CancelToken",
    "Completion",
    "Denied",
    "Effect",
    "Failure",
    "FunctionCall",
    "FunctionDefinition",
    "GridAgentError",
    "HistoryEncoder",
    "ImagePart",
    "ImageURL",
    "Journal",
    "JournalRun",
    "LLMClient",
    "LLMConfig",
    "LoopEvent",
    "LoopResult",
    "Message",
    "Outcome",
    "OversizedToolCall",
    "ProgressEvent",
    "RegisteredTool",
    "Secret",
    "SessionGeneration",
    "Success",
    "Summarizer",
    "SystemMessage",
    "TextPart",
    "Tool",
    "ToolCall",
    "ToolDefinition",
    "ToolExecutor",
    "ToolLoop",
    "ToolLoopConfig",
    "ToolMessage",
    "ToolOutcome",
    "ToolRegistry",
    "Usage",
    "UsageRecord",
    "UsageTotals",
    "UserMessage",
    "ValidatedCall",
    "__version__",
    "tune_gc_for_many_sessions",
    "validate_tools",
]

_public.claim(globals())
