"""Content-keyed caches for the read-only commands: validated specs, receipt integrity and schema results.

Validating a spec (ruamel round-trip parse, the event scan, JSON Schema, the
static registry scan) costs 0.1-0.4 s; checking a receipt against the receipt
schema about as much. Both results are pure functions of bytes: the file's,
plus the code, schema and library that decide. So each is kept under exactly
those: a spec under its sha256 and file name plus `spec_fingerprint()` (the
modules that validate, the spec schema, the registered names, the versions of
ruamel.yaml, PyYAML and jsonschema); a receipt's schema problems under its sha256 plus
`receipt_fingerprint()` (receipts.py, the receipt schema, the jsonschema and
fastjsonschema installs); the promote/demote splice that freshness uses under
the spec's sha256 and the state. A changed byte anywhere is a different key:
a miss, validated afresh.

A receipt's integrity (its id against its canonical predicate, its subject
digest, its bytes against the form it was written in) is a pure function of
its bytes too, kept under their sha256 plus `receipt_fingerprint()`: any
edited byte is a miss, decided afresh. Nothing live is cached: freshness (the
bound files against the working tree) is computed on every call.

The cache is one file, `<receipts>/.validation-cache.json`, which whoever
can write the store can edit: so it only speeds up what is displayed (`list`,
`show`, the TUI's browser). `gate`, `promote`, `verify` and the TUI's Gate tab
never read it; they derive every verdict from the files (docs/trust.md). Missing, corrupt, foreign or unreadable means empty; a store that
cannot be written is simply not cached; writes go to a temporary name and are
renamed into place, and two processes racing only lose each other's new
entries (a miss next time). Deleting it is always safe.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import secrets
import sys
from pathlib import Path
from typing import Any, Callable

CACHE_NAME = ".validation-cache.json"
CACHE_VERSION = 1
MAX_ENTRIES = 20_000  # per section; past it, only the entries this process used are kept
# A spec's entries are large (its whole data): only the newest version of each file name is kept.
_SLOT = {"specs": lambda key: key.partition(":")[2]}
_ENGINE = Path(__file__).resolve().parent.parent
_MISSING = object()


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _files_digest(h, files: list[Path]) -> None:
    for f in files:
        h.update(f.name.encode() + b"\0")
        try:
            h.update(hashlib.sha256(f.read_bytes()).digest())
        except OSError:
            h.update(b"-")


def _library(name: str) -> str:
    """Where a library lives and when its files last changed: a new version is a new stamp. Not imported."""
    import importlib.util

    try:
        spec = importlib.util.find_spec(name)
        origin = spec.origin if spec is not None else None
        st = os.stat(origin) if origin else None
    except (ImportError, ValueError, OSError):
        return f"{name}:-"
    return f"{name}:{origin}:{st.st_size}:{st.st_mtime_ns}" if st else f"{name}:-"


def spec_code_files() -> list[Path]:
    """The engine files whose content decides a spec's validation (besides the registered names)."""
    return [_ENGINE / n for n in ("spec/loader.py", "spec/fastyaml.py", "spec/registry.py", "errors.py",
                                  "store/cache.py", "schemas/spec.schema.json")]


def receipt_code_files() -> list[Path]:
    """The engine files whose content decides a receipt's schema problems."""
    return [_ENGINE / n for n in ("store/receipts.py", "store/cache.py", "schemas/receipt.schema.json")]


def restate_code_files() -> list[Path]:
    """The engine files whose content decides `digest_with_state`."""
    return [_ENGINE / n for n in ("gate/promote.py", "errors.py", "store/cache.py")]


@functools.lru_cache(maxsize=None)
def code_stamp(kind: str) -> str:
    """sha256 of the engine code and libraries that decide `kind` ("specs", "receipts", "restate").

    Taken once per process, when first asked: a process validates with the code it loaded, so a TUI left
    running while someone edits the schema or spec.py must keep filing its verdicts under the old code's
    key, never under the new one's (a later `contracts gate` would take them for fresh validations).
    """
    libs = {"specs": ("ruamel.yaml", "yaml", "jsonschema"), "receipts": ("jsonschema", "fastjsonschema"),
            "restate": ("ruamel.yaml",)}[kind]
    files = {"specs": spec_code_files, "receipts": receipt_code_files, "restate": restate_code_files}[kind]()
    h = hashlib.sha256(f"v{CACHE_VERSION}:{sys.version}:{':'.join(_library(n) for n in libs)}".encode())
    _files_digest(h, files)
    return h.hexdigest()


def names_doc(names) -> dict:
    """Registered names (`engine.spec.registry.StaticNames`) as plain JSON data; `names_from` reverses it."""
    return {"implementations": {k: list(v) for k, v in sorted(names.implementations.items())},
            "checks": sorted(names.checks),
            "mutants": {k: v for k, v in sorted(names.mutants.items())},
            "files": list(names.files)}


def names_from(doc: dict):
    from types import MappingProxyType

    from engine.spec.registry import StaticNames

    return StaticNames(implementations=MappingProxyType({k: tuple(v) for k, v in doc["implementations"].items()}),
                       checks=frozenset(doc["checks"]), mutants=MappingProxyType(dict(doc["mutants"])),
                       files=tuple(doc["files"]))


class ValidationCache:
    """The cache file of one receipts store (or of none: `directory=None` caches in this process only)."""

    def __init__(self, directory: Path | None):
        self.path = Path(directory) / CACHE_NAME if directory is not None else None
        self._read: dict | None = None  # section -> {"fp": str, "entries": {...}} as read from disk
        self._new: dict[str, tuple[str, dict]] = {}  # section -> (fp, entries added in this process)
        self._used: dict[str, set] = {}
        self._fps: dict[str, str] = {}
        self._tree: dict[tuple[str, int, int], str] = {}  # working-tree digests, this process only
        self._targets: dict[tuple, Any] = {}  # subject name -> working-tree path, for this cache's life (one command)
        self._changed: dict[tuple, tuple] = {}  # (subject pairs, state, root, specs) -> changed files, likewise
        self._changed_ids: dict[int, tuple] = {}  # id(shared subject pairs) -> (the pairs, {(state, ...): changed})

    # -- the file -----------------------------------------------------------------

    def _load(self) -> dict:
        if self._read is None:
            self._read = self._read_file()
        return self._read

    def _read_file(self) -> dict:
        if self.path is None:
            return {}
        from engine.store import bounded

        try:  # a cache too big, too deep, or a symbolic link is ignored (and rewritten): it is never evidence
            doc = bounded.loads(bounded.read_regular(self.path, bounded.MAX_CACHE_BYTES))
        except (OSError, ValueError):
            return {}
        if not isinstance(doc, dict) or doc.get("v") != CACHE_VERSION or not isinstance(doc.get("sections"), dict):
            return {}
        return {k: s for k, s in doc["sections"].items()
                if isinstance(s, dict) and isinstance(s.get("fp"), str) and isinstance(s.get("entries"), dict)}

    def get(self, section: str, fp: str, key: str) -> Any:
        """The cached value, or `_MISSING`."""
        new = self._new.get(section)
        if new is not None and new[0] == fp and key in new[1]:
            return new[1][key]
        sec = self._load().get(section)
        if sec is None or sec["fp"] != fp or key not in sec["entries"]:
            return _MISSING
        self._used.setdefault(section, set()).add(key)
        return sec["entries"][key]

    def put(self, section: str, fp: str, key: str, value: Any) -> None:
        fp_new, entries = self._new.get(section, (fp, {}))
        if fp_new != fp:
            entries = {}
        entries[key] = value
        self._new[section] = (fp, entries)

    def flush(self) -> None:
        """Write what this process added, merged into the file as it is now; silently nothing when it cannot."""
        if self.path is None or not self._new:
            return
        if not self.path.parent.is_dir():  # never create a store just to cache into it
            return
        sections = self._read_file()  # what other processes wrote since we read
        for name, (fp, entries) in self._new.items():
            old = sections.get(name)
            merged = dict(old["entries"]) if old is not None and old["fp"] == fp else {}
            slot = _SLOT.get(name)
            if slot is not None:  # an edited spec's older versions go
                mine = {slot(k) for k in entries} | {slot(k) for k in self._used.get(name, ())}
                merged = {k: v for k, v in merged.items() if slot(k) not in mine or k in self._used.get(name, ())}
            if len(merged) + len(entries) > MAX_ENTRIES:
                used = self._used.get(name, set())
                merged = {k: v for k, v in merged.items() if k in used}
            merged.update(entries)
            sections[name] = {"fp": fp, "entries": merged}
        doc = {"v": CACHE_VERSION, "about": "cache of validation results keyed by content; safe to delete",
               "sections": sections}
        tmp = self.path.parent / f".tmp-cache-{secrets.token_hex(6)}"
        try:
            # ensure_ascii: a spec string may hold a lone surrogate, which UTF-8 cannot encode
            tmp.write_bytes(json.dumps(doc, separators=(",", ":")).encode("ascii"))
            os.replace(tmp, self.path)
        except (OSError, ValueError, TypeError):
            try:
                tmp.unlink()
            except OSError:
                pass
            return
        self._read, self._new = sections, {}

    # -- fingerprints -------------------------------------------------------------------

    def _fingerprint(self, section: str, make: Callable[[], str]) -> str:
        if section not in self._fps:
            self._fps[section] = make()
        return self._fps[section]

    def registered_names(self):
        """`engine.spec.registry.known_names()`, with the static scan of methods/ cached under the sources' digest.

        A process that already scanned (or set) the static names keeps its own. Names from the cache file only
        key this cache's entries: they are never installed as the process's registry, so whatever validates a
        spec for a verdict in this process (the TUI's Gate tab) scans methods/ itself.
        """
        from engine.spec import registry

        if registry._STATIC is None:
            try:
                root = registry.methods_root()
                files = sorted(root.rglob("*.py"))
            except Exception:  # no methods package: the scan itself says so
                return registry.known_names()
            h = hashlib.sha256(f"v{CACHE_VERSION}:{sys.version}".encode())
            _files_digest(h, [_ENGINE / "spec/registry.py", _ENGINE / "store/cache.py"])
            for f in files:  # by path relative to the package: the scan records those names
                h.update(f.relative_to(root.parent).as_posix().encode() + b"\0")
                try:
                    h.update(hashlib.sha256(f.read_bytes()).digest())
                except OSError:
                    h.update(b"-")
            fp = h.hexdigest()
            hit = self.get("registry", fp, "static")
            if hit is not _MISSING:
                try:
                    return registry.with_runtime(names_from(hit))
                except (KeyError, TypeError, AttributeError):
                    pass
            self.put("registry", fp, "static", names_doc(registry.static_names()))
        return registry.known_names()

    def spec_fingerprint(self) -> str:
        """sha256 over everything a spec's validation depends on besides the spec file itself."""

        def make() -> str:
            h = hashlib.sha256(code_stamp("specs").encode())
            h.update(json.dumps(names_doc(self.registered_names()), sort_keys=True).encode())
            return h.hexdigest()

        return self._fingerprint("specs", make)

    def receipt_fingerprint(self) -> str:
        return self._fingerprint("receipts", lambda: code_stamp("receipts"))

    def restate_fingerprint(self) -> str:
        return self._fingerprint("restate", lambda: code_stamp("restate"))

    # -- specs ------------------------------------------------------------------------------

    def validate_file(self, path: Path, root: Path | None = None):
        """`engine.spec.loader.validate_file`, answered from the cache when the spec and everything it depends on match."""
        from engine.spec.loader import MAX_SPEC_BYTES, Spec, SpecError, display_path, validate_file
        from engine.spec.memo import validate_file as remembered

        path = Path(path)
        try:
            # a regular file within the limit; anything else gets the full treatment, which says what is wrong
            raw = path.read_bytes() if path.is_file() and path.stat().st_size <= MAX_SPEC_BYTES else None
        except OSError:
            raw = None
        if raw is None or len(raw) > MAX_SPEC_BYTES:
            return validate_file(path, root)
        sha = _sha(raw)
        key = f"{sha}:{path.name}"  # the file name matters: the method key must match it
        try:
            fp = self.spec_fingerprint()
        except Exception:  # e.g. no methods package: nothing to key on, so no cache; validation says what is wrong
            return validate_file(path, root, raw=raw)
        hit = self.get("specs", fp, key)
        display = display_path(path, root)
        if isinstance(hit, dict) and isinstance(hit.get("errors"), list):
            try:
                if hit["errors"]:
                    return None, [SpecError(display, e["line"], e["col"], e["path"], e["message"], e["fix"])
                                  for e in hit["errors"]]
                if isinstance(hit.get("data"), dict):
                    return Spec(path=path, display=display, data=hit["data"], doc=None, sha256=sha, raw=raw), []
            except (KeyError, TypeError):
                pass  # an entry of some other shape: validate afresh
        spec, errors = remembered(path, root, raw=raw)  # a miss here: this process may have validated these bytes
        if spec is not None:
            self.put("specs", fp, key, {"data": spec.data, "errors": []})
        elif all(type(e) is SpecError for e in errors):
            self.put("specs", fp, key, {"data": None, "errors": [
                {k: v for k, v in e.as_dict().items() if k != "file"} for e in errors]})
        return spec, errors

    def load_spec(self, path: Path, root: Path | None = None):
        """A valid spec, or the first SpecError raised (`engine.spec.loader.load_spec`, cached)."""
        spec, errors = self.validate_file(path, root)
        if errors:
            raise errors[0]
        return spec

    # -- receipts --------------------------------------------------------------------------

    def schema_problems(self, data: Any, raw: bytes) -> list[str]:
        """`engine.store.receipts.schema_problems(data)` for the receipt file whose bytes are `raw`."""
        from engine.store.receipts import schema_problems

        fp, key = self.receipt_fingerprint(), _sha(raw)
        hit = self.get("receipts", fp, key)
        if isinstance(hit, list) and all(isinstance(p, str) for p in hit):
            return list(hit)
        problems = schema_problems(data)
        self.put("receipts", fp, key, problems)
        return problems

    def integrity_problem(self, data: Any, raw: bytes) -> tuple[str, str] | None:
        """`engine.store.receipts.integrity_problem(data, raw)`: re-serialising a receipt to compare its bytes and
        hashing its canonical predicate cost about 40 ms a receipt, on every read-only command, for every
        receipt in the store; the verdict is a pure function of the bytes."""
        from engine.store.receipts import integrity_problem

        fp, key = self.receipt_fingerprint(), _sha(raw)
        hit = self.get("integrity", fp, key)
        if hit is None:
            return None
        if isinstance(hit, list) and len(hit) == 2 and all(isinstance(p, str) for p in hit):
            return hit[0], hit[1]
        problem = integrity_problem(data, raw)
        self.put("integrity", fp, key, None if problem is None else list(problem))
        return problem

    def digest_with_state(self, raw: bytes, state: str) -> str | None:
        """`engine.gate.promote.digest_with_state`: a pure function of the spec bytes and the state."""
        from engine.gate.promote import digest_with_state

        fp, key = self.restate_fingerprint(), f"{_sha(raw)}:{state}"
        hit = self.get("restate", fp, key)
        if hit is None or isinstance(hit, str):
            return hit
        out = digest_with_state(raw, state)
        self.put("restate", fp, key, out)
        return out


    def subject_target(self, name: str, root: Path, specs_dir: Path | None):
        """`engine.store.receipts.subject_target`, worked out once per name for this cache's life (one command):
        many receipts bind the same files."""
        from engine.store.receipts import subject_target

        key = (name, os.fspath(root), None if specs_dir is None else os.fspath(specs_dir))
        if key not in self._targets:
            self._targets[key] = subject_target(name, root, specs_dir)
        return self._targets[key]

    def changed_subjects(self, pairs: tuple, state, root: Path, specs_dir: Path | None) -> tuple:
        """`engine.store.receipts.changed_subjects`, worked out once per distinct subject list (and recorded spec
        state) for this cache's life (one command): thousands of receipts bind the same few lists. A list shared
        by many records (engine/store/summary.py decodes one object per distinct list) is found by identity,
        without hashing its hundreds of names again."""
        from engine.store.receipts import changed_subjects

        where = (state, os.fspath(root), None if specs_dir is None else os.fspath(specs_dir))
        held = self._changed_ids.get(id(pairs))
        if held is not None and held[0] is pairs and where in held[1]:
            return held[1][where]
        key = (pairs, *where)
        out = self._changed.get(key)
        if out is None:
            out = self._changed[key] = changed_subjects(pairs, state, root, specs_dir, self)
        if held is None or held[0] is not pairs:
            held = self._changed_ids[id(pairs)] = (pairs, {})  # the pairs kept alive: their id stays theirs
        held[1][where] = out
        return out

    def tree_sha256(self, target: Path) -> str:
        """sha256 of a working-tree file, remembered by (path, size, mtime_ns) for this cache's life (one
        command) and never stored: freshness is decided live, but many receipts bind the same engine files."""
        from engine.store.receipts import sha256_file

        try:
            st = os.stat(target)
        except OSError:
            return sha256_file(target)  # fails as the uncached call would
        key = (os.fspath(target), st.st_size, st.st_mtime_ns)
        hit = self._tree.get(key)
        if hit is None:
            hit = self._tree[key] = sha256_file(target)
        return hit


_STORES: dict[str, ValidationCache] = {}


def for_store(receipts_dir: Path | None) -> ValidationCache:
    """The process's cache for one receipts store (shared by every command step that reads it)."""
    key = os.path.abspath(receipts_dir) if receipts_dir is not None else ""
    if key not in _STORES:
        _STORES[key] = ValidationCache(Path(receipts_dir) if receipts_dir is not None else None)
    return _STORES[key]


def flush_all() -> None:
    """Write every store's new entries (each command does this as it ends) and forget them."""
    for cache in list(_STORES.values()):
        cache.flush()
    _STORES.clear()


def reset() -> None:
    """Forget the caches of this process (without writing): the next command reads them afresh."""
    _STORES.clear()
