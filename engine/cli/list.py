"""`contracts list`: every method with its latest receipt (status, coverage, freshness) and gate verdict.

`--json` follows engine/schemas/list.schema.json (`contracts schema list`). A spec
that does not validate stays in the list, as `invalid spec` with its first error.
"""

from __future__ import annotations

from pathlib import Path

import typer

from engine import errors as E
from engine import paths as _paths
from engine.cli.common import (
    JsonOpt,
    ReceiptsOpt,
    SpecsOpt,
    TrustOpt,
    _console,
    _dirs,
    _err,
    _load_valid_specs,
    _print_json,
    _spec_cache,
    _trust_policy,
    app,
    shown_path,
    handles_errors,
)


def _units(spec, specs_dir: Path, receipts_dir: Path, policy=None) -> list[tuple[str, str, list]]:
    """[impl] (unit, label, receipts) per implementation with receipts of this method: 'default' (the registered
    one, always listed) first, then each --impl target by its files' digest (engine/run/impl_loader.py)."""
    from engine.run.impl_loader import unit_of
    from engine.store.verify import assess_receipts

    assessed, _ = assess_receipts(receipts_dir, _paths.project_root(), specs_dir, spec.key,
                                  cache=_spec_cache(receipts_dir), policy=policy)
    by_unit: dict[str, list] = {"default": []}
    labels = {"default": "default"}
    for a in assessed:
        unit = unit_of(a.predicate)
        by_unit.setdefault(unit, []).append(a)
        if unit != "default":
            labels[unit] = f"--impl {a.predicate['implementation'].get('target')} ({unit[5:17]})"
    return [(u, labels[u], by_unit[u]) for u in by_unit]


def _receipt_and_gate(spec, specs_dir: Path, receipts_dir: Path, unit: str = "default", assessed=None,
                      policy=None) -> dict:
    """`list` columns: the latest receipt with its freshness, and the gate verdict (the same evaluation as `gate`,
    sped up by the validation cache: a display; `contracts gate` decides from the files)."""
    from engine.gate.verdict import evaluate
    from engine.store.verify import assess_receipts

    if assessed is None:
        assessed, _ = assess_receipts(receipts_dir, _paths.project_root(), specs_dir, spec.key,
                                      cache=_spec_cache(receipts_dir), policy=policy)
    dated = [a for a in assessed if a.created_at]
    last = max(dated, key=lambda a: a.created_at) if dated else (assessed[-1] if assessed else None)
    from engine.store.coverage import coverage

    latest = None if last is None else {
        "file": shown_path(Path(receipts_dir) / last.file), "state": last.state, "status": last.status,
        "created_at": last.created_at or "", "receipt_id": last.receipt_id, "count": len(assessed),
        "changed": last.changed,
        "coverage": None if last.predicate is None else coverage(last.predicate, spec).as_dict(),
        # a `contracts mutate` receipt: its score, not its one-seed baseline, is what it says
        "mutation": _mutation_of(last.predicate)}
    g = evaluate(spec, receipts_dir, _paths.project_root(), specs_dir, assessed=assessed, implementation=unit,
                 policy=policy)
    return {"latest_receipt": latest,
            "gate": {"promotable": g["promotable"], "unmet": [r["id"] for r in g["requirements"] if not r["met"]]}}


def _mutation_of(pred) -> dict | None:
    m = pred.get("mutation") if isinstance(pred, dict) else None
    if not isinstance(m, dict):
        return None
    score = m.get("score")
    return {"score": score if isinstance(score, (int, float)) and not isinstance(score, bool) else None,
            "complete": m.get("complete") is True}


LIST_SCHEMA = "paper-contracts/list/v1"
LIST_SCHEMA_VERSION = 1


@app.command("list")
@handles_errors
def list_(specs: SpecsOpt = None, receipts: ReceiptsOpt = None, json_out: JsonOpt = False,
          trust: TrustOpt = None) -> None:
    """Every method: level, review, promotion state, contracts, latest receipt and its freshness, gate verdict."""
    specs_dir, receipts_dir = _dirs(specs, receipts)
    policy = _trust_policy(trust, receipts_dir)
    good, bad = _load_valid_specs(specs_dir, receipts_dir)
    rows = []
    for s in good:
        d = s.data
        for unit, label, assessed in _units(s, specs_dir, receipts_dir, policy):  # [impl] one row per implementation
            rows.append({
                "method": s.key, "implementation": unit, "implementation_label": label, "title": d["title"],
                "level": d["level"], "review": d["promotion"]["review"],
                "promotion": d["promotion"]["state"], "contracts": len(d["contracts"]), "mutants": len(d["mutants"]),
                **_receipt_and_gate(s, specs_dir, receipts_dir, unit, assessed, policy),
            })
    invalid = _invalid(bad)
    if json_out:
        _print_json({"schema": LIST_SCHEMA, "schema_version": LIST_SCHEMA_VERSION, "methods": rows,
                     "invalid_specs": [e.as_dict() for e in bad], "invalid": invalid})
    else:
        _print_table(rows, invalid)
        for v in invalid:  # the first error of each; validate lists every one
            more = f" (+{v['errors'] - 1} more: contracts validate {v['file']})" if v["errors"] > 1 else ""
            _err(f"invalid spec {v['method']}: {v['first_error']}{more}")
    if bad:
        raise typer.Exit(E.EXIT_USAGE)


def _invalid(bad: list) -> list[dict]:
    """One entry per spec file that does not validate: its method key (the file name), file, first error, count."""
    out: dict[str, dict] = {}
    for e in bad:
        v = out.setdefault(e.file, {"method": Path(e.file).stem, "file": e.file, "first_error": e.line(), "errors": 0})
        v["errors"] += 1
    return list(out.values())


def _print_table(rows: list[dict], invalid: list[dict]) -> None:
    """The table, fitted to the terminal: method keys are never cut (they are what you type next); below 110
    columns level, review and promotion share the review column, the latest receipt takes two lines, and the
    contract and mutant counts (`contracts show`) give way."""
    from rich import box
    from rich.table import Table

    from engine.text import term_safe_deep

    con = _console()
    narrow = con.width < 110
    t = Table(title=f"{len(rows)} method(s)" + (f", {len(invalid)} invalid spec(s)" if invalid else ""),
              title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False)
    keys = [r["method"] for r in rows] + [v["method"] for v in invalid]
    t.add_column("method", min_width=max(map(len, keys), default=6), overflow="fold")
    cols = ["review"] if narrow else ["level", "review", "promotion", "contracts", "mutants"]
    for col in cols:
        t.add_column(col, overflow="fold", justify="right" if col in ("contracts", "mutants") else "left")
    t.add_column("latest receipt", overflow="fold", ratio=1)
    t.add_column("gate", overflow="fold")
    for r in term_safe_deep(rows):  # titles, file names: data, shown escaped if they hold control characters
        lr = r["latest_receipt"]
        if lr is None:
            latest = "none"
        else:
            label, when = (lr.get("coverage") or {}).get("label"), lr["created_at"] or ""
            stamp = f"{when[:10]} {when[11:16]}Z" if narrow else f"{when[:19]}Z"
            status = lr["status"]
            if lr.get("mutation"):  # "mutate 1.000 (full)": a mutation run, judged by its score
                mu = lr["mutation"]
                status = "mutate " + ("n/a" if mu["score"] is None else f"{mu['score']:.3f}")
                label = "full" if mu["complete"] else "partial"
            if label is None:  # tampered or invalid: no verdict to qualify
                latest = f"{lr['state']}" + (f"\n{stamp}" if narrow else f" {stamp}") if when else lr["state"]
            elif narrow:  # two lines of at most 24 characters
                latest = f"{status} ({label})\n{lr['state']}, {stamp}"
            else:
                latest = f"{status} ({label}, {lr['state']}) {stamp}"
        g = r["gate"]
        method = r["method"] if r["implementation"] == "default" else f"{r['method']} {r['implementation_label']}"
        cells = {"level": r["level"], "review": f"{r['level']} {r['review']}\n{r['promotion']}" if narrow
                 else r["review"], "promotion": r["promotion"],
                 "contracts": str(r["contracts"]), "mutants": str(r["mutants"])}
        t.add_row(method, *[cells[c] for c in cols], latest,
                  "open" if g["promotable"] else f"closed ({len(g['unmet'])} unmet)")
    for v in term_safe_deep(invalid):
        t.add_row(v["method"], *["-" for _ in cols], "invalid spec", "-")
    con.print(t)
