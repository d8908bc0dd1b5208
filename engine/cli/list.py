"""`contracts list`: every method with its latest receipt and gate verdict."""

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
    latest = None if last is None else {
        "file": last.file.split("/")[-1], "state": last.state, "status": last.status, "created_at": last.created_at or "",
        "receipt_id": last.receipt_id, "count": len(assessed), "changed": last.changed}
    g = evaluate(spec, receipts_dir, _paths.project_root(), specs_dir, assessed=assessed, implementation=unit,
                 policy=policy)
    return {"latest_receipt": latest,
            "gate": {"promotable": g["promotable"], "unmet": [r["id"] for r in g["requirements"] if not r["met"]]}}


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
    for e in bad:
        _err(e.line())
    if json_out:
        _print_json({"methods": rows, "invalid_specs": [e.as_dict() for e in bad]})
    else:
        from rich.table import Table

        t = Table(title=f"{len(rows)} method(s)", title_justify="left")
        for col in ("method", "level", "review", "promotion", "contracts", "mutants", "latest receipt", "gate"):
            t.add_column(col)
        from engine.text import term_safe_deep

        for r in term_safe_deep(rows):  # titles, file names: data, shown escaped if they hold control characters
            lr = r["latest_receipt"]
            latest = "none" if lr is None else f"{lr['status']} ({lr['state']}) {lr['created_at'][:19]}Z"
            g = r["gate"]
            method = r["method"] if r["implementation"] == "default" else f"{r['method']} {r['implementation_label']}"
            t.add_row(method, r["level"], r["review"], r["promotion"], str(r["contracts"]), str(r["mutants"]),
                      latest, "open" if g["promotable"] else f"closed ({len(g['unmet'])} unmet)")
        _console().print(t)
    if bad:
        raise typer.Exit(E.EXIT_USAGE)
