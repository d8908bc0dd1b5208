"""Load specs and validate them: YAML safety, JSON Schema, then cross-references.

Every problem becomes a `SpecError` that prints as one line:
`specs/x.yaml:LINE:COL $.json.path message (fix: ...)`. Nothing in a spec is
ever imported, evaluated or constructed: YAML tags other than the plain
scalar/collection ones, anchors and aliases are refused before the document is
built, so `!!python/object` and alias bombs never get that far.

A spec is read first by engine/spec/fastyaml.py (libyaml's events, plain data
only, None when unsure). When the data has a problem to locate, it is read
there again with libyaml's positions, which equal ruamel's. When the fast reader
declines, `read_document`, the reference reader, words and locates every problem.
"""

from __future__ import annotations

import hashlib
import difflib
import io
import json
import os
import math
import re
from dataclasses import dataclass, field
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any, Callable, Iterable

from engine.errors import SpecError, UsageError

MAX_SPEC_BYTES = 1 << 20
MAX_DEPTH = 32
MAX_INT = 10 ** 300
KEY_RE = re.compile(r"^[a-z0-9][a-z0-9-]{0,62}\Z")  # \Z: Python's $ would also accept a trailing newline
_PLAIN_TAGS = {
    None,
    "!",
    "tag:yaml.org,2002:str",
    "tag:yaml.org,2002:int",
    "tag:yaml.org,2002:float",
    "tag:yaml.org,2002:bool",
    "tag:yaml.org,2002:null",
    "tag:yaml.org,2002:map",
    "tag:yaml.org,2002:seq",
}


@lru_cache(maxsize=None)
def spec_schema() -> dict:
    """The spec JSON Schema (Draft 2020-12), as published by `contracts schema spec`."""
    text = resources.files("engine").joinpath("schemas/spec.schema.json").read_text(encoding="utf-8")
    return json.loads(text)


@dataclass
class Spec:
    """A validated spec: plain data plus the round-trip document for line numbers."""

    path: Path
    display: str  # path as shown to users (relative where possible)
    data: dict
    # None when the data came from the fast reader or engine.store.cache: parsed again on first `locate`
    doc: Any = field(repr=False)
    sha256: str = ""
    raw: bytes | None = field(default=None, repr=False, compare=False)  # the bytes `data` was read from

    @property
    def key(self) -> str:
        return self.data["method"]

    def contract(self, cid: str) -> dict:
        for c in self.data["contracts"]:
            if c["id"] == cid:
                return c
        from engine.suggest import did_you_mean

        ids = [c["id"] for c in self.data["contracts"]]
        raise UsageError(f"{self.display}: no contract {cid!r}; {did_you_mean(cid, ids)}valid contracts: "
                         f"{', '.join(ids)}")

    def locate(self, path: Iterable[Any]) -> tuple[int | None, int | None]:
        if self.doc is None and self.raw is not None:
            self.doc = read_located(self.path, self.display, raw=self.raw)[1]
        return locate(self.doc, list(path))


def display_path(path: Path, root: Path | None = None) -> str:
    """A path as the user should read it (docs/cli.md, "Paths"): relative to the working directory when under it,
    else to `root` (the checkout) when under that, else the absolute path, whole: never cut to its base name,
    which another folder may hold too."""
    path = Path(path)
    for base in (Path.cwd(), root):
        if base is None:
            continue
        try:
            return path.resolve().relative_to(base.resolve()).as_posix()
        except ValueError:
            continue
    return Path(os.path.abspath(path)).as_posix()


_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def json_path(parts: Iterable[Any]) -> str:
    """`$.a[0].b`; a key that is not an identifier is quoted (`$["a b"]`), so the path stays one token."""
    out = "$"
    for p in parts:
        if isinstance(p, int):
            out += f"[{p}]"
        elif isinstance(p, str) and _IDENT.match(p):
            out += f".{p}"
        else:
            out += "[" + json.dumps(str(p)).replace(" ", "\\u0020") + "]"  # no spaces inside the path token
    return out


def locate(doc: Any, path: list, key_of_last: bool = False) -> tuple[int | None, int | None]:
    """1-based (line, col) of the node at `path` in a ruamel round-trip document.

    Walks as deep as the document goes; a path into a missing key lands on its
    parent. With `key_of_last`, the position of the last key itself.
    """
    node, line, col = doc, None, None
    if hasattr(doc, "lc"):
        line, col = doc.lc.line, doc.lc.col
    for i, part in enumerate(path):
        lc = getattr(node, "lc", None)
        try:
            if isinstance(part, int) and isinstance(node, list):
                if lc is not None:
                    line, col = lc.item(part)
                node = node[part]
            elif isinstance(node, dict) and part in node:
                if lc is not None:
                    last = i == len(path) - 1
                    line, col = lc.key(part) if (key_of_last and last) else lc.value(part)
                node = node[part]
            else:
                break
        except (KeyError, IndexError, TypeError, AttributeError):
            break
    if line is None:
        return None, None
    return line + 1, col + 1


# --- loading --------------------------------------------------------------


def _mark_error(display: str, err: Exception, fix: str, where: dict | None = None,
                path: list | None = None) -> SpecError:
    """A ruamel error as a SpecError at its mark; the JSON path from `where` (node positions) when known."""
    mark = getattr(err, "problem_mark", None) or getattr(err, "context_mark", None)
    problem = getattr(err, "problem", None) or (str(err).splitlines() or [type(err).__name__])[0]
    line = mark.line + 1 if mark is not None else None
    col = mark.column + 1 if mark is not None else None
    if path is None and where is not None and line is not None:
        path = where.get((line, col))
    return SpecError(display, line, col, json_path(path or []), f"YAML: {problem}", fix)


class _Open:
    """One collection being read by `_scan_events`: which child comes next, and the keys seen so far."""

    __slots__ = ("is_map", "want_key", "child", "keys")

    def __init__(self, is_map: bool) -> None:
        self.is_map, self.want_key, self.child, self.keys = is_map, is_map, (None if is_map else -1), set()


def _scan_events(text: str, display: str) -> dict[tuple[int, int], list]:
    """Refuse what could build or run anything, before anything is built; return node positions -> JSON path.

    Works on parser events only (nothing is constructed): tags other than the
    plain ones, anchors and aliases (so no alias bomb), merge keys, keys that
    are not scalars, duplicate keys and nesting deeper than MAX_DEPTH are
    refused at their line, column and JSON path. The returned map lets later
    errors (which ruamel reports by position) name their JSON path too.
    """
    from ruamel.yaml import YAML
    from ruamel.yaml.error import MarkedYAMLError
    from ruamel.yaml.events import (AliasEvent, CollectionEndEvent, CollectionStartEvent, MappingStartEvent,
                                    NodeEvent, ScalarEvent)

    stack: list[_Open] = []
    where: dict[tuple[int, int], list] = {}

    def refuse(here: tuple[int, int], path: list, message: str, fix: str) -> None:
        raise SpecError(display, *here, json_path(path), message, fix)

    try:
        for ev in YAML(typ="rt").parse(io.StringIO(text)):
            if isinstance(ev, CollectionEndEvent):
                stack.pop()
                if stack and stack[-1].is_map:
                    stack[-1].want_key = True
                continue
            if not isinstance(ev, NodeEvent):
                continue
            mark = ev.start_mark
            here = (mark.line + 1, mark.column + 1)
            is_key = bool(stack) and stack[-1].is_map and stack[-1].want_key
            if is_key:
                top = stack[-1]
                if not isinstance(ev, ScalarEvent):
                    refuse(here, [o.child for o in stack[:-1]], "a mapping key must be a plain string",
                           "write the key as a string")
                top.child, top.want_key = ev.value, False
                path = [o.child for o in stack]
                if ev.value in top.keys:
                    refuse(here, path, f"duplicate key {ev.value!r}", "remove the duplicate key")
                if ev.value == "<<" and ev.style is None:
                    refuse(here, path, "YAML merge keys (<<) are not allowed in specs", "write the keys out in full")
                top.keys.add(ev.value)
            else:
                if stack and not stack[-1].is_map:
                    stack[-1].child += 1
                path = [o.child for o in stack]
            if isinstance(ev, AliasEvent) or getattr(ev, "anchor", None):
                refuse(here, path, "YAML anchors and aliases are not allowed in specs", "write the value out in full")
            tag = getattr(ev, "tag", None)
            tag = getattr(tag, "value", tag)
            if tag not in _PLAIN_TAGS:
                refuse(here, path, f"YAML tag {tag} is not allowed (specs are plain data)", "remove the tag")
            # A core tag must fit its node (`!!str [a]` is read as a list otherwise), and a key takes none.
            fits = {None, "!"} | ({"tag:yaml.org,2002:map"} if isinstance(ev, MappingStartEvent) else
                                  {"tag:yaml.org,2002:seq"} if isinstance(ev, CollectionStartEvent) else
                                  set() if is_key else _PLAIN_TAGS - {"tag:yaml.org,2002:map", "tag:yaml.org,2002:seq"})
            if tag not in fits:
                what = "a mapping key" if is_key else "a mapping" if isinstance(ev, MappingStartEvent) else \
                    "a list" if isinstance(ev, CollectionStartEvent) else "a scalar"
                refuse(here, path, f"YAML tag {tag} does not fit {what}", "remove the tag")
            if isinstance(ev, CollectionStartEvent):
                if len(stack) + 1 > MAX_DEPTH:
                    refuse(here, path, f"nesting deeper than {MAX_DEPTH} levels", "flatten the structure")
                where.setdefault(here, path)
                stack.append(_Open(isinstance(ev, MappingStartEvent)))
            else:
                where[here] = path
                if not is_key and stack and stack[-1].is_map:
                    stack[-1].want_key = True
    except MarkedYAMLError as err:
        # The problem lies in the value of the key just read, or else in the innermost collection still open.
        inside_value = bool(stack) and stack[-1].is_map and not stack[-1].want_key
        raise _mark_error(display, err, "fix the YAML syntax at that position",
                          path=[o.child for o in (stack if inside_value else stack[:-1])]) from None
    return where


def _locating_constructor():
    """ruamel's round-trip constructor, but a value it cannot build (2026-13-45, a 5000-digit integer)
    becomes a marked error at that value instead of a bare ValueError."""
    from ruamel.yaml.constructor import ConstructorError, RoundTripConstructor

    class LocatingConstructor(RoundTripConstructor):
        def construct_object(self, node, deep=False):
            try:
                return super().construct_object(node, deep=deep)
            except (ValueError, OverflowError) as err:
                raise ConstructorError(None, None, f"cannot read this value ({err})", node.start_mark) from None

    return LocatingConstructor


def _plain(node: Any, doc: Any, path: list, display: str) -> Any:
    """ruamel round-trip nodes -> plain JSON-like Python values."""
    if isinstance(node, dict):
        out = {}
        for k, v in node.items():
            if not isinstance(k, str):
                line, col = locate(doc, path)
                raise SpecError(display, line, col, json_path(path), f"mapping key {k!r} is not a string",
                                "quote the key")
            out[k] = _plain(v, doc, path + [k], display)
        return out
    if isinstance(node, list):
        return [_plain(v, doc, path + [i], display) for i, v in enumerate(node)]
    if isinstance(node, bool) or node is None:
        return node
    if isinstance(node, int):
        if abs(node) > MAX_INT:  # every number in a spec is bounded far below; huge ints break repr() downstream
            line, col = locate(doc, path)
            digits = int(abs(node).bit_length() * 0.30103) + 1  # str() itself refuses ints past 4300 digits
            raise SpecError(display, line, col, json_path(path), f"integer of about {digits} digits is too large",
                            "write a number within the schema's bounds")
        return int(node)
    if isinstance(node, float):
        return float(node)
    if isinstance(node, str):
        return str(node)
    tag = getattr(getattr(node, "tag", None), "value", None)
    if tag == "tag:yaml.org,2002:str" and isinstance(getattr(node, "value", None), str):
        return str(node.value)  # `!!str 12`: ruamel's round-trip loader keeps the explicit tag as a TaggedScalar
    line, col = locate(doc, path)
    raise SpecError(display, line, col, json_path(path), f"unsupported value of type {type(node).__name__}",
                    "use plain strings, numbers, booleans, lists and mappings")


def _read_text(path: Path, display: str, raw: bytes | None) -> tuple[str, bytes]:
    """The spec's text, refusing what no YAML reader should see (a missing or special file, too many bytes, not
    UTF-8, a NUL); with `raw`, those bytes (already read from `path`)."""
    # File-level problems point at 1:1: the one-line format always names a position.
    if raw is None:
        try:
            if not path.exists():
                raise SpecError(display, 1, 1, "$", "file not found", "check the path")
            if not path.is_file():  # a FIFO would block, /dev/zero would never end, a folder cannot be read
                raise SpecError(display, 1, 1, "$", "not a regular file", "give the path of a .yaml file")
            with open(path, "rb") as f:
                raw = f.read(MAX_SPEC_BYTES + 1)  # never more than the limit, whatever the file claims
        except OSError as err:
            raise SpecError(display, 1, 1, "$", f"cannot read: {err.strerror or err}", "check permissions") from None
    if len(raw) > MAX_SPEC_BYTES:
        head = raw[:MAX_SPEC_BYTES]
        line = head.count(b"\n") + 1
        col = len(head) - (head.rfind(b"\n") + 1) + 1
        raise SpecError(display, line, col, "$", f"file is over the {MAX_SPEC_BYTES}-byte limit from here on",
                        "specs are small; split or trim it")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        line = raw[: err.start].count(b"\n") + 1
        col = err.start - (raw.rfind(b"\n", 0, err.start) + 1) + 1
        raise SpecError(display, line, col, "$", f"not UTF-8 (byte 0x{raw[err.start]:02x})",
                        "save the file as UTF-8") from None
    if "\x00" in text:
        line = text[: text.index("\x00")].count("\n") + 1
        raise SpecError(display, line, 1, "$", "NUL character in file", "remove it")
    return text, raw


def _unreadable_character(text: str, display: str, err: Any) -> SpecError:
    """ruamel's reader refuses a character YAML does not allow (a control character, say) before it parses
    anything; say which one, at its line and column, and in which field."""
    from ruamel.yaml.reader import Reader

    pos = err.position if isinstance(err.position, int) and 0 <= err.position < len(text) else 0
    line = text.count("\n", 0, pos) + 1
    col = pos - (text.rfind("\n", 0, pos) + 1) + 1
    path: list = []
    try:  # the field: the last node that starts before it, in the text with every such character blanked
        where = _scan_events(Reader.NON_PRINTABLE.sub(" ", text), display)
        before = [p for p in where if p <= (line, col)]
        path = where[max(before)] if before else []
    except (SpecError, RecursionError):
        pass
    char = ascii(text[pos])[1:-1] if pos < len(text) else "?"
    return SpecError(display, line, col, json_path(path), f"YAML: the character {char} is not allowed",
                     "remove it: a spec holds printable text, tabs and line breaks only")


def read_document(path: Path, display: str | None = None, raw: bytes | None = None) -> tuple[dict, Any, bytes]:
    """Read and parse one YAML spec safely; returns (plain data, round-trip doc, raw bytes).

    The reference reader: every problem located at its line, column and JSON path. With `raw`, parse those bytes
    (already read from `path`) instead of reading the file.
    """
    from ruamel.yaml import YAML
    from ruamel.yaml.error import MarkedYAMLError, YAMLError
    from ruamel.yaml.reader import ReaderError

    display = display or display_path(path)
    text, raw = _read_text(Path(path), display, raw)
    try:
        where = _scan_events(text, display)
    except ReaderError as err:
        raise _unreadable_character(text, display, err) from None
    yaml = YAML(typ="rt")
    yaml.Constructor = _locating_constructor()
    try:
        doc = yaml.load(text)
    except ReaderError as err:
        raise _unreadable_character(text, display, err) from None
    except MarkedYAMLError as err:
        fix = "remove the duplicate key" if "duplicate key" in str(err) else "fix the YAML at that position"
        if "duplicate key" in str(err):
            err.problem = err.problem or "duplicate key"
        raise _mark_error(display, err, fix, where) from None
    except (YAMLError, RecursionError, ValueError) as err:
        raise SpecError(display, None, None, "$", f"YAML: {str(err).splitlines()[0] if str(err) else type(err).__name__}",
                        "fix the YAML") from None
    if not isinstance(doc, dict):
        raise SpecError(display, 1, 1, "$", "a spec must be a YAML mapping at the top level",
                        "start with 'spec_version: 1'")
    return _plain(doc, doc, [], display), doc, raw


def read_data(path: Path, display: str | None = None, raw: bytes | None = None) -> tuple[dict, Any, bytes]:
    """(plain data, round-trip doc or None, raw bytes): `read_document`'s data, by the fast reader
    (engine/spec/fastyaml.py) when the spec lies in its plain subset, with no document (None); otherwise by
    `read_document` itself, which also words every problem."""
    from engine.spec import fastyaml

    display = display or display_path(path)
    text, raw = _read_text(Path(path), display, raw)
    data = fastyaml.plain_data(text, MAX_DEPTH)
    if data is not None:
        return data, None, raw
    return read_document(path, display, raw=raw)


def read_located(path: Path, display: str | None = None, raw: bytes | None = None) -> tuple[dict, Any, bytes]:
    """(plain data, a document `locate` can walk, raw bytes): `read_document`'s answer, or for a spec in the
    fast reader's plain subset the same data with libyaml's positions (fastyaml.located), which equal ruamel's."""
    from engine.spec import fastyaml

    display = display or display_path(path)
    text, raw = _read_text(Path(path), display, raw)
    got = fastyaml.located(text, MAX_DEPTH)
    if got is not None:
        return got[0], got[1], raw
    return read_document(path, display, raw=raw)


# --- schema errors --------------------------------------------------------


def _schema_error(err, doc: Any, display: str) -> SpecError:
    path = list(err.absolute_path)
    validator = err.validator
    message, fix, key_of_last = err.message, "", False
    if validator == "additionalProperties":
        allowed = sorted((err.schema.get("properties") or {}).keys())
        extras = sorted(k for k in err.instance if k not in allowed) if isinstance(err.instance, dict) else []
        if extras:
            path = path + [extras[0]]
            key_of_last = True
            message = f"unknown key {extras[0]!r}"
            near = difflib.get_close_matches(str(extras[0]), allowed, n=1, cutoff=0.75)
            fix = (f"rename it to {near[0]!r} (the closest key), or remove it; valid: " if near
                   else "remove it or use one of: ") + ", ".join(allowed)
    elif validator == "required":
        fix = "add the missing key"
    elif validator == "type":
        expected = err.validator_value
        if isinstance(err.instance, str) and "number" in (expected if isinstance(expected, list) else [expected]):
            message = f"{err.instance!r} is a string, not a number"
            fix = "write the number without quotes, e.g. 1.0e-6"
        else:
            fix = f"use a value of type {expected}"
    elif validator in ("enum", "const"):
        allowed = err.validator_value if validator == "enum" else [err.validator_value]
        near = difflib.get_close_matches(err.instance, [a for a in allowed if isinstance(a, str)], n=1, cutoff=0.75) \
            if isinstance(err.instance, str) else []
        fix = (f"use {json.dumps(near[0])} (the closest value); valid: " if near else "use one of: ") \
            + ", ".join(json.dumps(a) for a in allowed)
    elif validator == "pattern":
        control = _control_problem(err.instance)
        if control is not None:  # say which character, not a regex of the whole control range
            message, fix = control
        else:
            fix = f"match the pattern {err.validator_value}"
    elif validator in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"):
        fix = f"keep it within the {validator} {err.validator_value}"
    elif validator == "oneOf":
        # The nested errors say what each alternative wanted; report the deepest.
        best = max(err.context, key=lambda e: len(e.absolute_path), default=None) if err.context else None
        control = _control_problem(err.instance) if any(e.validator == "pattern" for e in err.context or ()) else None
        if control is not None:  # a text parameter holding a control character
            message, fix = control
        elif best is not None and isinstance(err.instance, str):
            message = f"{err.instance!r} is a string, not a number"
            fix = "write the number without quotes"
        elif best is not None:
            message = best.message
            if len(best.absolute_path) > len(path):  # e.g. one bad item of a list: point at the item
                path = list(best.absolute_path)
    elif validator in ("minItems", "minProperties"):
        fix = "add the missing entries"
    elif validator == "uniqueItems":
        fix = "remove the repeated entry"
    line, col = locate(doc, path, key_of_last=key_of_last)
    if len(message) > 300:  # jsonschema quotes the whole offending value; one readable line is enough
        message = message[:297] + "..."
    return SpecError(display, line, col, json_path(path), message, fix)


def _non_finite(data: Any, path: list) -> Iterable[list]:
    if isinstance(data, float) and not math.isfinite(data):
        yield path
    elif isinstance(data, dict):
        for k, v in data.items():
            yield from _non_finite(v, path + [k])
    elif isinstance(data, list):
        for i, v in enumerate(data):
            yield from _non_finite(v, path + [i])


# What the spec schema's text patterns refuse (C0, DEL, C1, bidi controls; multi-line text allows tab and line
# feed, so a pattern error on a string that holds neither of the others is about those): named in errors.
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")
_LINE_BREAK = re.compile("[\t\n]")


def _control_problem(value: Any) -> tuple[str, str] | None:
    """(message, fix) when a string holds a character the spec schema's text patterns refuse; else None."""
    bad = (_CONTROL.search(value) or _LINE_BREAK.search(value)) if isinstance(value, str) else None
    if bad is None:
        return None
    fix = ("keep this field on one line" if bad.group(0) in "\t\n" else
           "remove it: spec text is shown on terminals, where control characters act instead of print "
           "(multi-line text may hold tabs and line feeds, nothing else)")
    return f"holds the control character {ascii(bad.group(0))[1:-1]} at offset {bad.start()}", fix


@lru_cache(maxsize=None)
def _ecma_regex(pattern: str) -> re.Pattern:
    # JSON Schema patterns are ECMA-262: `$` is the end of the string. Python's `$` also matches before a
    # final newline, so "tapo\n" would pass ^[a-z0-9-]+$ and reach a file name.
    return re.compile(re.sub(r"(?<!\\)\$", r"\\Z", pattern))


@lru_cache(maxsize=None)
def _validator():
    """The spec schema's validator, with `pattern` matched as JSON Schema (ECMA-262) means it."""
    from jsonschema import Draft202012Validator, ValidationError, validators

    def pattern(validator, patrn, instance, schema):  # noqa: ARG001
        if validator.is_type(instance, "string") and not _ecma_regex(patrn).search(instance):
            yield ValidationError(f"{instance!r} does not match {patrn!r}")

    return validators.extend(Draft202012Validator, {"pattern": pattern})(spec_schema())


def schema_errors(data: dict, doc: Any, display: str) -> list[SpecError]:
    errors: list[SpecError] = []
    for p in _non_finite(data, []):
        line, col = locate(doc, p)
        errors.append(SpecError(display, line, col, json_path(p), "non-finite number (NaN or infinity)",
                                "write a finite number"))
    for err in _validator().iter_errors(data):
        errors.append(_schema_error(err, doc, display))
    return _sorted_unique(errors)


def _sorted_unique(errors: list[SpecError]) -> list[SpecError]:
    seen, out = set(), []
    for e in sorted(errors, key=lambda e: (e.lineno or 0, e.col or 0, e.path)):
        if e.line() not in seen:
            seen.add(e.line())
            out.append(e)
    return out


# --- cross references -----------------------------------------------------

COMPARATORS = ("le", "lt", "ge", "gt", "eq", "default")


def reference_errors(data: dict, doc: Any, display: str, file_stem: str | None) -> list[SpecError]:
    """Names and ids that must point at something: registry names, formula ids, contract ids."""
    from engine.spec.registry import known_names

    names = known_names()
    errors: list[SpecError] = []

    def err(path: list, message: str, fix: str, key: bool = False) -> None:
        line, col = locate(doc, path, key_of_last=key)
        errors.append(SpecError(display, line, col, json_path(path), message, fix))

    def listing(items: Iterable[str]) -> str:
        items = sorted(items)
        return ", ".join(items) if items else "(none registered)"

    def use_one_of(items: Iterable[str], given: object) -> str:
        # A typo is the usual cause: name the nearest first, so the fix is not a hunt in a long list.
        items = list(items)
        near = difflib.get_close_matches(given, items, n=1, cutoff=0.75) if isinstance(given, str) else []
        return (f"use {near[0]!r} (the closest name); valid: " if near else "use one of: ") + listing(items)

    if file_stem is not None and data["method"] != file_stem:
        err(["method"], f"method key {data['method']!r} differs from the file name {file_stem!r}",
            f"rename the file to {data['method']}.yaml or set method: {file_stem}")

    impl = data["implementation"]
    functions = names.implementations.get(impl)
    if functions is None:
        err(["implementation"], f"no implementation named {impl!r} is registered",
            use_one_of(names.implementations, impl))

    def unique_ids(section: str) -> set[str]:
        seen: set[str] = set()
        for i, item in enumerate(data.get(section, [])):
            if item["id"] in seen:
                err([section, i, "id"], f"duplicate id {item['id']!r}", "give every entry its own id")
            seen.add(item["id"])
        return seen

    formula_ids = unique_ids("formulas")
    unique_ids("assumptions")
    contract_ids = unique_ids("contracts")
    unique_ids("mutants")
    unique_ids_results = set()
    for i, r in enumerate(data["paper_results"]["results"]):
        if r["id"] in unique_ids_results:
            err(["paper_results", "results", i, "id"], f"duplicate id {r['id']!r}", "give every entry its own id")
        unique_ids_results.add(r["id"])

    for i, f in enumerate(data["formulas"]):
        if functions is not None and f["implements"] not in functions:
            err(["formulas", i, "implements"],
                f"implementation {impl!r} has no function {f['implements']!r}",
                use_one_of(functions, f['implements']))

    killers: dict[str, list[str]] = {cid: [] for cid in contract_ids}
    for i, m in enumerate(data["mutants"]):
        if m["mutant"] not in names.mutants:
            err(["mutants", i, "mutant"], f"no mutant named {m['mutant']!r} is registered",
                use_one_of(names.mutants, m['mutant']))
        elif names.mutants[m["mutant"]] != impl:
            err(["mutants", i, "mutant"],
                f"mutant {m['mutant']!r} mutates {names.mutants[m['mutant']]!r}, not this spec's implementation {impl!r}",
                "name a mutant registered with base=" + json.dumps(impl))
        for j, cid in enumerate(m["killed_by"]):
            if cid not in contract_ids:
                err(["mutants", i, "killed_by", j], f"killed_by names no contract of this spec: {cid!r}",
                    use_one_of(contract_ids, cid))
            else:
                killers[cid].append(m["id"])

    for i, c in enumerate(data["contracts"]):
        kind_problems(c, ["contracts", i], err, use_one_of)
        if "check" in c and not c["check"].startswith("kind:") and c["check"] not in names.checks:
            err(["contracts", i, "check"], f"no check named {c['check']!r} is registered",
                use_one_of(names.checks, c['check']))
        for j, fid in enumerate(c["formulas"]):
            if fid not in formula_ids:
                err(["contracts", i, "formulas", j], f"no formula with id {fid!r}",
                    use_one_of(formula_ids, fid))
        for j, e in enumerate(c["expect"]):
            given = [k for k in COMPARATORS if k in e]
            if len(given) != 1:
                err(["contracts", i, "expect", j],
                    f"an expectation needs exactly one comparison, found {len(given)}",
                    "give one of le, lt, ge, gt, eq or default")
            if "dtype" in e and e["dtype"] not in c["dtypes"]:
                err(["contracts", i, "expect", j, "dtype"],
                    f"dtype {e['dtype']} is not among this contract's dtypes",
                    f"use one of: {', '.join(c['dtypes'])}")
        if c["id"] in killers and not killers[c["id"]]:
            err(["contracts", i, "id"],
                f"no mutant names contract {c['id']!r} in killed_by, so nothing shows it can fail",
                "add a mutant this contract kills, or name the contract in an existing mutant's killed_by")

    # [impl] hook: the optional interface section must name exactly the registered implementation's functions.
    from engine.spec.interface import reference_problems

    reference_problems(data, functions, lambda path, message, fix: err(path, message, fix))
    # A registered check's `exercises:` names interface functions and keys; `depends_on` names other specs.
    from engine.spec import coverage, depends_entries

    coverage.reference_problems(data, lambda path, message, fix: err(path, message, fix))
    depends_entries.reference_problems(data, lambda path, message, fix: err(path, message, fix))

    score = (data.get("evolve") or {}).get("score")  # [evolve] the candidate ranking contracts evolve-evaluator uses
    if score is not None:
        if score["contract"] not in contract_ids:
            err(["evolve", "score", "contract"], f"evolve.score names no contract of this spec: {score['contract']!r}",
                use_one_of(contract_ids, score["contract"]))
        elif any(c.get("id") == score["contract"] and c.get("applies_to") == "registered" for c in data["contracts"]):
            err(["evolve", "score", "contract"], f"evolve.score names {score['contract']!r}, which a candidate never "
                "runs (applies_to: registered)", "score candidates by a contract that applies to any implementation")
        if not score["range"][0] < score["range"][1]:
            err(["evolve", "score", "range"], f"range {list(score['range'])} is not [low, high] with low < high",
                "give the score's worst and best values in increasing order, e.g. [0.0, 1.0]")

    budget = data["budget"]
    if len(budget["seeds"]) > budget["max_seeds"]:
        err(["budget", "seeds"], f"{len(budget['seeds'])} seeds listed but max_seeds is {budget['max_seeds']}",
            "list fewer seeds or raise max_seeds")
    return _sorted_unique(errors)


LEGACY_LABELS = ("value", "gradient", "property", "precision", "rejection", "negative-control")
BESPOKE_KINDS = ("mechanism", "bespoke")


def kind_problems(c: dict, path: list, err: Callable[..., None], use_one_of: Callable[..., str]) -> None:
    """A contract's kind: a generic kind with params valid under its schema, or `check:` with a bespoke label.

    A contract measured by a kind gets `check: kind:NAME` here, so everything downstream that names a contract's
    check (receipts, workers) works unchanged."""
    from engine.kinds.base import all_kinds
    from engine.spec.registry import KIND_PREFIX

    kinds = all_kinds()
    name = c["kind"]
    if "check" in c and not str(c["check"]).startswith(KIND_PREFIX):
        if name not in kinds and name not in LEGACY_LABELS:
            err(path + ["kind"], f"no kind named {name!r}",
                use_one_of(list(kinds) + list(LEGACY_LABELS), name))
        return
    if name not in kinds or name in BESPOKE_KINDS:
        err(path + ["kind"], f"no generic kind named {name!r}" if name not in kinds else
            f"kind {name!r} needs a registered check: (and a why:)",
            use_one_of([k for k in kinds if k not in BESPOKE_KINDS], name) if name not in kinds else
            "name the check that measures it, or use a generic kind")
        return
    schema = kinds[name].schema()
    for e in _kind_validator(name, schema).iter_errors(c.get("params") or {}):
        where = path + ["params"] + list(e.absolute_path)
        if e.validator == "additionalProperties":
            extra = sorted(set(e.instance) - set(schema["properties"])) if isinstance(e.instance, dict) else []
            err(where + extra[:1], f"kind {name!r} takes no parameter {', '.join(extra)!s}",
                use_one_of(schema["properties"] if len(where) == len(path) + 1 else
                           e.schema.get("properties", {}), extra[0] if extra else ""), key=bool(extra))
        elif e.validator == "required":
            err(where, f"kind {name!r} {e.message}", "valid parameters: " + ", ".join(sorted(schema["properties"])))
        else:
            err(where, f"kind {name!r}: {e.message}", "see `contracts kinds` for the parameter's schema")
    inputs = (c.get("params") or {}).get("inputs")
    if isinstance(inputs, dict) and "inputs" in schema["properties"]:
        from engine.kinds.schema import INPUTS

        for e in _kind_validator("inputs", INPUTS).iter_errors(inputs):
            err(path + ["params", "inputs"] + list(e.absolute_path), f"inputs: {e.message}",
                "see docs/kinds.md, Inputs")
        for dim, rng in (inputs.get("dims") or {}).items() if isinstance(inputs.get("dims"), dict) else ():
            if isinstance(rng, list) and len(rng) in (2, 3) and all(isinstance(x, int) for x in rng) and (
                    rng[0] > rng[1] or (len(rng) == 3 and rng[2] < 1)):
                err(path + ["params", "inputs", "dims", dim], f"inputs: dims {dim} {rng} is an empty range",
                    "give [low, high] with low <= high, or [low, high, step] with a step >= 1")
    c["check"] = KIND_PREFIX + name


_KIND_VALIDATORS: dict[str, Any] = {}


def _kind_validator(name: str, schema: dict) -> Any:
    v = _KIND_VALIDATORS.get(name)
    if v is None:
        import jsonschema

        v = _KIND_VALIDATORS[name] = jsonschema.Draft202012Validator(schema)
    return v


def validate_file(path: Path, root: Path | None = None, raw: bytes | None = None
                  ) -> tuple[Spec | None, list[SpecError]]:
    """Every problem in one spec file, one SpecError each; the Spec when there are none.

    Always validates afresh; `engine.store.cache.ValidationCache.validate_file` answers the same from its cache.
    With `raw`, validate those bytes (already read from `path`).
    """
    path = Path(path)
    display = display_path(path, root)
    try:
        data, doc, raw = read_data(path, display, raw=raw)
    except SpecError as e:
        return None, [e]
    stem = path.name[: -len(".yaml")] if path.name.endswith(".yaml") else None
    errors = schema_errors(data, doc, display) or reference_errors(data, doc, display, stem)
    if errors and doc is None:
        # Read fast, without positions: read again with them, whose errors then name their lines.
        try:
            data, doc, raw = read_located(path, display, raw=raw)
        except SpecError as e:
            return None, [e]
        errors = schema_errors(data, doc, display) or reference_errors(data, doc, display, stem)
    if errors:
        return None, errors
    return Spec(path=path, display=display, data=data, doc=doc, sha256=hashlib.sha256(raw).hexdigest(), raw=raw), []


def load_spec(path: Path, root: Path | None = None) -> Spec:
    """A valid spec, or the first SpecError raised."""
    spec, errors = validate_file(path, root)
    if errors:
        raise errors[0]
    return spec


def check_key(key: str) -> str:
    """Refuse method keys that could escape the specs or receipts folder."""
    if not isinstance(key, str) or not KEY_RE.match(key):
        raise UsageError(
            f"{key!r} is not a method key (lower-case letters, digits and '-', e.g. tapo-trajectory)"
        )
    return key


def spec_files(specs_dir: Path) -> list[Path]:
    return sorted(p for p in Path(specs_dir).glob("*.yaml") if p.is_file())
