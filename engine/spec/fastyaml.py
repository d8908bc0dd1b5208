"""A spec's plain data from libyaml's parser events, or None: then the round-trip loader decides.

ruamel's pure-Python round-trip parse (engine/spec/loader.py) is what locates
every problem at its line, column and JSON path, and it is the reference for
what a spec means. It also costs about 0.1 s per shipped spec per pass, and
every `check`, mutant worker and read-only command validates its spec afresh.
Most specs it reads are valid and need no location at all.

So a spec is first read here, from the events of libyaml's C parser (PyYAML's
`CParser`, nothing constructed by PyYAML), with scalars resolved by ruamel's
own YAML 1.2 resolver. This reader accepts only the plain subset whose meaning
it can state exactly, and answers None for everything else: any parse error,
a tab, carriage return, NEL, line or paragraph separator or byte-order mark, a directive, an anchor or alias, any explicit tag, a merge key, a duplicate or
non-string key, nesting past MAX_DEPTH, more than one document, a top level
that is not a mapping, and any scalar other than a string, a null, a boolean,
a decimal integer within the loader's bound or a finite decimal float. None is
never an error: the caller reads the file the slow way, which gives the data
or the located error. tests/test_spec_fastyaml.py checks, on the shipped specs
and on fuzzed texts, that a non-None answer equals the slow reader's data.

A spec with a schema or reference error needs its problems located. For a text
in the plain subset, `located` gives the same data and, beside it, a document of
positions that `loader.locate` walks like ruamel's round-trip document: each
mapping's key and value marks and each sequence item's mark, as libyaml's events
give them. tests/test_spec_fastyaml.py checks that every one equals ruamel's.

Without PyYAML's C extension (a pure-Python PyYAML, or none), `available()`
is False and every spec takes the slow way.
"""

from __future__ import annotations

import math
import re
from typing import Any

# At most 300 digits: below the loader's MAX_INT (10**300), past which the reference reader refuses an integer.
_INT = re.compile(r"[-+]?(?:0|[1-9][0-9]{0,299})\Z")
_FLOAT = re.compile(r"[-+]?(?:[0-9]+\.[0-9]*|\.[0-9]+|[0-9]+)(?:[eE][-+]?[0-9]+)?\Z")
_RESOLVED = {"tag:yaml.org,2002:str": "str", "tag:yaml.org,2002:null": "null", "tag:yaml.org,2002:bool": "bool",
             "tag:yaml.org,2002:int": "int", "tag:yaml.org,2002:float": "float"}
# Characters the two readers may treat differently (ruamel refuses a tab that libyaml takes as a separator; NEL,
# LS and PS are line breaks in YAML 1.1 only; a carriage return or byte-order mark is rare enough to read slowly).
_UNSURE = re.compile("[\t\r\x85\u2028\u2029\ufeff]")
_BOOL = {"true": True, "True": True, "TRUE": True, "false": False, "False": False, "FALSE": False}


class _Decline(Exception):
    """Not in the plain subset: the slow reader decides."""


_STATE: dict = {}


def _parts():
    """(CParser, events module, ruamel's resolver) once per process, or None without libyaml."""
    if "parts" not in _STATE:
        try:
            from yaml import events
            from yaml._yaml import CParser as parser
        except ImportError:
            _STATE["parts"] = None
        else:
            from ruamel.yaml.nodes import ScalarNode
            from ruamel.yaml.resolver import VersionedResolver

            resolver = VersionedResolver()
            _STATE["parts"] = (parser, events, lambda value: str(resolver.resolve(ScalarNode, value, (True, False))))
    return _STATE["parts"]


def available() -> bool:
    """Whether libyaml's C parser is here to take the fast way."""
    return _parts() is not None


def _scalar(value: str, plain: bool, resolve) -> Any:
    if not plain:
        return value
    kind = _RESOLVED.get(resolve(value))
    if kind == "str":
        return value
    if kind == "null":
        return None
    if kind == "bool" and value in _BOOL:
        return _BOOL[value]
    if kind == "int" and _INT.match(value):
        return int(value)
    if kind == "float" and _FLOAT.match(value):
        number = float(value)
        if math.isfinite(number):
            return number
    raise _Decline(value)


class _Lc:
    """Positions of one collection, 0-based, with the methods of ruamel's `lc` that `loader.locate` calls."""

    __slots__ = ("line", "col", "data")

    def __init__(self, mark) -> None:
        self.line, self.col = mark.line, mark.column
        self.data: dict = {}  # key -> (key line, key col, value line, value col); index -> (line, col)

    def key(self, k) -> tuple[int, int]:
        return self.data[k][0], self.data[k][1]

    def value(self, k) -> tuple[int, int]:
        return self.data[k][2], self.data[k][3]

    def item(self, i) -> tuple[int, int]:
        return self.data[i]


class _Map(dict):
    """A mapping's children (a nested _Map or _Seq, or None for a scalar) and their positions in `lc`."""

    __slots__ = ("lc",)


class _Seq(list):
    __slots__ = ("lc",)


def plain_data(text: str, max_depth: int) -> dict | None:
    """The spec's data when `text` lies in the plain subset (see the module docstring); else None."""
    got = _read(text, max_depth, False)
    return None if got is None else got[0]


def located(text: str, max_depth: int) -> tuple[dict, Any] | None:
    """(data, positions) when `text` lies in the plain subset, else None: `plain_data`'s answer, and a document
    of positions that `loader.locate` reads as it reads ruamel's round-trip document."""
    return _read(text, max_depth, True)


def _read(text: str, max_depth: int, positions: bool) -> tuple[dict, Any] | None:
    parts = _parts()
    if parts is None or _UNSURE.search(text):
        return None
    parser_cls, E, resolve = parts
    parser = parser_cls(text)
    try:
        return _build(parser, E, resolve, max_depth, positions)
    except _Decline:
        return None
    except Exception:  # noqa: BLE001 - libyaml's scanner and parser errors: the slow reader words them
        return None
    finally:
        parser.dispose()


def _build(parser, E, resolve, max_depth: int, positions: bool) -> tuple[dict, Any]:
    # per open collection: [container, pending key or None, its positions or None, the pending key's mark]
    stack: list[list] = []
    root: Any = None
    where: Any = None  # the positions of the value just read (a _Map or _Seq, None for a scalar)
    documents = 0
    while True:
        ev = parser.get_event()
        if ev is None:
            raise _Decline("end of events")
        kind = type(ev)
        if kind is E.StreamStartEvent or kind is E.DocumentEndEvent:
            continue
        if kind is E.StreamEndEvent:
            break
        if kind is E.DocumentStartEvent:
            documents += 1
            if documents > 1 or ev.version is not None or ev.tags:
                raise _Decline("directive or second document")
            continue
        if kind is E.AliasEvent or getattr(ev, "anchor", None) is not None or getattr(ev, "tag", None) is not None:
            raise _Decline("alias, anchor or tag")
        if kind is E.MappingEndEvent or kind is E.SequenceEndEvent:
            value, _, where, _ = stack.pop()
            start = where.lc if where is not None else None
        elif kind is E.MappingStartEvent or kind is E.SequenceStartEvent:
            if len(stack) + 1 > max_depth:
                raise _Decline("too deep")
            is_map = kind is E.MappingStartEvent
            pos = None
            if positions:
                pos = _Map() if is_map else _Seq()
                pos.lc = _Lc(ev.start_mark)
            stack.append([{} if is_map else [], None, pos, None])
            continue
        elif kind is E.ScalarEvent:
            top = stack[-1] if stack else None
            if top is not None and isinstance(top[0], dict) and top[1] is None:
                key = _scalar(ev.value, not ev.style, resolve)
                if not isinstance(key, str) or key in top[0] or (key == "<<" and not ev.style):
                    raise _Decline("key")
                top[1] = key
                top[3] = ev.start_mark if positions else None
                continue
            if not ev.value and not ev.style:
                # an empty value (`id:` and nothing after it): where it "starts" is a reader's choice, and
                # libyaml's and ruamel's differ (before or after trailing blanks), so the reference reader places it (both
                # modes decline it: located and plain_data take the same texts)
                raise _Decline("an empty value")
            value = _scalar(ev.value, not ev.style, resolve)  # libyaml gives a plain scalar the style ''
            where, start = None, (ev.start_mark if positions else None)
        else:
            raise _Decline(kind.__name__)
        if not stack:
            root = value
            continue
        top = stack[-1]
        if isinstance(top[0], dict):
            if top[1] is None:
                raise _Decline("a collection as a key")
            top[0][top[1]] = value
            if positions:
                top[2][top[1]] = where
                line, col = (start.line, start.col) if isinstance(start, _Lc) else (start.line, start.column)
                top[2].lc.data[top[1]] = (top[3].line, top[3].column, line, col)
            top[1] = None
        else:
            if positions:
                line, col = (start.line, start.col) if isinstance(start, _Lc) else (start.line, start.column)
                top[2].lc.data[len(top[0])] = (line, col)
                top[2].append(where)
            top[0].append(value)
    if documents != 1 or not isinstance(root, dict):
        raise _Decline("not one mapping")
    return root, where
