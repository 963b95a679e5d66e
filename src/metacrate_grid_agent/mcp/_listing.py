"""A server's ``tools/list`` answer read raw and parsed tool by tool: :func:`list_tools`.

The SDK validates a listing as a whole (one bad tool refuses them all) and its model
coerces ``readOnlyHint: "yes"`` or ``1`` to ``True``. So each page is read as the server
sent it, each tool validated alone against the negotiated version's schema, and a tool that
does not parse is left out with the field at fault; the raw entry is kept beside the model
for the effect rule (only a JSON ``true`` is read-only).

The SDK (2.3) has no public way to a raw result: ``ClientSession.send_request`` validates
the whole result first, and ``list_tools`` validates and coerces. The listing uses three
private members, checked in the release :data:`SDK_CHECKED` and gated by
:func:`_sdk_internals`: another release without them fails start-up saying what to
install, and a test trips on any other release.
"""

from __future__ import annotations

import importlib.metadata
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final

import mcp_types
from mcp.client import ClientSession
from mcp.shared.dispatcher import CallOptions
from mcp_types.methods import validate_server_result
from pydantic import ValidationError

from metacrate_grid_agent._core._redact import TRUNCATION_MARKER, bounded_text
from metacrate_grid_agent.config import _nearest
from metacrate_grid_agent.errors import ConfigProblem

__all__ = ["SDK_CHECKED", "Listing", "StartupError", "list_tools", "policy_problems"]

logger = logging.getLogger("metacrate_grid_agent.mcp")

#: Characters of a validation message kept in a reason.
_MESSAGE_CHARS: Final = 200
#: Characters of a policy's tool name quoted in a problem (a tool name's own ceiling).
_NAME_CHARS: Final = 64
#: The version a listing is checked against when none was negotiated (the SDK's own).
_FALLBACK_VERSION: Final = "2025-11-25"
#: The MCP SDK release (major.minor) whose private members the raw listing was checked
#: against (``_sdk_internals``); a test trips when the installed SDK is another.
SDK_CHECKED: Final = "2.3"


class StartupError(Exception):
    """A start-up failure whose message names the cause (never a header or token)."""


@dataclass(frozen=True, slots=True)
class Listing:
    """A server's tools: each parsed one with its raw entry, and (name, reason) left out."""

    tools: list[tuple[mcp_types.Tool, Mapping[str, Any]]]
    rejected: list[tuple[str, str]]


def policy_problems(
    label: str, listing: Listing, policies: Mapping[str, Iterable[str]]
) -> list[ConfigProblem]:
    """A problem for each tool name in a server's tool policy (``effects``, ``allow_tools``,
    ``block_tools``: ``policies`` by key) that its listing does not hold, with the nearest
    listed name: a typo would otherwise leave the real tool as the server declared it."""
    listed = {remote.name for remote, _ in listing.tools} | {name for name, _ in listing.rejected}
    problems: list[ConfigProblem] = []
    for key, names in policies.items():
        for name in sorted(set(names) - listed):
            shown = name[:_NAME_CHARS]
            nearest = _nearest(name, listed)
            hint = f"did you mean `{nearest}`?" if nearest else "check the spelling"
            problems.append(
                ConfigProblem(
                    f"mcp.{label}.{key}.{shown}",
                    f"the server lists no tool {shown!r}; {hint}",
                )
            )
    return problems


def _sdk_internals(session: ClientSession) -> None:
    """Check that the SDK has the private members the raw listing uses; else say so.

    The SDK (2.3) offers no public way to a raw result: ``send_request`` validates the
    whole result first, and ``list_tools`` validates and coerces. So the listing uses
    ``_stamp`` (per-version request stamping), ``_dispatcher.send_raw_request`` and
    ``_absorb_tool_listing`` (the per-tool state ``list_tools`` would keep), checked in the
    release ``SDK_CHECKED``. Another release without them fails start-up saying what to
    install, never with an ``AttributeError`` from deep inside.
    """
    dispatcher = getattr(session, "_dispatcher", None)
    if not (
        callable(getattr(session, "_stamp", None))
        and callable(getattr(dispatcher, "send_raw_request", None))
        and callable(getattr(session, "_absorb_tool_listing", None))
    ):
        raise StartupError(
            f"the installed MCP SDK {_sdk_version()} lacks the members the raw tool listing "
            f"uses (checked with {SDK_CHECKED}); install mcp {SDK_CHECKED}.x"
        )


def _sdk_version() -> str:
    try:
        return importlib.metadata.version("mcp")
    except importlib.metadata.PackageNotFoundError:  # pragma: no cover - imported above
        return "(version unknown)"


async def _raw_tools_page(session: ClientSession, cursor: str | None) -> dict[str, Any]:
    """One ``tools/list`` page as the server sent it, before the SDK validates anything.

    The SDK validates a listing as a whole, so one bad tool would refuse them all; and its
    model coerces ``"yes"`` or ``1`` to ``True``. Each tool is parsed here, one by one.
    """
    data: dict[str, Any] = {"method": "tools/list"}
    if cursor is not None:
        data["params"] = {"cursor": cursor}
    opts: CallOptions = {}
    session._stamp(data, opts)  # noqa: SLF001 - gated by _sdk_internals
    dispatcher = session._dispatcher  # noqa: SLF001 - gated by _sdk_internals
    return await dispatcher.send_raw_request("tools/list", data.get("params"), opts)


def _parse_tool(item: object, page: Mapping[str, Any], version: str, listing: Listing) -> None:
    """Parse one listed tool into ``listing``: kept, or rejected with the field at fault.

    ``page`` is the rest of its page (cache hints and the like), checked along with it.
    """
    if not isinstance(item, dict) or not isinstance(item.get("name"), str):
        listing.rejected.append(("?", "a listed tool is not an object with a string name"))
        return
    name = item["name"][:64]
    try:
        validate_server_result("tools/list", version, {**page, "tools": [item]})
        tool = mcp_types.Tool.model_validate(item, by_name=False)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"] if part not in ("tools", 0))
        message = bounded_text(str(first["msg"]), _MESSAGE_CHARS, marker=TRUNCATION_MARKER)
        listing.rejected.append((name, f"field {where or '(tool)'} is invalid: {message}"))
        return
    except (KeyError, ValueError):  # a version the surface does not know: the model decides
        try:
            tool = mcp_types.Tool.model_validate(item, by_name=False)
        except ValidationError:
            listing.rejected.append((name, "the tool does not parse"))
            return
    listing.tools.append((tool, item))


async def list_tools(session: ClientSession, *, label: str, max_pages: int) -> Listing:
    """The server's tools, page by page (at most ``max_pages``), each parsed alone.

    Raises :class:`StartupError` when an answer has no list of tools or the SDK lacks the
    members this reads through; the SDK's own errors (a refusal, a closed connection) go on.
    """
    listing = Listing([], [])
    cursor: str | None = None
    seen: set[str] = set()
    version = session.protocol_version or _FALLBACK_VERSION
    _sdk_internals(session)
    for _ in range(max_pages):
        page = await _raw_tools_page(session, cursor)
        items = page.get("tools")
        if not isinstance(items, list):
            raise StartupError("its tools/list answer has no list of tools")
        rest = {key: value for key, value in page.items() if key != "tools"}
        for item in items:
            _parse_tool(item, rest, version, listing)
        next_cursor = page.get("nextCursor")
        cursor = next_cursor if isinstance(next_cursor, str) else None
        if cursor is None or cursor in seen:
            break
        seen.add(cursor)
    else:
        logger.warning(
            "MCP server %r: tool listing longer than %d pages; the rest is left out",
            label,
            max_pages,
        )
    # The SDK keeps per-tool state (output schemas, header mirroring) from a listing.
    session._absorb_tool_listing(  # noqa: SLF001 - gated by _sdk_internals
        mcp_types.ListToolsResult(tools=[tool for tool, _ in listing.tools]),
        complete=not seen,
    )
    return listing
