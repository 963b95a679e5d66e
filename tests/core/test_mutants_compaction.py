"""What the compaction plans say when they refuse, pinned where the plan tests do not look.

``apply`` refuses sizes and plans made for another history with a message that names the
mismatch; an operator reading a log of a refused compaction needs to see which.
"""

from __future__ import annotations

import pytest

from metacrate_grid_agent._core._compaction import (
    CompactionPlan,
    apply,
    marker_message,
    message_size,
)
from metacrate_grid_agent._core._types import Message, SystemMessage, UserMessage

HISTORY: tuple[Message, ...] = (
    SystemMessage(content="sys"),
    UserMessage(content="one"),
    UserMessage(content="two"),
)
SIZES = tuple(message_size(m) for m in HISTORY)


def test_apply_names_a_size_count_that_does_not_match() -> None:
    """Sizes for another history: the error says how many of each there are."""
    plan = CompactionPlan(start=1, end=2, span=HISTORY[1:2])
    with pytest.raises(ValueError, match=r"^2 sizes for 3 messages$"):
        apply(HISTORY, SIZES[:2], plan, marker_message())


def test_apply_refuses_a_plan_for_other_messages() -> None:
    """A plan whose span is not these very message objects is refused, and says so."""
    plan = CompactionPlan(start=1, end=2, span=(UserMessage(content="one"),))
    with pytest.raises(ValueError, match=r"^the plan does not match this history$"):
        apply(HISTORY, SIZES, plan, marker_message())
    beyond = CompactionPlan(start=2, end=4, span=(HISTORY[2], HISTORY[2]))
    with pytest.raises(ValueError, match=r"^the plan does not match this history$"):
        apply(HISTORY, SIZES, beyond, marker_message())
