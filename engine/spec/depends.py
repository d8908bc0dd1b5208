"""Family dependencies: the specs a method's evidence rests on (`depends_on:`), in the order they must run.

TAPO, MRTPO and TAR train a GRPO control arm beside the method's arm; that arm runs the code specs/grpo.yaml checks,
so their verdicts mean something only while grpo's contracts hold on the same source tree. A spec says so with
`depends_on: [grpo]` (or `{method: grpo, why: ...}`); the gate then asks for a fresh, complete, passing receipt of
each dependency (engine/gate/dependencies.py), and `check --all` runs dependencies first.

A dependency must be another spec of the same folder or of the project's specs/; a cycle (a spec depending on itself, directly or through
others) is a spec error naming the file and line of the entry that closes it. Torch-free.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Iterable

from engine.errors import SpecError
from engine.spec.depends_entries import Dependency, _where, declared, reference_problems  # noqa: F401 (re-exported)


def folder_errors(paths: Iterable[Path], root: Path | None = None) -> list[SpecError]:
    """Across the specs of a folder: a dependency with no spec there nor in the project's specs/, and every cycle
    (file:line of the entry)."""
    from engine.spec.loader import json_path, locate, read_located

    paths = [Path(p) for p in paths]
    # the checkout's specs/ (engine/paths.project_root; importing engine.paths here would close an import cycle
    # through the loader)
    project_keys = {q.stem for q in (Path(__file__).resolve().parents[2] / "specs").glob("*.yaml")}
    errors: list[SpecError] = []
    for p in paths:
        try:
            deps, _, display = _read(p, root)
        except SpecError:
            continue  # the file's own validation reports it
        here = sorted(q.stem for q in p.parent.glob("*.yaml"))
        for i, dep in enumerate(deps):
            # A spec copied alone into a scratch folder names the project's dependency: its gate then reports that
            # dependency's receipts missing there, as it would for any spec whose dependency has none yet.
            if dep.method in here or dep.method in project_keys:
                continue
            try:
                data, doc, _ = read_located(p, display)
                where = _where(data, i)
                line, col = locate(doc, where)
            except (SpecError, IndexError, TypeError):
                where, line, col = ["depends_on", i], None, None
            errors.append(SpecError(display, line, col, json_path(where),
                                    f"depends_on names {dep.method!r}, which has no spec in this folder",
                                    "name a spec of the folder: " + (", ".join(here) or "(none)")))
    return errors + cycle_errors(paths, root)


def _read(path: Path, root: Path | None) -> tuple[list[Dependency], Any, str]:
    from engine.spec.loader import display_path, read_data

    data, doc, _ = read_data(path, display_path(path, root))
    deps = data.get("depends_on") if isinstance(data, dict) else None
    out: list[Dependency] = []
    for d in deps if isinstance(deps, list) else []:
        if isinstance(d, str):
            out.append(Dependency(d))
        elif isinstance(d, dict) and isinstance(d.get("method"), str):
            out.append(Dependency(d["method"], str(d.get("why", ""))))
    return out, doc, display_path(path, root)


def graph(paths: Iterable[Path], root: Path | None = None) -> dict[str, list[str]]:
    """method key (file stem) -> the keys it depends on, read from each file (unreadable files depend on none:
    validation reports them)."""
    out: dict[str, list[str]] = {}
    for p in paths:
        try:
            deps, _, _ = _read(Path(p), root)
        except SpecError:
            deps = []
        out[Path(p).stem] = [d.method for d in deps]
    return out


def keys_of(path: Path, root: Path | None = None, validate: Callable | None = None) -> list[str]:
    """The keys one spec file depends on: from its validation by `validate(path, root)` (a reading verb's sealed
    cache, engine.store.sealed.validate_spec) when it is valid, else as `graph` reads them from the file (its own
    validation reports what is wrong with it)."""
    path = Path(path)
    if validate is not None:
        spec, _ = validate(path, root)
        if spec is not None:
            return [d.method for d in declared(spec.data)]
    return graph([path], root)[path.stem]


def cycle_errors(paths: Iterable[Path], root: Path | None = None) -> list[SpecError]:
    """One error per dependency cycle among these specs, at the entry of the cycle's last spec that closes it."""
    from engine.spec.loader import json_path, locate, read_located

    paths = [Path(p) for p in paths]
    by_key = {p.stem: p for p in paths}
    g = graph(paths, root)
    errors: list[SpecError] = []
    state: dict[str, int] = {}  # 1 on the stack, 2 done
    reported: set[frozenset] = set()

    def visit(key: str, stack: list[str]) -> None:
        state[key] = 1
        for dep in g.get(key, []):
            if dep not in g:
                continue
            if state.get(dep) == 1:
                loop = stack[stack.index(dep):] + [key] if dep in stack else [key]
                ring = frozenset(loop)
                if ring not in reported:
                    reported.add(ring)
                    errors.append(_cycle_error(by_key[key], root, dep, loop + [dep], json_path, locate,
                                               read_located))
            elif state.get(dep) is None:
                visit(dep, stack + [key])
        state[key] = 2

    for key in sorted(g):
        if state.get(key) is None:
            visit(key, [])
    return errors


def _cycle_error(path: Path, root, dep: str, loop: list[str], json_path, locate, read_located) -> SpecError:
    from engine.spec.loader import display_path

    display = display_path(path, root)
    try:
        data, doc, _ = read_located(path, display)
        entries = data.get("depends_on") or []
        i = next(i for i, d in enumerate(entries) if (d if isinstance(d, str) else d.get("method")) == dep)
        where = ["depends_on", i]
        line, col = locate(doc, where)
    except (SpecError, StopIteration, AttributeError):
        where, line, col = ["depends_on"], None, None
    chain = " -> ".join(dict.fromkeys(loop)) + f" -> {loop[0]}" if len(loop) > 1 else f"{dep} -> {dep}"
    return SpecError(display, line, col, json_path(where), f"dependency cycle: {chain}",
                     "remove one depends_on entry of the cycle: a dependency's receipts must not need the "
                     "dependent's")


def ordered(paths: Iterable[Path], root: Path | None = None) -> list[Path]:
    """The spec files with every dependency before its dependents (stable: otherwise in the given order); a
    cycle raises its SpecError."""
    paths = [Path(p) for p in paths]
    errors = cycle_errors(paths, root)
    if errors:
        raise errors[0]
    g = graph(paths, root)
    by_key = {p.stem: p for p in paths}
    out: list[Path] = []
    done: set[str] = set()

    def place(key: str) -> None:
        if key in done:
            return
        done.add(key)
        for dep in g.get(key, []):
            if dep in by_key:
                place(dep)
        out.append(by_key[key])

    for p in paths:
        place(p.stem)
    return out


def closure(key: str, specs_dir: Path, root: Path | None = None,
            read: Callable[[Path], list[str]] | None = None) -> list[str]:
    """Every spec `key` depends on, directly or through others, dependencies first (without `key`). Only the specs
    on the way are read: by `read(path)` (the keys a spec file depends on) when given, else from the file (as
    `graph` reads it)."""
    by_key = {p.stem: p for p in sorted(Path(specs_dir).glob("*.yaml"))}
    read = read or (lambda p: keys_of(p, root))
    deps: dict[str, list[str]] = {}  # `graph`'s answer for the specs the walk reaches, each read once
    out: list[str] = []

    def deps_of(k: str) -> list[str]:
        if k not in by_key:
            return []
        if k not in deps:
            deps[k] = list(read(by_key[k]))
        return deps[k]

    def walk(k: str, stack: tuple[str, ...]) -> None:
        for dep in deps_of(k):
            if dep in stack or dep == key:
                continue  # a cycle is reported by validation; the gate does not loop on it
            walk(dep, stack + (dep,))
            if dep not in out:
                out.append(dep)

    walk(key, (key,))
    return out


def dependents(key: str, specs_dir: Path, root: Path | None = None, validate: Callable | None = None) -> list[str]:
    """The specs that depend on `key` directly (each read by `keys_of`, with `validate` when given)."""
    paths = sorted(Path(specs_dir).glob("*.yaml"))
    return sorted(p.stem for p in paths if key in keys_of(p, root, validate))
