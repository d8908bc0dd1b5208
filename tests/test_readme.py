"""The README stays the newcomer's page: its set-up commands are the ones CI runs, and the promises in
docs/guarantees.md name tests that exist."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# The two set-up commands, verbatim: CI (.ci/run) runs the second, and a fresh clone's first step is the first.
MAIN_JOB = "pip install torch==2.13.0 && pip install -e . && contracts check tapo-trajectory --device cpu"
TEST_JOB = "pip install torch==2.13.0 && pip install -e '.[dev,hf,ray,verl,evolve,trl]' && python -m pytest -q"


def _section(text: str, heading: str, level: int) -> str:
    marks = "#" * level
    found = re.search(rf"^{marks} {re.escape(heading)}\n(.*?)(?=^#{{1,{level}}} |\Z)", text, re.S | re.M)
    assert found, f"no '{marks} {heading}' section"
    return found.group(1)


def test_the_set_up_section_holds_exactly_the_two_commands_ci_runs():
    body = _section((ROOT / "README.md").read_text(encoding="utf-8"), "Set-up on a fresh machine", 2)
    fenced = re.findall(r"^```[^\n]*\n(.*?)^```", body, re.S | re.M)
    assert [block.strip() for block in fenced] == [MAIN_JOB, TEST_JOB]
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()
    assert TEST_JOB in ci, ".ci/run no longer runs the README's test command verbatim"


def test_every_test_the_guarantees_page_names_exists():
    body = _section((ROOT / "docs" / "guarantees.md").read_text(encoding="utf-8"), "Guarantees", 1)
    for group in ("Bad input", "Misbehaving implementations", "Faults", "Concurrency", "No leaks", "Determinism"):
        assert f"**{group}**" in body, group
    named = re.findall(r"`(tests/[\w/]+\.py)::(\w+)`", body)
    assert len(named) >= 12, named
    defined: dict[str, set[str]] = {}
    for file, name in named:
        if file not in defined:
            tree = ast.parse((ROOT / file).read_text(encoding="utf-8"))
            defined[file] = {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
        assert name.startswith("test_") and name in defined[file], f"docs/guarantees.md names {file}::{name}: no such test"
    bullets = [b for b in re.split(r"\n- ", body)[1:]]
    assert bullets and all("`tests/" in b for b in bullets), "a promise without a named test"


def test_the_verbs_table_names_every_verb_and_no_other():
    from engine.cli import app

    body = _section((ROOT / "README.md").read_text(encoding="utf-8"), "Verbs", 2)
    rows = [line.split("|")[1] for line in body.splitlines() if line.startswith("| `")]
    in_readme = {word for cell in rows for word in re.findall(r"`([a-z][a-z-]*)[ `]", cell)}
    registered = {c.name or c.callback.__name__ for c in app.registered_commands}
    registered |= {g.name for g in app.registered_groups}  # `keys generate`
    assert in_readme == registered


def test_the_tours_failing_check_tightens_exactly_one_spec_line():
    """The tour's sed must still find its tolerance: if the spec's line changes, the tour would 'fail' for nothing."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    old, new = re.search(r"^\$ mkdir -p \S+ && sed 's/([^/]+)/([^/]+)/' specs/tapo-trajectory\.yaml", readme, re.M).groups()
    spec = (ROOT / "specs" / "tapo-trajectory.yaml").read_text(encoding="utf-8")
    assert spec.count(old) == 1, f"the tour's sed pattern {old!r} matches {spec.count(old)} spec lines"
    limit = lambda text: float(re.search(r"le: (\S+)$", text).group(1))  # noqa: E731
    assert limit(new) < limit(old) / 100, "the tour's tightened limit is not tight enough to fail"
