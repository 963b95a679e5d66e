"""An in-memory sandbox region for the CLI: a small grid world, its tools and its executor.

The world is plain data (:class:`SandboxWorld`): one avatar (``Scout``) on a 64 x 64 grid, a
few named objects (a lamp, a crate, a sign with text), two other avatars and a chat log. The
world's actions are synchronous and deterministic (:meth:`SandboxWorld.apply` returns a
:class:`Success` or :class:`Failure` with a short observation), so tests drive them without an
event loop; :class:`SandboxExecutor` is the thin asynchronous :class:`ToolExecutor` around it.

Tools (schemas are strict: ``additionalProperties`` is false and every member is required):

- ``look_around`` (read-only, no arguments): nearby objects and avatars with positions;
- ``inspect`` (read-only, ``{"target": string}``): a closer look at one nearby thing;
- ``move_to`` (mutating, ``{"x": 0..63, "y": 0..63}``): walk to a free cell;
- ``say`` (mutating, ``{"text": string <= 500}``): speak in local chat;
- ``give`` (mutating, ``{"item": string, "to": string}``): hand an item to an avatar in reach.

Only the public API of the package is used, as any application would.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from metacrate_grid_agent import (
    CancelToken,
    Effect,
    Failure,
    Success,
    Tool,
    ToolOutcome,
    ValidatedCall,
)

__all__ = [
    "AVATAR_NAME",
    "GRID_SIZE",
    "NEARBY_RADIUS",
    "REACH",
    "ChatLine",
    "SandboxExecutor",
    "SandboxWorld",
    "Thing",
    "build_sandbox",
    "sandbox_tools",
]

#: Cells per side of the region; coordinates run from 0 to GRID_SIZE - 1.
GRID_SIZE: Final = 64
#: Things within this many cells (Chebyshev distance) are "nearby": seen and inspectable.
NEARBY_RADIUS: Final = 8
#: An avatar must be within this many cells to be handed an item.
REACH: Final = 2
#: The avatar the agent drives.
AVATAR_NAME: Final = "Scout"
#: Longest observation the sandbox returns (the loop has its own, larger bound).
MAX_OBSERVATION_CHARS: Final = 1000
#: Most chat lines kept; older lines are dropped first.
MAX_CHAT_LINES: Final = 200
#: Longest name echoed back in an observation.
MAX_ECHO_CHARS: Final = 64

_NAME_SCHEMA: Final = {"type": "string", "minLength": 1, "maxLength": MAX_ECHO_CHARS}
_COORD_SCHEMA: Final = {"type": "integer", "minimum": 0, "maximum": GRID_SIZE - 1}
_TEXT_SCHEMA: Final = {"type": "string", "minLength": 1, "maxLength": 500}


@dataclass(slots=True)
class Thing:
    """An object or an avatar in the region."""

    name: str
    x: int
    y: int
    description: str
    is_avatar: bool = False
    text: str | None = None
    holding: list[str] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class ChatLine:
    """One line of local chat."""

    speaker: str
    text: str


def _default_things() -> dict[str, Thing]:
    things = [
        Thing("lamp", 22, 21, "a brass street lamp; it is switched off"),
        Thing("crate", 26, 18, "a wooden crate stamped METACRATE; it is nailed shut"),
        Thing(
            "sign",
            19,
            24,
            "a painted wooden sign",
            text="Welcome to Metacrate Plaza. Be kind to each other.",
        ),
        Thing("fountain", 50, 50, "a stone fountain, gurgling quietly"),
        Thing("Ada", 23, 23, "an avatar in a green coat, waving", is_avatar=True),
        Thing("Bo", 45, 12, "an avatar reading a book", is_avatar=True),
    ]
    return {t.name.lower(): t for t in things}


def _cut(text: str, limit: int = MAX_OBSERVATION_CHARS) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _echo(value: object) -> str:
    return repr(_cut(str(value), MAX_ECHO_CHARS))


@dataclass(slots=True)
class SandboxWorld:
    """The whole state of the sandbox region. Every action is synchronous and deterministic."""

    x: int = 20
    y: int = 20
    things: dict[str, Thing] = field(default_factory=_default_things)
    inventory: list[str] = field(default_factory=lambda: ["apple", "map"])
    chat: list[ChatLine] = field(default_factory=list)

    # --- queries --------------------------------------------------------------------------

    def distance(self, thing: Thing) -> int:
        """Chebyshev distance from the avatar to ``thing``."""
        return max(abs(thing.x - self.x), abs(thing.y - self.y))

    def nearby(self) -> list[Thing]:
        """Things within :data:`NEARBY_RADIUS`, nearest first (ties by name)."""
        close = [t for t in self.things.values() if self.distance(t) <= NEARBY_RADIUS]
        return sorted(close, key=lambda t: (self.distance(t), t.name.lower()))

    def occupant(self, x: int, y: int) -> Thing | None:
        """The thing standing on cell (x, y), if any."""
        for thing in self.things.values():
            if (thing.x, thing.y) == (x, y):
                return thing
        return None

    # --- actions --------------------------------------------------------------------------

    def apply(self, name: str, arguments: Mapping[str, Any]) -> Success | Failure:
        """Carry out tool ``name`` with ``arguments``; unknown tools and bad values fail."""
        if name == "look_around":
            return self.look_around()
        if name == "inspect":
            target = arguments.get("target")
            if not isinstance(target, str):
                return Failure("inspect needs a target name (a string)")
            return self.inspect(target)
        if name == "move_to":
            x, y = arguments.get("x"), arguments.get("y")
            if not _is_coord(x) or not _is_coord(y):
                return Failure(f"move_to needs integer x and y from 0 to {GRID_SIZE - 1}")
            assert isinstance(x, int)  # noqa: S101 - checked by _is_coord, for the type checker
            assert isinstance(y, int)  # noqa: S101 - same
            return self.move_to(x, y)
        if name == "say":
            text = arguments.get("text")
            if not isinstance(text, str):
                return Failure("say needs a text (a string)")
            return self.say(text)
        if name == "give":
            item, to = arguments.get("item"), arguments.get("to")
            if not isinstance(item, str) or not isinstance(to, str):
                return Failure("give needs an item and a recipient (strings)")
            return self.give(item, to)
        return Failure(f"the sandbox has no tool named {_echo(name)}")

    def look_around(self) -> Success:
        """List nearby objects and avatars with their positions and distances."""
        close = self.nearby()
        objects = [t for t in close if not t.is_avatar]
        avatars = [t for t in close if t.is_avatar]
        lines = [f"You are {AVATAR_NAME} at ({self.x}, {self.y})."]
        lines.append("Objects nearby: " + (self._listing(objects) or "none") + ".")
        lines.append("Avatars nearby: " + (self._listing(avatars) or "none") + ".")
        far = len(self.things) - len(close)
        if far:
            lines.append(f"{far} more thing(s) are further than {NEARBY_RADIUS} cells away.")
        return Success(_cut(" ".join(lines)))

    def _listing(self, things: list[Thing]) -> str:
        return "; ".join(f"{t.name} at ({t.x}, {t.y}), {self.distance(t)} away" for t in things)

    def inspect(self, target: str) -> Success | Failure:
        """Describe one nearby object or avatar (a sign's text is read out)."""
        thing = self.things.get(target.strip().lower())
        if thing is None:
            return Failure(f"there is no object or avatar named {_echo(target)} in this region")
        distance = self.distance(thing)
        if distance > NEARBY_RADIUS:
            return Failure(
                f"{thing.name} is at ({thing.x}, {thing.y}), {distance} cells away: too far to "
                f"see clearly (move within {NEARBY_RADIUS})"
            )
        text = f"{thing.name} at ({thing.x}, {thing.y}): {thing.description}."
        if thing.text is not None:
            text += f' It reads: "{thing.text}"'
        if thing.is_avatar:
            text += " Holding: " + (", ".join(thing.holding) or "nothing") + "."
        return Success(_cut(text))

    def move_to(self, x: int, y: int) -> Success | Failure:
        """Walk to a free cell of the grid."""
        if not (0 <= x < GRID_SIZE and 0 <= y < GRID_SIZE):
            return Failure(f"({x}, {y}) is outside the region (0 to {GRID_SIZE - 1})")
        if (x, y) == (self.x, self.y):
            return Success(f"You are already at ({x}, {y}).")
        taken = self.occupant(x, y)
        if taken is not None:
            return Failure(f"({x}, {y}) is taken by {taken.name}; choose a free cell")
        start_x, start_y = self.x, self.y
        self.x, self.y = x, y
        return Success(f"You walked from ({start_x}, {start_y}) to ({x}, {y}).")

    def say(self, text: str) -> Success | Failure:
        """Speak in local chat; nearby avatars hear it."""
        line = " ".join(text.split())
        if not line:
            return Failure("say needs some text")
        line = _cut(line, 500)
        self.chat.append(ChatLine(AVATAR_NAME, line))
        del self.chat[:-MAX_CHAT_LINES]
        hearers = [t.name for t in self.nearby() if t.is_avatar]
        heard = ", ".join(hearers) if hearers else "nobody nearby"
        return Success(_cut(f'You said: "{line}" Heard by: {heard}.'))

    def give(self, item: str, to: str) -> Success | Failure:
        """Hand an item from the inventory to an avatar within :data:`REACH`."""
        wanted = item.strip().lower()
        held = next((i for i in self.inventory if i.lower() == wanted), None)
        if held is None:
            have = ", ".join(self.inventory) or "nothing"
            return Failure(f"you do not have {_echo(item)} (you have: {have})")
        recipient = self.things.get(to.strip().lower())
        if recipient is None or not recipient.is_avatar:
            return Failure(f"there is no avatar named {_echo(to)} in this region")
        distance = self.distance(recipient)
        if distance > REACH:
            return Failure(
                f"{recipient.name} is {distance} cells away; move within {REACH} to give"
            )
        self.inventory.remove(held)
        recipient.holding.append(held)
        return Success(f"You gave the {held} to {recipient.name}.")


def _is_coord(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < GRID_SIZE


def _object_schema(properties: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": dict(properties),
        "required": sorted(properties),
        "additionalProperties": False,
    }


def sandbox_tools() -> list[Tool]:
    """The sandbox's tool definitions, in a stable order."""
    return [
        Tool(
            name="look_around",
            description="List the objects and avatars near you, with their grid positions.",
            parameters=_object_schema({}),
            effect=Effect.READ_ONLY,
        ),
        Tool(
            name="inspect",
            description="Look closely at one nearby object or avatar (signs are read out).",
            parameters=_object_schema({"target": _NAME_SCHEMA}),
            effect=Effect.READ_ONLY,
        ),
        Tool(
            name="move_to",
            description=f"Walk to the free grid cell (x, y); both from 0 to {GRID_SIZE - 1}.",
            parameters=_object_schema({"x": _COORD_SCHEMA, "y": _COORD_SCHEMA}),
            effect=Effect.MUTATING,
        ),
        Tool(
            name="say",
            description="Say something in local chat; nearby avatars hear it.",
            parameters=_object_schema({"text": _TEXT_SCHEMA}),
            effect=Effect.MUTATING,
        ),
        Tool(
            name="give",
            description=f"Give an item you hold to an avatar within {REACH} cells.",
            parameters=_object_schema({"item": _NAME_SCHEMA, "to": _NAME_SCHEMA}),
            effect=Effect.MUTATING,
        ),
    ]


class SandboxExecutor:
    """The :class:`ToolExecutor` of the sandbox: runs validated calls against :attr:`world`.

    The world acts at once (no I/O), so a call is never cut mid-way. ``calls`` records every
    call received, in order.
    """

    def __init__(self, world: SandboxWorld | None = None) -> None:
        self.world = SandboxWorld() if world is None else world
        self.calls: list[ValidatedCall] = []

    async def execute(self, call: ValidatedCall, cancel: CancelToken) -> ToolOutcome:
        """Run ``call``; a call that arrives already cancelled is refused untouched."""
        if cancel.cancelled:
            return Failure(f"not run: the session was cancelled ({cancel.reason})")
        self.calls.append(call)
        return self.world.apply(call.name, call.arguments)


def build_sandbox(world: SandboxWorld | None = None) -> tuple[list[Tool], SandboxExecutor]:
    """A fresh sandbox: its tools and its executor (the world is ``executor.world``)."""
    return sandbox_tools(), SandboxExecutor(world)
