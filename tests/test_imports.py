"""The import graph of engine/, tui/ and methods/, read from the source with ast (nothing is imported).

Two rules (docs/index.md, "Layout"): no module imports itself back through others (a cycle), and the engine
never imports up into `methods` (methods register themselves; the engine looks them up by name in
engine.spec.registry) or `tui` (outside the CLI's `tui` verb, which starts it). Imports inside functions
count as much as those at the top: a lazy import is still a dependency, it only moves the cost.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("engine", "tui", "methods")
# The one allowed upward edge: `contracts tui` starts the browser.
ALLOWED_UP = {("engine.cli.tui", "tui.app")}


def modules(root: Path = ROOT) -> dict[str, Path]:
    out = {}
    for pkg in PACKAGES:
        for path in (root / pkg).rglob("*.py"):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join(parts)] = path
    return out


def _owner(name: str, mods: dict) -> str | None:
    """The module of ours that `name` (a module, or a module's attribute) lives in."""
    while name and name not in mods:
        name = name.rpartition(".")[0]
    return name or None


def graph(mods: dict[str, Path]) -> dict[str, set[str]]:
    """module -> the modules of ours it imports. `from pkg import sub` is an edge to pkg.sub alone (a package's
    `__init__` that imports its own submodules is not a cycle: Python finishes the package first)."""
    edges: dict[str, set[str]] = {}
    for mod, path in mods.items():
        out: set[str] = set()
        is_pkg = path.name == "__init__.py"
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = mod.split(".") if is_pkg else mod.split(".")[:-1]
                    base = base[:len(base) - (node.level - 1)]
                    src = ".".join(base + ([node.module] if node.module else []))
                else:
                    src = node.module or ""
                targets = [f"{src}.{a.name}" if f"{src}.{a.name}" in mods else src for a in node.names]
            for t in targets:
                if t.split(".")[0] in PACKAGES and (owner := _owner(t, mods)) and owner != mod:
                    out.add(owner)
        edges[mod] = out
    return edges


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for start in sorted(edges):
        if start in index:
            continue
        work = [(start, iter(sorted(edges[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on.add(start)
        while work:
            v, it = work[-1]
            nxt = next(it, None)
            if nxt is not None:
                if nxt not in edges:
                    continue
                if nxt not in index:
                    index[nxt] = low[nxt] = counter
                    counter += 1
                    stack.append(nxt)
                    on.add(nxt)
                    work.append((nxt, iter(sorted(edges[nxt]))))
                elif nxt in on:
                    low[v] = min(low[v], index[nxt])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    found.append(sorted(comp))
    return found


def upward(edges: dict[str, set[str]]) -> list[tuple[str, str]]:
    return sorted((m, t) for m, ts in edges.items() if m.split(".")[0] == "engine" for t in ts
                  if t.split(".")[0] in ("methods", "tui") and (m, t) not in ALLOWED_UP)


def test_no_import_cycles():
    assert cycles(graph(modules())) == []


def test_the_engine_imports_neither_methods_nor_the_tui():
    assert upward(graph(modules())) == []


@pytest.mark.parametrize("files, expect_cycle, expect_up", [
    # a lazy import inside a function still closes a cycle
    ({"engine/__init__.py": "", "engine/a.py": "from engine import b\n",
      "engine/b.py": "def f():\n    from engine.a import x\n"}, [["engine.a", "engine.b"]], []),
    # a relative import, and an upward one into methods
    ({"engine/__init__.py": "", "engine/a.py": "from . import b\n", "engine/b.py": "import methods.tapo\n",
      "methods/__init__.py": "", "methods/tapo/__init__.py": "from methods.tapo import impl\n",
      "methods/tapo/impl.py": "from methods.tapo import ref\n", "methods/tapo/ref.py": ""},
     [], [("engine.b", "methods.tapo")]),
])
def test_the_checks_find_what_they_look_for(tmp_path, files, expect_cycle, expect_up):
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    for pkg in PACKAGES:
        (tmp_path / pkg).mkdir(exist_ok=True)
    edges = graph(modules(tmp_path))
    assert cycles(edges) == expect_cycle
    assert upward(edges) == expect_up


def test_the_tui_and_the_gate_read_receipts_by_attribute():
    """Receipts reach tui/ and engine/gate as typed records (engine/store/records.py): no reader there indexes a
    predicate dict, so a field renamed in the store breaks where the record is made, not silently here."""
    import re

    raw_reads = re.compile(r"""predicate\[|\.get\(\s*["']predicate["']""")
    hits = [f"{path.relative_to(ROOT)}:{n}" for base in ("tui", "engine/gate") for path in sorted((ROOT / base).rglob("*.py"))
            for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1) if raw_reads.search(line)]
    assert hits == []
