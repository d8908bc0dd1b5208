"""The `depends_on:` entries of one spec, read and checked on their own (engine/spec/depends.py has the folder-wide
rules: each names a spec, no cycle). The loader calls `reference_problems`; this module imports nothing of the
engine's spec layer, so the loader and depends.py need not import each other. Torch-free."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable


@dataclass(frozen=True)
class Dependency:
    method: str
    why: str = ""


def declared(data: dict) -> list[Dependency]:
    """The dependencies a validated spec declares, in its order."""
    out = []
    for d in data.get("depends_on") or []:
        out.append(Dependency(d, "") if isinstance(d, str) else Dependency(d["method"], d.get("why", "")))
    return out


def reference_problems(data: dict, err: Callable[[list, str, str], None]) -> None:
    """File-level checks of `depends_on` (called from engine/spec/loader.py): not itself, each once. Whether each
    names a spec of the folder is `folder_errors`' (a spec copied alone into a scratch folder stays checkable)."""
    seen = []
    for i, dep in enumerate(declared(data)):
        where = _where(data, i)
        if dep.method == data["method"]:
            err(where, f"{data['method']} depends on itself", "remove the entry: a method's own receipts are its "
                "own evidence")
        elif dep.method in seen:
            err(where, f"{dep.method} is listed twice", "list each dependency once")
        seen.append(dep.method)


def _where(data: dict, i: int) -> list:
    return ["depends_on", i] if isinstance((data.get("depends_on") or [])[i], str) else ["depends_on", i, "method"]
