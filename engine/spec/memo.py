"""Spec validation remembered in this process: the same bytes, validated the same way, give the same answer.

A process that lives long (the TUI, the evolve evaluator, a script or test calling the CLI in-process) asks
about the same spec files again and again: `gate`, `promote` and `verify` each validate from the file, and
each validation is a round-trip YAML parse, a schema pass and a names pass (about a second for a shipped
spec on a 2-core machine). This module keeps the answers for valid specs, in memory only.

It is not a cache in engine.store.cache's sense, and verdicts may use it: the spec file is read afresh on every
call and its bytes are part of the key, nothing is read from or written to any other file, so nothing another
process wrote can decide an answer. The rest of the key is everything else the answer depends on in this
process: the file's name (a method key must match it), how it is displayed (errors name it), the names
registered in this process (a spec may only use those), and the validating functions themselves (a monkeypatched
or reloaded loader is a different validator). Problems are never remembered: a broken spec is validated afresh
each time, so each call gets error objects of its own.
"""

from __future__ import annotations

import copy
import hashlib
import threading
from collections import OrderedDict
from pathlib import Path
from typing import Any

MAX_ENTRIES = 32  # specs on one machine are few; this bounds a process that validates thousands (a fuzz run)

_MEMO: OrderedDict[tuple, dict] = OrderedDict()  # key -> the valid spec's plain data, never handed out itself
_LOCK = threading.Lock()  # the TUI's workers and the evolve evaluator's calls validate from several threads


def _names_key(names) -> tuple:
    return (tuple(sorted(names.implementations.items())), tuple(sorted(names.checks)),
            tuple(sorted(names.mutants.items(), key=lambda kv: kv[0])), tuple(names.files))


def _code_key(loader) -> tuple:
    # the function objects themselves: a dict key holds them alive, so an id is never reused by another function
    return (loader.validate_file, loader.read_document, loader.schema_errors, loader.reference_errors,
            loader._validator, loader.spec_schema)


def validate_file(path: Path, root: Path | None = None, raw: bytes | None = None) -> tuple[Any, list]:
    """`engine.spec.loader.validate_file`, answered from this process's memory when nothing it depends on changed."""
    from engine.spec import loader, registry

    path = Path(path)
    if raw is None:
        try:
            # a regular file within the limit; anything else gets the loader's full treatment, which says what is wrong
            raw = path.read_bytes() if path.is_file() and path.stat().st_size <= loader.MAX_SPEC_BYTES else None
        except OSError:
            raw = None
        if raw is None:
            return loader.validate_file(path, root)
    if len(raw) > loader.MAX_SPEC_BYTES:
        return loader.validate_file(path, root, raw=raw)
    try:
        names = _names_key(registry.known_names())
    except Exception:  # noqa: BLE001 - e.g. no methods package: nothing to key on; validation says what is wrong
        return loader.validate_file(path, root, raw=raw)
    sha = hashlib.sha256(raw).hexdigest()
    display = loader.display_path(path, root)
    key = (sha, path.name, display, names, _code_key(loader))
    with _LOCK:
        data = _MEMO.get(key)
        if data is not None:
            _MEMO.move_to_end(key)
            data = copy.deepcopy(data)
    if data is not None:
        # doc=None: the round-trip document is parsed again only if something asks for a line (Spec.locate)
        return loader.Spec(path=path, display=display, data=data, doc=None, sha256=sha, raw=raw), []
    spec, errors = loader.validate_file(path, root, raw=raw)
    if spec is not None and not errors:
        kept = copy.deepcopy(spec.data)  # a caller may change its copy; the remembered one stays as read
        with _LOCK:
            _MEMO[key] = kept
            while len(_MEMO) > MAX_ENTRIES:
                _MEMO.popitem(last=False)
    return spec, errors


def load_spec(path: Path, root: Path | None = None):
    """A valid spec, or the first SpecError (`engine.spec.loader.load_spec`, remembered as `validate_file` is)."""
    spec, errors = validate_file(path, root)
    if errors:
        raise errors[0]
    return spec


def forget() -> None:
    """Drop every remembered answer (a test that needs a cold start)."""
    with _LOCK:
        _MEMO.clear()
