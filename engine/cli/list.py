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


def _receipt_and_gate(spec, specs_dir: Path, receipts_dir: Path, policy=None) -> dict:
    """`list` columns: the latest receipt with its freshness, and the gate verdict (the same evaluation as `gate`,
    sped up by the validation cache: a display; `contracts gate` decides from the files)."""
    from engine.gate.verdict import evaluate
    from engine.store.verify import assess_receipts

    assessed, _ = assess_receipts(receipts_dir, _paths.project_root(), specs_dir, spec.key,
                                  cache=_spec_cache(receipts_dir), policy=policy)
    dated = [a for a in assessed if a.created_at]
    last = max(dated, key=lambda a: a.created_at) if dated else (assessed[-1] if assessed else None)
    latest = None if last is None else {
        "file": last.file.split("/")[-1], "state": last.state, "status": last.status, "created_at": last.created_at or "",
        "receipt_id": last.receipt_id, "count": len(assessed), "changed": last.changed}
    g = evaluate(spec, receipts_dir, _paths.project_root(), specs_dir, assessed=assessed, policy=policy)
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
        rows.append({
            "method": s.key, "title": d["title"], "level": d["level"], "review": d["promotion"]["review"],
            "promotion": d["promotion"]["state"], "contracts": len(d["contracts"]), "mutants": len(d["mutants"]),
            **_receipt_and_gate(s, specs_dir, receipts_dir, policy),
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
        for r in rows:
            lr = r["latest_receipt"]
            latest = "none" if lr is None else f"{lr['status']} ({lr['state']}) {lr['created_at'][:19]}Z"
            g = r["gate"]
            t.add_row(r["method"], r["level"], r["review"], r["promotion"], str(r["contracts"]), str(r["mutants"]),
                      latest, "open" if g["promotable"] else f"closed ({len(g['unmet'])} unmet)")
        _console().print(t)
    if bad:
        raise typer.Exit(E.EXIT_USAGE)
