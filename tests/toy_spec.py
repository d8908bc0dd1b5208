"""Test-only methods: a small spec's text and a throwaway package registered for one test's lifetime.

The reliability and mutation tests each declare a toy method; what differs between them is the formulas, contracts
and mutants, so only those are written there. The rest of a valid spec (the paper stub, the budget, the promotion
block) is written once here, so that a schema change to those parts is one edit, not one per test module.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import sys
from pathlib import Path

from engine.spec import registry

PROMOTION = """\
promotion:
  review: TODO
  state: not-promoted
  reasons: []
  requires: {review: DONE, devices: [cpu], all_budget_seeds: true, mutants_killed: true, formal_comparison: false}
"""
BUDGET = {"seeds": [1], "max_seeds": 1, "max_updates_per_seed": 0, "max_tokens_per_seed": 0,
          "max_wall_seconds": 60, "downloads": False}


def toy_spec(method: str, implementation: str, *, title: str, arxiv: str, formulas: str, contracts: str,
             mutants: str, level: str = "L0", paper_title: str = "T", institution: str = "I",
             first_public: str = "2026-01-01", budget: dict | None = None, promotion: str = PROMOTION) -> str:
    """A spec's YAML text. `formulas`, `contracts` and `mutants` are YAML list items (`  - ...` lines);
    `budget` overrides single entries of BUDGET."""
    budget_text = ", ".join(f"{k}: {json.dumps(v)}" for k, v in {**BUDGET, **(budget or {})}.items())
    return (
        f"spec_version: 1\nmethod: {method}\ntitle: {json.dumps(title)}\n"
        f"paper: {{arxiv: {json.dumps(arxiv)}, version: v1, title: {paper_title}, institution: {institution},\n"
        f"        first_public: {json.dumps(first_public)}, code_released: false, license: null}}\n"
        f"level: {level}\nimplementation: {implementation}\n"
        f"formulas:\n{_items(formulas)}assumptions: []\ncontracts:\n{_items(contracts)}mutants:\n{_items(mutants)}"
        f"budget: {{{budget_text}}}\n"
        "paper_results: {label: paper-reported, results: []}\n"
        f"{promotion}"
    )


def _items(text: str) -> str:
    return text if text.endswith("\n") else text + "\n"


@contextlib.contextmanager
def registered_package(folder: Path, module: str, source: str):
    """Write `source` as module `module` in `folder`, import it (its decorators register a method), and on exit
    unregister every name it added and forget the module, leaving the registry as the other tests expect it."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{module}.py").write_text(source)
    sys.path.insert(0, str(folder))
    reg = registry.load()
    before = {t: set(getattr(reg, t)) for t in ("implementations", "checks", "mutants")}
    try:
        importlib.import_module(module)
        yield
    finally:
        for t, names in before.items():
            table = getattr(reg, t)
            for name in set(table) - names:
                del table[name]
        sys.modules.pop(module, None)
        sys.path.remove(str(folder))
