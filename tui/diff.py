"""What changed between two receipts of one method: moved measurements, changed statuses, mutants."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any


@dataclass
class DiffRow:
    kind: str  # status | measurement | added | removed | mutant | run
    where: str  # "contract seed dtype" or the mutant id, or the run field
    name: str  # metric, "status", or field
    old: Any
    new: Any
    change: str  # "+12%", "passed -> failed", ...


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return type(a) is type(b) and a == b or (_num(a) and _num(b) and a == b)


def _num(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _change(a: Any, b: Any) -> str:
    if _num(a) and _num(b) and math.isfinite(a) and math.isfinite(b):
        if a == 0:
            return f"{b - a:+.3g}"
        return f"{b - a:+.3g} ({(b - a) / abs(a):+.1%})"
    return f"{a} -> {b}"


def _results(pred: dict) -> dict[tuple, dict]:
    out = {}
    for r in pred.get("results") or []:
        if isinstance(r, dict):
            out[(r.get("contract"), r.get("seed"), r.get("dtype"))] = r
    return out


def diff_predicates(old: dict, new: dict) -> tuple[list[DiffRow], int]:
    """(rows, number of unchanged measurements) going from `old` to `new`."""
    rows: list[DiffRow] = []
    same = 0
    for label, path in (("commit", ("git", "commit")), ("device", ("environment", "device", "name")),
                        ("torch", ("environment", "torch")), ("status", ("status",))):
        a, b = _dig(old, path), _dig(new, path)
        if a != b:
            rows.append(DiffRow("run", "run", label, a, b, f"{a} -> {b}"))
    ro, rn = _results(old), _results(new)
    for key in sorted(set(ro) | set(rn), key=lambda k: tuple(str(x) for x in k)):
        where = " ".join(str(x) for x in key)
        if key not in ro:
            rows.append(DiffRow("added", where, "status", None, rn[key].get("status"), "new in this receipt"))
            continue
        if key not in rn:
            rows.append(DiffRow("removed", where, "status", ro[key].get("status"), None, "not run in this receipt"))
            continue
        a, b = ro[key], rn[key]
        if a.get("status") != b.get("status"):
            rows.append(DiffRow("status", where, "status", a.get("status"), b.get("status"),
                                f"{a.get('status')} -> {b.get('status')}"))
        ma, mb = a.get("measurements") or {}, b.get("measurements") or {}
        for metric in sorted(set(ma) | set(mb)):
            va, vb = ma.get(metric), mb.get(metric)
            if metric in ma and metric in mb and _same(va, vb):
                same += 1
            else:
                rows.append(DiffRow("measurement", where, metric, va, vb, _change(va, vb)))
    mo = {m.get("id"): m for m in old.get("mutants") or [] if isinstance(m, dict)}
    mn = {m.get("id"): m for m in new.get("mutants") or [] if isinstance(m, dict)}
    for mid in sorted(set(mo) | set(mn), key=str):
        ka = mo[mid].get("killed") if mid in mo else None
        kb = mn[mid].get("killed") if mid in mn else None
        if ka != kb:
            word = {True: "killed", False: "survived", None: "not run"}
            rows.append(DiffRow("mutant", str(mid), "killed", ka, kb, f"{word[ka]} -> {word[kb]}"))
    order = {"run": 0, "status": 1, "mutant": 2, "added": 3, "removed": 4, "measurement": 5}
    rows.sort(key=lambda r: order[r.kind])
    return rows, same


def _dig(d: Any, path: tuple) -> Any:
    for p in path:
        if not isinstance(d, dict):
            return None
        d = d.get(p)
    return d
