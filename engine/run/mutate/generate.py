"""Mutants of a method's source: which files, which lines (those the baseline executed), which edits.

A mutant is one edit of one module, held in memory: the checkout is never
written. Its id is stable while the file's text is: `FILE:LINE:OPERATOR:HASH`,
HASH the first 10 hex digits of the sha256 of the mutated line(s), which is
what a spec's `equivalent_mutants` entries name.
"""

from __future__ import annotations

import ast
import difflib
import hashlib
import importlib.util
from dataclasses import dataclass, field
from pathlib import Path

from engine.run.mutate.operators import Edit, apply, collect, edits_on_lines

# Modules of a method package that test the method rather than implement it, or only register it.
NOT_MUTATED = frozenset({"__init__", "impl", "checks", "check", "mutants", "reference", "references", "cases"})
# Any other module that only checks the method (an audit, a fast-path comparison) says so itself with a
# top-level `__mutate__ = False`: the package declares its check code, no global list grows.
MARKER = "__mutate__"
# A shared module (methods/common) whose code the method's implementation calls is that method's code too: the
# package names it in its `__init__.py` with a top-level `__mutate_also__ = ("methods.common.masking",)`, and its
# executed lines are mutated and judged by this method's contracts like the package's own.
ALSO = "__mutate_also__"


@dataclass(frozen=True)
class Target:
    """A module whose source is mutated: its import name, its file and what the baseline executed in it."""

    module: str
    path: str  # absolute, only inside this process and its workers; never written anywhere
    display: str  # repository-relative
    executed: frozenset[int] = field(default_factory=frozenset)
    # line -> the contracts that executed it in the baseline ("" for the import); empty when not measured.
    contexts: dict = field(default_factory=dict, compare=False, hash=False)

    def contracts_for(self, first: int, last: int) -> set[str] | None:
        """The contracts that ran any line of a statement; None when every contract may see it (import-time code,
        or no per-contract record)."""
        names: set[str] = set()
        for line in range(first, last + 1):
            names.update(self.contexts.get(line, ()))
        if not names or "" in names:
            return None
        return names


@dataclass(frozen=True)
class Mutant:
    id: str
    module: str
    path: str
    display: str
    line: int
    operator: str
    description: str
    source: str  # the whole mutated module
    diff: str
    contracts: frozenset[str] | None = None  # the only contracts that can see it (None: all of them)

    @property
    def where(self) -> str:
        return f"{self.display}:{self.line}"


def target_modules(module_names: list[str], files: dict[str, str]) -> list[tuple[str, str]]:
    """(module, file) for every module beside the implementation's modules, less NOT_MUTATED and the
    modules that declare themselves check code (`__mutate__ = False`), plus the shared modules the package
    declares its own (`__mutate_also__`).

    `files` maps each implementation module to its file. The method package is
    the directory those files live in; its sub-packages are not walked.
    """
    out: dict[str, str] = {}
    for name in module_names:
        path = Path(files[name])
        package = name.rpartition(".")[0]
        for f in sorted(path.parent.glob("*.py")):
            if f.stem in NOT_MUTATED or declares_check_code(f):
                continue
            out[f"{package}.{f.stem}" if package else f.stem] = str(f)
        for also in declared_also(path.parent / "__init__.py"):
            if also not in out:
                out[also] = _module_file(also, path.parent.parent)
    return sorted(out.items())


def declared_also(init: Path) -> list[str]:
    """The shared modules a package's `__init__.py` declares in `__mutate_also__` (read from its text)."""
    try:
        tree = ast.parse(init.read_text(encoding="utf-8"))
    except (OSError, SyntaxError, ValueError):
        return []
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == ALSO for t in node.targets):
            value = node.value
            if isinstance(value, (ast.Tuple, ast.List)) and all(
                    isinstance(e, ast.Constant) and isinstance(e.value, str) for e in value.elts):
                return [e.value for e in value.elts]
            raise ValueError(f"{init}: {ALSO} must be a tuple of module names (strings)")
    return []


def _module_file(name: str, beside: Path) -> str:
    """The file of a declared shared module: a source module in a package beside the method's (same parent
    folder), never check code."""
    found = importlib.util.find_spec(name)
    if found is None or not found.origin or not found.origin.endswith(".py"):
        raise ValueError(f"{ALSO} names {name!r}, which is not an importable Python source module")
    path = Path(found.origin).resolve()
    if not path.is_relative_to(beside.resolve()) or path.stem in NOT_MUTATED or declares_check_code(path):
        raise ValueError(f"{ALSO} names {name!r}: give a module of a package beside the method's that is not "
                         f"check code")
    return found.origin


def declares_check_code(path: Path) -> bool:
    """True when the module sets `__mutate__ = False` at top level (read from its text, never imported)."""
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"))
    except (OSError, SyntaxError, ValueError):
        return False
    for node in tree.body:
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
        if any(isinstance(t, ast.Name) and t.id == MARKER for t in targets):
            return isinstance(node.value, ast.Constant) and node.value.value is False
    return False


def mutant_id(display: str, line: int, operator: str, mutated_lines: str) -> str:
    digest = hashlib.sha256(mutated_lines.encode("utf-8")).hexdigest()[:10]
    return f"{display}:{line}:{operator}:{digest}"


def _diff(display: str, before: str, after: str) -> str:
    return "".join(difflib.unified_diff(before.splitlines(keepends=True), after.splitlines(keepends=True),
                                        fromfile=f"a/{display}", tofile=f"b/{display}", n=1))


def mutants_of(target: Target, source: str, operators: frozenset[str] | None = None) -> list[Mutant]:
    """One mutant per edit on an executed line; edits that give the same module text are one mutant."""
    out: list[Mutant] = []
    seen: set[str] = {source}
    for edit in edits_on_lines(collect(source, operators), set(target.executed)):
        mutated = apply(source, edit)
        if mutated in seen:
            continue
        seen.add(mutated)
        out.append(_mutant(target, source, mutated, edit))
    return out


def _mutant(target: Target, source: str, mutated: str, edit: Edit) -> Mutant:
    line = edit.start[0]
    new_lines = mutated.splitlines()
    # The edited span in the mutated text: from the edit's first line to its last (an edit may add or drop lines).
    span = len(edit.text.splitlines() or [""]) - 1
    text = "\n".join(new_lines[line - 1:line + span])
    seen_by = target.contracts_for(*edit.statement_lines)
    return Mutant(id=mutant_id(target.display, line, edit.operator, text), module=target.module, path=target.path,
                  display=target.display, line=line, operator=edit.operator, description=edit.description,
                  source=mutated, diff=_diff(target.display, source, mutated),
                  contracts=None if seen_by is None else frozenset(seen_by))


def spread(mutants: list[Mutant], limit: int | None) -> list[Mutant]:
    """At most `limit` mutants, taken evenly across the list (so every file and operator keeps some), in order."""
    if limit is None or limit >= len(mutants):
        return list(mutants)
    if limit <= 0:
        return []
    step = len(mutants) / limit
    return [mutants[int(i * step)] for i in range(limit)]
