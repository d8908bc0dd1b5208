"""JSON-like data as readable YAML lines within a width (contract parameters in `contracts show`).

A small emitter, not a YAML library: read-only verbs stay quick to start. A mapping or list that fits on the
line is written in flow style (`{B: [1, 4], L: [2, 48]}`), as the specs write it; one that does not is written
in block style, one entry a line. A string is plain where YAML reads it back as the same string, and double
quoted (JSON escapes: no control character reaches the terminal raw) otherwise; a long one is cut at spaces
into a folded block (`>-`). The text parses back to the same data.
"""

from __future__ import annotations

import json
import math
import re
import textwrap
from typing import Any

_PLAIN = re.compile(r"^[A-Za-z_][A-Za-z0-9_./+-]*(?: [A-Za-z0-9_./+()-]+)*$")
_RESERVED = {"true", "false", "null", "yes", "no", "on", "off", "y", "n", "~"}


def _key(k: Any) -> str:
    k = str(k)
    return k if _PLAIN.match(k) and k.lower() not in _RESERVED else json.dumps(k, ensure_ascii=True)


def scalar(v: Any) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if math.isnan(v):
            return ".nan"
        if math.isinf(v):
            return ".inf" if v > 0 else "-.inf"
        text = repr(v)
        return text if ("e" in text or "." in text) else text + ".0"
    s = str(v)
    if _PLAIN.match(s) and s.lower() not in _RESERVED and not re.match(r"^[0-9.+-]", s):
        return s
    return json.dumps(s, ensure_ascii=True)  # a YAML double-quoted scalar: every control character escaped


def flow(v: Any) -> str:
    if isinstance(v, dict):
        return "{" + ", ".join(f"{_key(k)}: {flow(x)}" for k, x in v.items()) + "}"
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(flow(x) for x in v) + "]"
    return scalar(v)


def _long_string(prefix: str, s: str, indent: str, width: int) -> list[str] | None:
    """`prefix >-` and the string folded at spaces, or None where folding would change it."""
    if not s or s != s.strip() or "  " in s or not s.isprintable() or s.startswith(("#", "-", "?", ":")):
        return None
    lines = textwrap.wrap(s, width=max(20, width - len(indent)), break_long_words=False, break_on_hyphens=False)
    return [prefix + ">-"] + [indent + line for line in lines]


def lines(v: Any, width: int = 80, indent: str = "") -> list[str]:
    """`v` (a mapping, list or scalar) as YAML lines, each at most `width` columns where a word allows."""
    if isinstance(v, dict):
        if not v:
            return [indent + "{}"]
        out: list[str] = []
        for k, x in v.items():
            out += _entry(f"{indent}{_key(k)}:", x, width, indent + "  ")
        return out
    if isinstance(v, (list, tuple)):
        if not v:
            return [indent + "[]"]
        out = []
        for x in v:
            out += _item(indent, x, width)
        return out
    return [indent + scalar(v)]


def _entry(prefix: str, x: Any, width: int, inner: str) -> list[str]:
    one = f"{prefix} {flow(x)}"
    if len(one) <= width:
        return [one]
    if isinstance(x, str):
        return _long_string(prefix + " ", x, inner, width) or [one]
    if isinstance(x, (list, tuple)) and x and not any(isinstance(i, (dict, list, tuple)) for i in x):
        return _wrapped_flow(prefix + " [", [scalar(i) for i in x], inner + " ", width)
    if isinstance(x, (dict, list, tuple)) and x:
        return [prefix] + lines(x, width, inner)
    return [one]


def _wrapped_flow(first: str, items: list[str], indent: str, width: int) -> list[str]:
    """A flow sequence of scalars over several lines (YAML lets one span lines, each indented)."""
    out, line = [], first
    for i, item in enumerate(items):
        piece = item + ("]" if i == len(items) - 1 else ",")
        if line not in (first, indent) and len(line) + 1 + len(piece) > width:
            out.append(line)
            line = indent
        line += ("" if line in (first, indent) else " ") + piece
    return out + [line]


def _item(indent: str, x: Any, width: int) -> list[str]:
    one = f"{indent}- {flow(x)}"
    if len(one) <= width:
        return [one]
    if isinstance(x, dict) and x:
        body = lines(x, width, indent + "  ")
        return [indent + "- " + body[0][len(indent) + 2:]] + body[1:]
    if isinstance(x, (list, tuple)) and x:
        return [indent + "-"] + lines(x, width, indent + "  ")
    if isinstance(x, str):
        return _long_string(indent + "- ", x, indent + "  ", width) or [one]
    return [one]
