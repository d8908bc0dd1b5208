"""`contracts show`: one method in full."""

from __future__ import annotations

from typing import Annotated

import typer

from engine import paths as _paths
from engine.cli.common import (
    JsonOpt,
    ReceiptsOpt,
    SpecsOpt,
    _console,
    _dirs,
    _print_json,
    SealedSpecs,
    _sealed,
    app,
    handles_errors,
    shown_path,
)
from engine.paths import spec_path
from engine.spec.applies import applies_to
from engine.tiers import TIERS, tier_of


def _fmt_expect(e: dict) -> str:
    op = next((k for k in ("le", "lt", "ge", "gt", "eq") if k in e), None)
    text = f"{e['metric']} {op} {e[op]}" if op else f"{e['metric']} le dtype-default {e['default']}"
    return text + (f" [{e['dtype']}]" if "dtype" in e else "")


@app.command()
@handles_errors
def show(
    method: Annotated[str, typer.Argument(help="Method key, e.g. tapo-trajectory.")],
    specs: SpecsOpt = None,
    receipts: ReceiptsOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """One method in full: formulas, assumptions, contracts, mutants, budget, paper results, receipts."""
    import shlex
    import textwrap

    from engine.store.overview import Overview, ReceiptView

    specs_dir, receipts_dir = _dirs(specs, receipts)
    sealed = _sealed()
    spec = SealedSpecs(sealed).load_spec(spec_path(specs_dir, method), _paths.project_root())
    d = spec.data
    # the same read model as list (and the same display cache): one method's units, newest receipts, verdicts
    overview = Overview(specs_dir, receipts_dir, _paths.project_root(), sealed=sealed)
    overview.require_store(shown_path)
    units = overview.units(spec)
    recent = []
    for row in units:
        for a in row.receipts[-5:]:
            view = ReceiptView.of(a, spec)
            recent.append({"file": shown_path(receipts_dir / a.file), "state": a.state, "status": a.status,
                           "created_at": a.created_at, "implementation": row.unit,
                           "implementation_label": row.label,
                           "outcome": None if view.described is None else view.described.short()})
    gates = [{"implementation": row.unit, "implementation_label": row.label, "promotable": row.verdict.promotable,
              "unmet": [r.id for r in row.verdict.unmet],
              "command": f"contracts gate {spec.key}" + ("" if not row.is_candidate else " --impl " + shlex.quote(
                  next((a.receipt.implementation.target for a in row.receipts if a.receipt is not None), None)
                  or "TARGET"))} for row in units]
    from engine.spec import depends

    deps = [{"method": x.method, "why": x.why} for x in depends.declared(d)]
    dependents = depends.dependents(spec.key, specs_dir, _paths.project_root(), SealedSpecs(sealed).validate_file)
    # every contract says whom it binds: any implementation (the paper's rule), or the registered one only
    d = {**d, "contracts": [{**c, "applies_to": applies_to(c)} for c in d["contracts"]]}
    if json_out:
        _print_json({"spec": d, "file": spec.display, "sha256": spec.sha256, "tiers": _tiers(d), "receipts": recent,
                     "gate": gates, "applies_to": _applies(d), "depends_on": deps, "dependents": dependents})
        return
    from rich.table import Table

    from engine.text import term_safe_deep

    d, recent, gates = term_safe_deep(d), term_safe_deep(recent), term_safe_deep(gates)  # spec text is data: no control sequence reaches the terminal
    deps, dependents = term_safe_deep(deps), term_safe_deep(dependents)
    con = _console()
    p = d["paper"]
    con.print(f"{spec.key}: {d['title']}", style="bold")
    con.print(f"arXiv {p['arxiv']} {p['version']} | {p['institution']} | first public {p['first_public']} | "
              f"code released: {'yes' if p['code_released'] else 'no'} | licence: {p['license'] or 'unknown'}")
    con.print(f"level {d['level']} | implementation {d['implementation']} | review {d['promotion']['review']} | "
              f"promotion {d['promotion']['state']}")
    for x in deps:  # the gate needs each one's fresh, passing receipts on this tree (depends:<method>)
        con.print(f"depends on {x['method']}" + (f": {x['why']}" if x["why"] else ""))
    if dependents:
        con.print(f"depended on by {', '.join(dependents)} (their gates need this method's fresh, passing receipts)")
    t = Table(title="formulas", title_justify="left")
    t.add_column("id"), t.add_column("implements"), t.add_column("LaTeX")
    for f in d["formulas"]:
        t.add_row(f["id"], f["implements"], f["latex"])
    con.print(t)
    con.print("assumptions", style="bold")
    for a in d["assumptions"]:
        con.print(f"- {a['id']}: {a['text']}")
    t = Table(title="contracts", title_justify="left")
    for col in ("id", "kind", "tier", "applies to", "check", "dtypes", "cases", "expect"):
        t.add_column(col)
    for c in d["contracts"]:
        check = c.get("check", "")
        t.add_row(c["id"], c["kind"], tier_of(c), c["applies_to"], "" if check.startswith("kind:") else check,
                  ",".join(c["dtypes"]), str(c["cases"]), "; ".join(_fmt_expect(e) for e in c["expect"]))
    con.print(t)
    tiers = _tiers(d)  # the few budget and scale contracts by name: the rest is maths
    con.print(f"tiers: math {len(tiers['math'])}; "
              + "; ".join(f"{t} {len(tiers[t])}" + (f" ({', '.join(tiers[t])})" if tiers[t] else "")
                          for t in TIERS if t != "math"))
    held = _applies(d)
    con.print(f"a candidate (--impl, evolve) is held to {len(held['any'])} of {len(d['contracts'])} contracts"
              + (f"; registered implementation only (how it is built): {', '.join(held['registered'])}"
                 if held["registered"] else ""))
    con.print("contract parameters", style="bold")
    for c in d["contracts"]:
        con.print(f"- {c['id']} ({c['kind']}, applies to {c['applies_to']})")
        if c.get("why"):
            why = textwrap.fill(f"why bespoke: {c['why']}", 80, initial_indent="    # ", subsequent_indent="    # ",
                                break_long_words=False, break_on_hyphens=False)
            con.print(why, soft_wrap=True)
        for line in _fmt_params(c.get("params") or {}):
            con.print(line, soft_wrap=True)  # already within 80 columns: no second wrap
    t = Table(title="mutants (known-bad variants each contract set must kill)", title_justify="left")
    t.add_column("id"), t.add_column("breaks"), t.add_column("killed by")
    for m in d["mutants"]:
        t.add_row(m["id"], m["description"], ", ".join(m["killed_by"]))
    con.print(t)
    b = d["budget"]
    con.print(f"budget: seeds {b['seeds']} (max {b['max_seeds']}), <= {b['max_updates_per_seed']} "
              f"updates and {b['max_tokens_per_seed']} sampled tokens per seed, <= {b['max_wall_seconds']} s, "
              f"downloads: {b['downloads']}")
    t = Table(title="paper-reported results (NOT measured here)", title_justify="left")
    for col in ("id", "source", "model", "benchmark", "metric", "baseline", "method"):
        t.add_column(col)
    for r in d["paper_results"]["results"]:
        t.add_row(r["id"], r["source"], r["model"], r["benchmark"], r["metric"],
                  f"{r.get('baseline', '')} {r.get('baseline_value', '')}".strip(), str(r["value"]))
    con.print(t)
    con.print("promotion: " + d["promotion"]["state"], style="bold")
    for reason in d["promotion"]["reasons"]:
        con.print(f"- {reason}")
    con.print("latest receipts" + ("" if recent else ": none yet (run contracts check "
                                                                  f"{spec.key} --device cpu)"))
    for r in recent:
        unit = "" if r["implementation"] == "default" else f"  [{r['implementation_label']}]"
        con.print(f"- {r['file']}  {r['outcome'] or r['status']}  {r['state']}{unit}")
    for g in gates:
        unit = "" if g["implementation"] == "default" else f" [{g['implementation_label']}]"
        con.print(f"gate{unit}: " + ("open" if g["promotable"] else f"closed ({len(g['unmet'])} unmet: "
                                     + ", ".join(g["unmet"]) + f"; {g['command']} says why)"))


def _tiers(d: dict) -> dict[str, list[str]]:
    """The contract ids of each tier (math, budget, scale), in spec order."""
    return {tier: [c["id"] for c in d["contracts"] if tier_of(c) == tier] for tier in TIERS}


def _applies(d: dict) -> dict[str, list[str]]:
    """The contract ids that bind any implementation (a candidate's check runs them) and the registered one only."""
    return {"any": [c["id"] for c in d["contracts"] if applies_to(c) == "any"],
            "registered": [c["id"] for c in d["contracts"] if applies_to(c) == "registered"]}


def _fmt_params(params: dict) -> list[str]:
    """Parameters (inputs included) as YAML lines within 80 columns, indented under their contract."""
    from engine.yamltext import lines

    return lines(params, width=80, indent="    ") if params else ["    (no parameters)"]
