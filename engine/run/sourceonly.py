"""Checkout modules run from their source, never from a cached `.pyc`.

Python's default loader trusts a `__pycache__/*.pyc` whose header records the
source's mtime and size; it never compares contents. Anyone who can write the
checkout can plant bytecode compiled from other source, stamped with the real
file's mtime and size, and that bytecode runs while the receipt binds the
(unchanged) source. So a measuring process installs `install()` before it
imports the code that measures:

* a meta-path finder hands every module whose file lies inside the checkout to
  a loader that compiles the source bytes it reads (no bytecode read, none
  written); a bytecode-only module (`x.pyc` with no `x.py`) in the checkout is
  refused;
* modules the process imported before the finder was installed (the engine's
  own first modules) are checked: where the default loader would have accepted
  a cached `.pyc`, its code must equal the source compiled now, or the run
  stops (`StaleBytecode`) naming the file to delete.

Only the checkout is affected: torch and other installed packages keep their
bytecode cache (compiling them from source would cost seconds per process).
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import marshal
import os
import sys
import threading
from pathlib import Path

from engine.errors import EnvironmentProblem


class StaleBytecode(EnvironmentProblem):
    """A module of the checkout was (or would be) loaded from bytecode that does not match its source."""


class SourceOnlyLoader(importlib.machinery.SourceFileLoader):
    """SourceFileLoader that compiles the source every time: no `.pyc` is read or written."""

    def get_code(self, fullname):
        path = self.get_filename(fullname)
        return self.source_to_code(self.get_data(path), path)


# The project's own test modules are pytest's to load (it rewrites their asserts); they never measure.
_LEFT_TO_PYTEST = ("tests/", "conftest.py")


class SourceOnlyFinder(importlib.abc.MetaPathFinder):
    """Routes the checkout's modules to SourceOnlyLoader; everything else falls through to the usual finders."""

    def __init__(self, root: Path):
        from engine.run.binding import _installed_dirs

        self.root = str(Path(root).resolve())
        # A virtual environment inside the checkout holds installed packages, not checkout code.
        self.installed = tuple(f"{self.root}/{d}" for d in _installed_dirs(Path(self.root)))

    def _inside(self, origin: str | None) -> bool:
        if not origin:
            return False
        o = str(origin)
        if not o.startswith(self.root + "/"):
            o = os.path.realpath(o)
        return o.startswith(self.root + "/") and not o.startswith(self.installed)

    def find_spec(self, fullname, path=None, target=None):
        if getattr(_busy, "on", False):
            return None
        _busy.on = True
        try:
            spec = None
            for finder in sys.meta_path:  # whoever would have found it (PathFinder, an editable install's finder)
                find = getattr(finder, "find_spec", None)
                if finder is self or find is None:
                    continue
                spec = find(fullname, path, target)
                if spec is not None:
                    break
        finally:
            _busy.on = False
        if spec is None or not self._inside(spec.origin) or _rel(spec.origin, self.root).startswith(_LEFT_TO_PYTEST):
            return None
        loader = spec.loader
        if isinstance(loader, importlib.machinery.SourcelessFileLoader):
            raise ImportError(f"{_rel(spec.origin, self.root)} is bytecode without source inside the checkout; "
                              "delete it (checks run only what a receipt can bind: source)", name=fullname)
        if type(loader) is importlib.machinery.SourceFileLoader:
            spec.loader = SourceOnlyLoader(fullname, spec.origin)
            spec.cached = None
        return spec


_busy = threading.local()


def _rel(path: str, root: str) -> str:
    path = str(path)
    return path[len(root) + 1:] if path.startswith(root + "/") else Path(path).name


def installed() -> bool:
    return any(isinstance(f, SourceOnlyFinder) for f in sys.meta_path)


def install(root: Path | None = None) -> None:
    """Put the finder first on sys.meta_path (once), then check what was imported before it."""
    if root is None:
        from engine.paths import project_root

        root = project_root()
    if not installed():
        sys.meta_path.insert(0, SourceOnlyFinder(root))
    check_loaded(root)


def _accepted_pyc(source: Path) -> Path | None:
    """The cached .pyc the default loader would have used for `source`, if any (timestamp-checked form)."""
    try:
        cached = Path(importlib.util.cache_from_source(str(source)))
        data = cached.read_bytes()
        st = source.stat()
    except (OSError, NotImplementedError, ValueError):
        return None
    if len(data) < 16 or data[:4] != importlib.util.MAGIC_NUMBER:
        return None
    flags = int.from_bytes(data[4:8], "little")
    if flags & 0b1:  # hash-based pyc: the loader checks the source hash itself (or is told not to: see below)
        return cached if not flags & 0b10 else None
    mtime, size = int.from_bytes(data[8:12], "little"), int.from_bytes(data[12:16], "little")
    if mtime != (int(st.st_mtime) & 0xFFFFFFFF) or size != (st.st_size & 0xFFFFFFFF):
        return None
    return cached


# Modules check_loaded has already cleared, by (root, name, id, origin): a loaded module's code does not change,
# so a long-lived process (the OpenEvolve evaluator builds a runner per candidate) checks each one once.
_CLEARED: set = set()


def check_loaded(root: Path) -> None:
    """Refuse when a checkout module already in sys.modules may have run from bytecode other than its source."""
    from engine.run.binding import _installed_dirs

    root_s = str(Path(root).resolve())
    installed = tuple(f"{root_s}/{d}" for d in _installed_dirs(Path(root_s)))
    for name, mod in list(sys.modules.items()):
        spec = getattr(mod, "__spec__", None)
        origin = getattr(spec, "origin", None) if spec is not None else None
        if not origin or not origin.endswith(".py") or isinstance(getattr(spec, "loader", None), SourceOnlyLoader):
            continue
        key = (root_s, name, id(mod), origin)
        if key in _CLEARED:
            continue
        source = Path(origin)
        try:
            resolved = str(source.resolve())
        except OSError:
            continue
        if not resolved.startswith(root_s + "/") or resolved.startswith(installed):
            _CLEARED.add(key)
            continue
        cached = _accepted_pyc(source)
        if cached is None:
            _CLEARED.add(key)
            continue
        try:
            code = marshal.loads(cached.read_bytes()[16:])
            fresh = compile(source.read_bytes(), str(source), "exec", dont_inherit=True)
        except Exception:  # noqa: BLE001 - unreadable bytecode the loader accepted is exactly the problem
            code, fresh = None, True
        if code != fresh:
            raise StaleBytecode(f"{_rel(str(cached.resolve()), root_s)} does not match {_rel(str(source.resolve()), root_s)} "
                                f"but was loaded for module {name}; delete it (find . -name __pycache__ -exec rm -r "
                                "{} +) and run again")
        _CLEARED.add(key)
