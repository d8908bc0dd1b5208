"""`--impl TARGET`: which implementation to check, what identifies it, and (in a worker only) loading it.

TARGET is one of

    path/to/file.py       a Python file, loaded as a module of its own
    package.module        a module found on the Python path (the current folder first)
    module:attribute      an object or mapping in a module exposing the interface's functions
    FRAMEWORK:...         an object of a framework the project has an adapter for (engine/run/adapters), e.g.
                          verl:NAME, a policy loss registered with verl's @register_policy_loss(NAME)

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
the implementation's key in `list` and `gate`. A framework target binds the
framework file that defines the object too (`impl:verl/trainer/ppo/core_algos.py`).
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
    form: str  # file, module, attribute or framework
    path: Path | None = None  # file form (and a framework target's own file): the resolved file
    module: str | None = None  # module and attribute forms (and a framework target's own module)
    attribute: str | None = None
    framework: str | None = None  # framework form: e.g. verl
    name: str | None = None  # framework form: the object's name there (a registered policy loss)

    @property
    def shown(self) -> str:
        """The target as recorded: as given, but a file outside the current folder by its name only."""
        if self.form == "framework":
            where = _shown_path(self.path) if self.path else self.module
            return f"{self.framework}:{where + ':' if where else ''}{self.name}"
        if self.form != "file":
            return self.text
        return _shown_path(self.path)


def _shown_path(path: Path) -> str:
    try:
        return path.relative_to(Path.cwd().resolve()).as_posix()
    except ValueError:
        return path.name


def _framework(name: str):
    import importlib

    from engine.run.adapters import FRAMEWORKS

    return importlib.import_module(FRAMEWORKS[name])


def parse_target(text: str) -> Target:
    """A usable target or a UsageError saying which form to use; nothing is imported."""
    raw = (text or "").strip()
    if not raw:
        raise UsageError("--impl needs a target: path/to/file.py, package.module or module:attribute")
    from engine.run.adapters import FRAMEWORKS

    head, sep, rest = raw.partition(":")
    if sep and head in FRAMEWORKS:  # verl:NAME, not the module `verl` with an attribute NAME
        got = _framework(head).parse(raw, rest)
        return Target(text=raw, form="framework", path=got["path"], module=got["module"], framework=head,
                      name=got["name"])
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
    from engine.store.receipts import sha256_file  # imported when used, as git_revision below

    return sha256_file(path)


def sources(target: Target) -> list[tuple[str, Path]]:
    """(bound name without the `impl:` prefix, file) for the target's own files: what a sandbox stages for it
    (a framework target's framework file is the installed framework's, not staged)."""
    if target.path is not None:
        return [(target.path.name, target.path)]
    if target.module is not None:
        root, found = _find(target.module)
        return [(f.relative_to(root).as_posix(), f) for f in found]
    return []


def identity(target: Target) -> dict:
    """What the receipt records of the implementation: target (no absolute path), file subjects, digest,
    package versions, and the git revision of the repository holding it, if any."""
    from engine.store.receipts import git_revision

    rooted: list[tuple[Path, Path]] = []  # (import root, file)
    if target.path is not None:
        rooted += [(target.path.parent, target.path)]
    elif target.module is not None:
        root, found = _find(target.module)
        rooted += [(root, f) for f in found]
    own = [f for _, f in rooted]
    extra: dict = {}
    if target.form == "framework":
        fw = _framework(target.framework)
        core_root, core = fw.core_file()
        if core not in own:
            rooted.append((core_root, core))
        extra = {"framework": {"name": target.framework, "version": fw.version(), "object": target.name}}
    subjects = sorted(({"name": SUBJECT_PREFIX + f.relative_to(root).as_posix(), "digest": {"sha256": _sha256(f)}}
                       for root, f in rooted), key=lambda s: s["name"])
    canonical = json.dumps(subjects, sort_keys=True, separators=(",", ":")).encode()
    packages = _versions(target.module.split(".")[0] if target.module else None)
    if target.form == "framework":
        packages.update({k: v for k, v in _versions(_framework(target.framework).DISTRIBUTION).items()})
    return {
        "kind": "external",
        "target": target.shown,
        "form": target.form,
        "module": target.module,
        "attribute": target.attribute,
        "subjects": subjects,
        "digest": hashlib.sha256(canonical).hexdigest(),
        "packages": packages,
        "git": git_revision(own[0].parent) if own else None,
        **extra,
    }


def subject_of(ident: dict, source: str) -> dict | None:
    """The identity's subject for the file at `source` (a path the worker reported), if that file is bound."""
    try:
        path = Path(source).resolve()
        digest = _sha256(path)
    except OSError:
        return None
    for s in ident["subjects"]:
        if s["digest"]["sha256"] == digest and path.as_posix().endswith("/" + s["name"][len(SUBJECT_PREFIX):]):
            return s
    return None


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
    from collections.abc import Mapping

    from engine.run.unimplemented import watch

    obj = _load_object(target)
    found, missing, not_callable = {}, [], []
    for n in names:
        fn = obj.get(n) if isinstance(obj, Mapping) else getattr(obj, n, None)
        if fn is None:
            missing.append(n)
        elif not callable(fn):
            not_callable.append(n)
        else:
            found[n] = watch(n, fn)  # a stub's NotImplementedError is reported as such (engine/run/unimplemented.py)
    return found, missing, not_callable


def load_framework_object(target: dict) -> tuple[Any, dict]:
    """A framework target's object and what identifies it (its source file, the framework's version): the
    target's own file or module runs first (its decorators register the object). Worker only."""
    if target.get("path") or target.get("module"):
        _load_object(target)
    return _framework(target["framework"]).resolve(target["name"])


def _load_object(target: dict) -> Any:
    """Execute a file or module target and return the module, or its attribute. Worker only."""
    import importlib
    import importlib.util

    if target.get("path"):
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
    return obj
