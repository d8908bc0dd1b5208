"""The kind registry and the parameters every kind shares."""

from __future__ import annotations

import importlib
import pkgutil
from typing import Any, Callable

from engine.errors import LookupFailure

_KINDS: dict[str, "Kind"] = {}
_LOADED = False
# Modules of this package that hold no kind.
_NOT_KINDS = {"base", "inputs", "calls", "schema", "meter"}

NAME = {"type": "string", "pattern": "^[a-z][a-z0-9_]{0,63}$"}
NUMBER = {"type": "number"}
# An argument of a call: the name of a declared input, or a literal ({value: 0.1}).
ARG = {"oneOf": [NAME, {"type": "object", "additionalProperties": False, "required": ["value"],
                        "properties": {"value": {}}}]}

CALL = {
    "function": {**NAME, "description": "the interface function called"},
    "args": {"type": "array", "maxItems": 16, "items": ARG,
             "description": "positional arguments: input names or {value: literal}"},
    "kwargs": {"type": "object", "maxProperties": 16, "additionalProperties": ARG},
    "output": {"oneOf": [{"type": "integer", "minimum": 0}, {"type": "null"}],
               "description": "index into a tuple result (default: the whole result, or item 0 of a tuple)"},
    "inputs": {"type": "object", "description": "the sample inputs (see docs/kinds.md, Inputs)"},
    "before": {"type": "array", "maxItems": 4, "description": "calls run first, each output bound under `as` for "
               "the later arguments (a chain: one function's output feeds the next)",
               "items": {"type": "object", "additionalProperties": False, "required": ["function", "args", "as"],
                         "properties": {"function": NAME, "args": {"type": "array", "maxItems": 16, "items": ARG},
                                        "kwargs": {"type": "object", "maxProperties": 16, "additionalProperties": ARG},
                                        "output": {"oneOf": [{"type": "integer", "minimum": 0}, {"type": "null"}]},
                                        "as": NAME}}},
}
CALL_REQUIRED = ["function", "args", "inputs"]


class Kind:
    """One generic contract kind. Subclasses set `name`, `description`, `parameters` (JSON Schema properties),
    `required`, `metrics` (what `measure` reports) and implement `measure(impl, ctx, params) -> dict`."""

    name: str = ""
    description: str = ""
    parameters: dict[str, Any] = {}
    required: list[str] = []
    metrics: dict[str, str] = {}

    @classmethod
    def schema(cls) -> dict[str, Any]:
        return {"type": "object", "additionalProperties": False, "required": list(cls.required),
                "properties": dict(cls.parameters)}

    def measure(self, impl: Any, ctx: Any, params: dict[str, Any]) -> dict[str, Any]:  # pragma: no cover
        raise NotImplementedError


def kind(cls: type[Kind]) -> type[Kind]:
    """Register a kind class under its `name` (a name registered twice is an error)."""
    if not cls.name or not isinstance(cls.name, str):
        raise TypeError("a kind needs a non-empty name")
    if cls.name in _KINDS:
        raise ValueError(f"kind {cls.name!r} is registered twice")
    _KINDS[cls.name] = cls()
    return cls


def _load() -> None:
    global _LOADED
    if _LOADED:
        return
    pkg = importlib.import_module("engine.kinds")
    for info in sorted(pkgutil.iter_modules(pkg.__path__), key=lambda m: m.name):
        if info.name not in _NOT_KINDS:
            importlib.import_module(f"engine.kinds.{info.name}")
    _LOADED = True


def all_kinds() -> dict[str, Kind]:
    _load()
    return dict(sorted(_KINDS.items()))


def kind_names() -> list[str]:
    return list(all_kinds())


def get_kind(name: str) -> Kind:
    """The kind named `name`; an unknown name lists the valid ones."""
    kinds = all_kinds()
    try:
        return kinds[name]
    except KeyError:
        raise LookupFailure(f"no kind named {name!r}; valid kinds: {', '.join(kinds)}") from None


def check_for(name: str) -> Callable[[Any, Any], dict]:
    """A check callable `(impl, ctx) -> measurements` that runs kind `name` on the contract's params."""
    k = get_kind(name)

    def run(impl: Any, ctx: Any) -> dict:
        return k.measure(impl, ctx, dict(ctx.params))

    run.__name__ = f"kind_{name}"
    return run
