"""`--impl TARGET`: which implementation to check, what identifies it, and (in a worker only) loading it.

TARGET is one of

    path/to/file.py       a Python file, loaded as a module of its own
    package.module        a module found on the Python path (the current folder first)
    module:attribute      an object or mapping in a module exposing the interface's functions

Two halves, on purpose apart:

* `parse_target` and `identity` run in the parent (the process that writes the
  receipt). They never import or run the target: files are found with
  `importlib.machinery.PathFinder`, which searches the path without executing
  anything, then hashed.
* `load` runs only in an isolated worker (engine/run/impl_worker.py): it
  executes the target's module code and collects its functions.

The identity binds the target's files as in-toto subjects named `impl:<name>`
(`impl:my_tapo.py` for a file; `impl:<package path>/<file>` for a module, e.g.
`impl:mypkg/tapo.py`), never an absolute path; `digest` over those subjects is
the implementation's key in `list` and `gate`.
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import json
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.errors import UsageError

SUBJECT_PREFIX = "impl:"
MAX_FILES = 2000  # a package target binds its .py files; past this, bind a smaller package
_DOTTED = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")


@dataclass(frozen=True)
class Target:
    """A parsed --impl TARGET: `form` is file, module or attribute."""

    text: str  # as the user gave it
    form: str
    path: Path | None = None  # file form: the resolved file
    module: str | None = None  # module and attribute forms
    attribute: str | None = None

    @property
    def shown(self) -> str:
        """The target as recorded: as given, but a file outside the current folder by its name only."""
        if self.form != "file":
            return self.text
        try:
            rel = self.path.relative_to(Path.cwd().resolve())
            return rel.as_posix()
        except ValueError:
            return self.path.name


def parse_target(text: str) -> Target:
    """A usable target or a UsageError saying which form to use; nothing is imported."""
    raw = (text or "").strip()
    if not raw:
        raise UsageError("--impl needs a target: path/to/file.py, package.module or module:attribute")
    if raw.endswith(".py") or "/" in raw or os.sep in raw:
        path = Path(raw).expanduser()
        if not path.is_file():
            raise UsageError(f"--impl {raw}: no such file; give path/to/file.py, package.module or module:attribute")
        if path.suffix != ".py":
            raise UsageError(f"--impl {raw}: a file target must be a .py file")
        return Target(text=raw, form="file", path=path.resolve())
    module, _, attribute = raw.partition(":")
    if not _DOTTED.match(module) or (attribute and not _DOTTED.match(attribute)) or raw.count(":") > 1:
        raise UsageError(f"--impl {raw!r} is not a target; give path/to/file.py, package.module or module:attribute "
                         "(e.g. my_tapo, mypkg.tapo or mypkg.tapo:IMPL)")
    return Target(text=raw, form="attribute" if attribute else "module", module=module, attribute=attribute or None)


def search_path() -> list[str]:
    """Where a module target is looked for, in the worker's order: the current folder, then sys.path."""
    return [str(Path.cwd())] + [p for p in sys.path if p]


def _find(name: str) -> tuple[Path, list[Path]]:
    """(import root, files to bind) for a dotted module name, found without executing anything."""
    parts = name.split(".")
    path: list[str] | None = search_path()
    top_spec = spec = None
    for i in range(len(parts)):
        full = ".".join(parts[: i + 1])
        spec = importlib.machinery.PathFinder.find_spec(full, path)
        if spec is None:
            raise UsageError(f"--impl {name}: no module {full!r} on the Python path (looked in the current folder "
                             "first); give path/to/file.py or install the package")
        if i == 0:
            top_spec = spec
        path = list(spec.submodule_search_locations or []) or None
        if path is None and i < len(parts) - 1:
            raise UsageError(f"--impl {name}: {full!r} is a module, not a package")
    if top_spec.submodule_search_locations:  # a package: bind all its .py files
        pkg_dir = Path(list(top_spec.submodule_search_locations)[0]).resolve()
        root = pkg_dir.parent
        files = sorted(p for p in pkg_dir.rglob("*.py") if "__pycache__" not in p.parts)
    else:
        if not top_spec.origin or not top_spec.has_location:
            raise UsageError(f"--impl {name}: {parts[0]!r} is a built-in module with no source file to bind")
        origin = Path(top_spec.origin).resolve()
        root, files = origin.parent, [origin]
    if len(files) > MAX_FILES:
        raise UsageError(f"--impl {name}: package {parts[0]!r} has {len(files)} Python files (more than {MAX_FILES}); "
                         "put the implementation in a smaller package or a file")
    return root, files


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def identity(target: Target) -> dict:
    """What the receipt records of the implementation: target (no absolute path), file subjects, digest,
    package versions, and the git revision of the repository holding it, if any."""
    from engine.store.receipts import git_revision

    if target.form == "file":
        root, files = target.path.parent, [target.path]
    else:
        root, files = _find(target.module)
    subjects = sorted(({"name": SUBJECT_PREFIX + f.relative_to(root).as_posix(), "digest": {"sha256": _sha256(f)}}
                       for f in files), key=lambda s: s["name"])
    canonical = json.dumps(subjects, sort_keys=True, separators=(",", ":")).encode()
    packages = _versions(None if target.form == "file" else target.module.split(".")[0])
    return {
        "kind": "external",
        "target": target.shown,
        "form": target.form,
        "module": target.module,
        "attribute": target.attribute,
        "subjects": subjects,
        "digest": hashlib.sha256(canonical).hexdigest(),
        "packages": packages,
        "git": git_revision(files[0].parent),
    }


def _versions(top: str | None) -> dict:
    """Versions of what the candidate runs with: python, torch, and its own distribution when installed."""
    import platform
    from importlib import metadata

    out = {"python": platform.python_version()}
    for dist in ("torch", "numpy"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            pass
    if top:
        for dist in metadata.packages_distributions().get(top, []):
            try:
                out[dist] = metadata.version(dist)
            except metadata.PackageNotFoundError:
                pass
    return out


def unit_of(predicate: dict | None) -> str:
    """The implementation a receipt measured: 'default' (the spec's registered one) or 'impl:<digest>'."""
    impl = (predicate or {}).get("implementation")
    if not isinstance(impl, dict) or impl.get("kind") != "external":
        return "default"
    return f"{SUBJECT_PREFIX}{impl.get('digest')}"


# --- in the worker only -----------------------------------------------------------------------


def load(target: dict, names: list[str]) -> tuple[Any, list[str], list[str]]:
    """Execute the target and collect `names` from it: (functions by name, missing, not callable).

    `target` is `Target` as a dict (it crossed a process boundary). Runs the
    candidate's module code: call this in an isolated worker only.
    """
    import importlib
    import importlib.util
    from collections.abc import Mapping

    form = target["form"]
    if form == "file":
        path = Path(target["path"])
        name = "contracts_candidate_" + re.sub(r"\W", "_", path.stem)
        spec = importlib.util.spec_from_file_location(name, path)
        if spec is None or spec.loader is None:
            raise ImportError(f"cannot load {path.name} as a module")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # dataclasses, pickling and relative lookups need it there
        sys.path.insert(0, str(path.parent))  # its sibling modules import as they would under `python file.py`
        spec.loader.exec_module(module)
        obj: Any = module
    else:
        sys.path.insert(0, str(Path.cwd()))
        obj = importlib.import_module(target["module"])
        for part in (target.get("attribute") or "").split("."):
            if part:
                if not hasattr(obj, part):
                    raise AttributeError(f"module {target['module']!r} has no attribute {target['attribute']!r}")
                obj = getattr(obj, part)
    found, missing, not_callable = {}, [], []
    for n in names:
        fn = obj.get(n) if isinstance(obj, Mapping) else getattr(obj, n, None)
        if fn is None:
            missing.append(n)
        elif not callable(fn):
            not_callable.append(n)
        else:
            found[n] = fn
    return found, missing, not_callable
