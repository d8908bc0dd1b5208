"""What `contracts check` prints at the end of a run, and the cells path (--jobs N, --executor ray).

`--json` follows engine/schemas/check.schema.json (`contracts schema check`); `check_document` builds it.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Optional

import typer

from engine import errors as E
from engine import paths as _paths
from engine.cli.common import (
    _console,
    _err,
    _print_json,
)
from engine.spec.loader import display_path
from engine.text import term_safe
from engine.tiers import tier_counts, tier_of


CHECK_SCHEMA = "paper-contracts/check/v1"
CHECK_SCHEMA_VERSION = 1


def check_document(runs: list[dict]) -> dict:
    """What `check --json` prints: one entry per receipt written."""
    return {"schema": CHECK_SCHEMA, "schema_version": CHECK_SCHEMA_VERSION, "runs": runs}


def run_coverage(pred: dict, spec=None) -> dict:
    from engine.store.coverage import coverage

    return coverage(pred, spec).as_dict()


def _print_summary(pred: dict, receipt: str, spec=None, flags: str = "") -> None:
    """The run's table on stdout, then its failures grouped per contract on stderr (engine/cli/failure_report.py).

    `spec` (the loaded Spec) gives the failure blocks their spec line and formulas; `flags` are the
    --specs/--receipts options as given, so the printed repro command runs on the same files.
    """
    from rich import box
    from rich.table import Table

    from engine.cli.failure_report import failure_report, report_width
    from engine.run.expect import format_headroom, is_sanity, worst_expectation
    from engine.store.coverage import coverage
    from engine.text import term_safe_deep

    cov = coverage(pred, spec)
    pred, receipt = term_safe_deep(pred), term_safe_deep(receipt)  # messages and names are data, never control codes
    con = _console()
    # Below 110 columns the killing mutants are counted, not named (their ids would not fit beside the contract
    # ids, which are never cut: they are what --only takes next), the kind (contracts show) gives way, and an
    # error count joins the failed column.
    narrow = con.width < 110
    # A partial run says so beside its verdict: "PASSED (partial 1/11: --only clip_schedule)" is no full pass.
    t = Table(title=f"{pred['method']} on {pred['environment']['device']['name']}: {pred['status'].upper()} "
                    f"({term_safe(cov.text())})", title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False,
              show_edge=False)
    ids = list(pred["summary"]["contracts"])
    t.add_column("contract", min_width=max(map(len, ids), default=8), overflow="fold")
    cols = ("tier", "passed", "failed", "worst headroom", "mutants") if narrow else \
        ("kind", "tier", "passed", "failed", "error", "worst headroom", "mutants killing it")
    for col in cols:
        t.add_column(col, overflow="fold", justify="right" if col in ("passed", "failed", "error", "mutants")
                     else "left")
    records: dict[str, list] = {}
    kinds: dict[str, str] = {}
    for r in pred["results"]:
        kinds[r["contract"]] = r["kind"]
        # an expectation not measurable on this implementation is neither held nor broken: not a "worst" one
        records.setdefault(r["contract"], []).extend(e for e in r["expectations"] if "not_applicable" not in e)
    for cid, s in pred["summary"]["contracts"].items():
        w = worst_expectation(records.get(cid, []))
        shown = "" if w is None else ("held" if w.get("passed") else "not held") if is_sanity(w) \
            else format_headroom(w.get("headroom"))
        if not s["passed"] + s["failed"] + s["error"] + s.get("partial", 0) + s.get("not_applicable", 0):
            shown = "not run"  # an interrupt came first: nothing measured, nothing claimed
        killers = pred["contracts_proven"].get(cid, [])
        passed = f"{s['passed']}/{s['requested']}"
        if s.get("not_applicable") == s["requested"]:
            passed = "n/a"
        elif s.get("partial") or s.get("not_applicable"):
            passed += f" (+{s.get('partial', 0)} partial)" if s.get("partial") else f" ({s['not_applicable']} n/a)"
        if narrow:
            failed = str(s["failed"]) + (f" +{s['error']} err" if s["error"] else "")
            t.add_row(cid, tier_of(s), passed, failed, shown, str(len(killers)))
        else:
            t.add_row(cid, kinds.get(cid, ""), tier_of(s), passed, str(s["failed"]), str(s["error"]),
                      shown, ", ".join(killers) or "-")
    con.print(t)
    typer.echo(tiers_line(pred["summary"], pred.get("request")))
    if (pred.get("request") or {}).get("seed_source") == "fresh":
        seeds = ",".join(map(str, pred["request"]["seeds"]))
        typer.echo(f"seeds: fresh {seeds}, drawn at run time; rerun: --seeds {seeds}")
    for line in failure_report(pred, spec, flags, width=report_width()):
        # pred is terminal-safe already and the spec's text fields refuse control characters; the only escape
        # codes left are the report's own colours, which _err would print as text
        typer.echo(line, err=True)
    ms = pred["summary"]["mutants"]
    typer.echo(f"mutants: {ms['killed']} killed, {ms['survived']} survived")
    for e in pred["errors"]:
        _err(f"  {e}")
    c = pred["cost"]
    # one unwrapped line: the receipt's path is copied from here
    typer.echo(f"wall {c['wall_s']:.2f} s, {c['optimizer_updates']} optimizer updates, {c['sampled_tokens']} sampled "
               f"tokens; receipt {receipt}")


def result_summary(r: dict) -> dict:
    """One result as `check --json` lists it (the receipt holds the rest), with its contract's tier."""
    return {**{k: r[k] for k in ("contract", "seed", "dtype", "status", "measurements", "message")},
            "tier": tier_of(r)}


def tiers_line(summary: dict, request: Optional[dict] = None) -> str:
    """`tiers: math 11/12 contracts held (1 failed); budget 1/1 held; scale 2/2 held` (or `budget none`, or `scale not
    run (--tier math)`): whether the maths, a budget or the maths at scale failed, and what a --tier run left out."""
    chosen = (request or {}).get("tiers")
    parts = []
    for tier, n in tier_counts(summary).items():
        if isinstance(chosen, list) and tier not in chosen:
            parts.append(f"{tier} not run (--tier {','.join(map(str, chosen))})")
            continue
        if not n["contracts"]:
            parts.append(f"{tier} none")  # no contract of this tier in the run
            continue
        extra = [f"{n[k]} {w}" for k, w in (("failed", "failed"), ("other", "partial or not run")) if n[k]]
        parts.append(f"{tier} {n['held']}/{n['contracts']} {'contracts ' if not parts else ''}held"
                     + (f" ({', '.join(extra)})" if extra else ""))
    return "tiers: " + "; ".join(parts)


def print_all_summary(outcomes: list[dict], planned: int) -> None:
    """The last line of `check --all`: how many methods passed and failed, how many receipts were written."""
    from engine.cli.colour import bad, good

    counts = Counter(o["status"] for o in outcomes)
    partial = sum(1 for o in outcomes if not (o.get("coverage") or {}).get("full", True))
    parts = [good(f"{counts['passed']} passed") if counts["passed"] else "0 passed",
             bad(f"{counts['failed']} failed") if counts["failed"] else "0 failed"]
    parts += [bad(f"{counts[s]} {s}") for s in ("error", "interrupted") if counts[s]]
    if len(outcomes) < planned:
        parts.append(f"{planned - len(outcomes)} not run")
    written = sum(1 for o in outcomes if o.get("receipt"))
    typer.echo(f"checked {planned} method{'s' if planned != 1 else ''}: {', '.join(parts)}; "
               f"{written} receipt{'s' if written != 1 else ''} written" + (f" ({partial} partial)" if partial else ""))


def _check_cells(plans: list, device: str, executor: str, jobs: int, address: Optional[str], receipts_dir: Path,
                 json_out: bool, policy: Optional[str] = None, threads: Optional[int] = None, flags: str = "",
                 all_summary: bool = False, sign_key=None) -> None:
    """Run every (method, seed) cell on the executor (engine.run.session), print each merged receipt, exit like check."""
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
    )

    from engine.cli.stopflag import _StopFlag
    from engine.run import session

    session.check_cells_options(executor, jobs, address, policy)
    cells = sum(len(p.seeds) for p in plans)
    progress = Progress(TextColumn("{task.description}", markup=False),  # names and failures are data
                        BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                        console=Console(stderr=True), transient=True)
    with progress, _StopFlag() as stop:
        task = progress.add_task(f"{cells} cells on {executor}", total=cells)

        def on_progress(cell, r: dict) -> None:
            what = f"mutant {r['mutant']} / {r['contract']}" if r.get("phase") == "mutant" else \
                f"{r['contract']} {r['dtype']}"
            progress.update(task, description=f"{cell.method} seed {cell.seed}: {what} {r['status']}")

        def on_cell(o) -> None:
            progress.update(task, advance=1, description=term_safe(f"{o.cell.method} seed {o.cell.seed}: "
                                                                   f"{'done' if o.data is not None else o.failure}"))

        written = session.run_cells(plans, device, executor, jobs, address, receipts_dir, threads=threads, stop=stop,
                                    on_progress=on_progress, on_cell=on_cell, sign_key=sign_key)
    specs = {p.spec.key: p.spec for p in plans}
    outcomes = [_merged_outcome(stmt, path, json_out, specs.get(stmt["predicate"]["method"]), flags)
                for stmt, path in written]
    if json_out:
        _print_json(check_document(outcomes))
    elif all_summary:
        print_all_summary(outcomes, len(plans))
    statuses = {o["status"] for o in outcomes}
    code = (E.EXIT_INTERRUPTED if "interrupted" in statuses or not outcomes else E.EXIT_INTERNAL
            if "error" in statuses else E.EXIT_FAILED if "failed" in statuses else E.EXIT_OK)
    raise typer.Exit(code)


def _merged_outcome(stmt: dict, path: Path, json_out: bool, spec=None, flags: str = "") -> dict:
    pred = stmt["predicate"]
    shown = display_path(path, _paths.project_root())
    if not json_out:
        _print_summary(pred, shown, spec, flags)
    return {"method": pred["method"], "status": pred["status"], "coverage": run_coverage(pred, spec),
            "receipt": shown, "receipt_id": pred["receipt_id"],
            "summary": pred["summary"], "cost": pred["cost"], "unproven_contracts": pred["unproven_contracts"],
            "execution": pred["execution"],
            "results": [result_summary(r) for r in pred["results"]],
            "mutants": [{k: m[k] for k in ("id", "killed", "killed_by")} for m in pred["mutants"]]}


def _policy_summary(pred: dict) -> Optional[dict]:
    p = pred.get("policy")
    if not p:
        return None
    ck = p.get("checkpoint") or {}
    return {"kind": p.get("kind"), "checkpoint": ck.get("name"), "config_sha256": ck.get("config_sha256"),
            "lora": p.get("lora"), "used_by": p.get("used_by", [])}


def _note_policy(pred: dict) -> None:
    """Say which contracts trained the given policy; a policy nothing used must not pass unnoticed."""
    p = _policy_summary(pred)
    if p is None:
        return
    lora = f"LoRA rank {p['lora']['rank']}" if p["lora"] else "all weights trained"
    if p["used_by"]:
        _err(f"policy: {p['kind']} checkpoint {p['checkpoint']} ({lora}), config sha256 "
             f"{(p['config_sha256'] or '')[:12]}, used by: {', '.join(p['used_by'])}")
    else:
        _err(f"warning: --policy was given but no selected contract of {pred['method']} builds a policy "
             "(only mechanism runs do); this receipt's results do not depend on it")
