"""The README's "Guarantees" section names the tests behind each promise: every one must exist."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_every_test_the_guarantees_section_names_exists():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = re.search(r"^## Guarantees\n(.*?)^## ", text, re.S | re.M)
    assert section, "README.md has no Guarantees section"
    body = section.group(1)
    for group in ("Bad input", "Misbehaving implementations", "Faults", "Concurrency", "No leaks", "Determinism"):
        assert f"**{group}**" in body, group
    named = re.findall(r"`(tests/[\w/]+\.py)::(\w+)`", body)
    assert len(named) >= 12, named
    defined: dict[str, set[str]] = {}
    for file, name in named:
        if file not in defined:
            tree = ast.parse((ROOT / file).read_text(encoding="utf-8"))
            defined[file] = {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
        assert name.startswith("test_") and name in defined[file], f"README names {file}::{name}: no such test"
    bullets = [b for b in re.split(r"\n- ", body)[1:]]
    assert all("`tests/" in b for b in bullets), "a promise without a named test"
