"""Where the public API says it lives: each public module claims the names it re-exports.

A public module ends with ``_public.claim(globals())``. Every class and function in its
``__all__`` that a private module defines then gives the public module as its ``__module__``:
reprs, tracebacks, the reference docs and pickles name the path users import
(``metacrate_grid_agent.ToolCall``), never a private one that may move. Pickle finds the
object there, since the module exports it under the same name.

A class's annotations are resolved first, in the module that defines it: ``typing.get_type_hints``
(and msgspec, which decodes a struct through it) looks names up in the module a class names,
and the public module does not hold every name a private one imported.
"""

from __future__ import annotations

import inspect
import typing
from collections.abc import Mapping
from types import FunctionType
from typing import Any

__all__ = ["claim"]


def _private(module: str) -> bool:
    """Whether a dotted module path passes through a private part (``pkg._core._types``)."""
    return any(part.startswith("_") for part in module.split("."))


def claim(namespace: Mapping[str, Any]) -> None:
    """Give the module of ``namespace`` (its ``globals()``) as ``__module__`` of each class and
    function in its ``__all__`` that a private module defines."""
    module = namespace["__name__"]
    for name in namespace["__all__"]:
        obj = namespace[name]
        if not isinstance(obj, type | FunctionType) or not _private(obj.__module__):
            continue
        if isinstance(obj, type) and (own := inspect.get_annotations(obj)):
            hints = typing.get_type_hints(obj, include_extras=True)
            obj.__annotations__ = {key: hints[key] for key in own}
        obj.__module__ = module
