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
    SealedSpecs,
    _sealed,
    _trust_policy,
    app,
    shown_path,
    handles_errors,
)


def row_of(row, receipts_dir: Path) -> dict:
    """One `list --json` row from the read model's UnitRow (engine/store/overview.py)."""
    s = row.spec
    view = row.latest_view()
    latest = None if view is None else {
        "file": shown_path(Path(receipts_dir) / view.file), "state": view.state, "status": view.status,
        "created_at": view.created_at or "", "receipt_id": view.receipt_id, "count": len(row.receipts),
        "changed": list(view.changed),
        "coverage": None if view.coverage is None else view.coverage.as_dict(),
        # a `contracts mutate` receipt: its score, not its one-seed baseline, is what it says
        "mutation": None if view.mutation is None else {"score": view.mutation.score,
                                                        "complete": view.mutation.complete},
        # the outcome in the words every view uses (engine.store.records.describe)
        "outcome": None if view.described is None else view.described.short()}
    return {"method": s.key, "implementation": row.unit, "implementation_label": row.label, "title": s.title,
            "level": s.level, "review": s.review, "promotion": s.state, "contracts": len(s.contracts),
            "mutants": len(s.mutants), "latest_receipt": latest,
            "gate": {"promotable": row.verdict.promotable, "unmet": [r.id for r in row.verdict.unmet]}}


LIST_SCHEMA = "paper-contracts/list/v1"
LIST_SCHEMA_VERSION = 1


@app.command("list")
@handles_errors
def list_(specs: SpecsOpt = None, receipts: ReceiptsOpt = None, json_out: JsonOpt = False,
          trust: TrustOpt = None) -> None:
    """Every method: level, review, promotion state, contracts, latest receipt and its freshness, gate verdict."""
    from engine.store.overview import Overview, count_label

    specs_dir, receipts_dir = _dirs(specs, receipts)
    policy = _trust_policy(trust, receipts_dir)
    sealed = _sealed(policy=policy)  # what was learnt from these exact bytes before (engine/store/sealed.py)
    overview = Overview(specs_dir, receipts_dir, _paths.project_root(), policy=policy, sealed=sealed)
    overview.require_store(shown_path)
    good, bad = _load_valid_specs(specs_dir, receipts_dir, SealedSpecs(sealed))
    units = overview.rows(good)  # [impl] one row per implementation: the registered one, then each candidate
    rows = [row_of(u, receipts_dir) for u in units]
    invalid = _invalid(bad)
    if json_out:
        _print_json({"schema": LIST_SCHEMA, "schema_version": LIST_SCHEMA_VERSION, "methods": rows,
                     "invalid_specs": [e.as_dict() for e in bad], "invalid": invalid})
    else:
        _print_table(rows, invalid, count_label(units, len(invalid)))
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


def _print_table(rows: list[dict], invalid: list[dict], title: str) -> None:
    """The table, fitted to the terminal: method keys are never cut (they are what you type next); below 110
    columns level, review and promotion share the review column, the latest receipt takes two lines, and the
    contract and mutant counts (`contracts show`) give way."""
    from rich import box
    from rich.table import Table

    from engine.text import term_safe_deep

    con = _console()
    narrow = con.width < 110
    t = Table(title=title,
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
            when = lr["created_at"] or ""
            stamp = f"{when[:10]} {when[11:16]}Z" if narrow else f"{when[:19]}Z"
            outcome = lr.get("outcome")  # "passed (partial 3/12)", "mutate 1.000 (full)": the words every view uses
            if outcome is None:  # tampered or invalid: no verdict to qualify
                latest = f"{lr['state']}" + (f"\n{stamp}" if narrow else f" {stamp}") if when else lr["state"]
            elif narrow:  # two lines of at most 24 characters
                latest = f"{outcome}\n{lr['state']}, {stamp}"
            else:
                latest = f"{outcome[:-1]}, {lr['state']}) {stamp}"
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
