"""What `contracts check` prints at the end of a run, and the cells path (--jobs N, --executor ray)."""

from __future__ import annotations

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


def _print_summary(pred: dict, receipt: str) -> None:
    from rich.table import Table

    con = _console()
    t = Table(title=f"{pred['method']} on {pred['environment']['device']['name']}: {pred['status'].upper()}",
              title_justify="left")
    for col in ("contract", "kind", "passed", "failed", "error", "worst margin", "mutants killing it"):
        t.add_column(col)
    worst: dict[str, float] = {}
    kinds: dict[str, str] = {}
    for r in pred["results"]:
        kinds[r["contract"]] = r["kind"]
        for e in r["expectations"]:
            if isinstance(e.get("margin"), (int, float)):
                worst[r["contract"]] = min(worst.get(r["contract"], float("inf")), e["margin"])
    for cid, s in pred["summary"]["contracts"].items():
        w = worst.get(cid)
        t.add_row(cid, kinds.get(cid, ""), f"{s['passed']}/{s['requested']}", str(s["failed"]), str(s["error"]),
                  "" if w is None else f"{w:.3g}", ", ".join(pred["contracts_proven"].get(cid, [])) or "-")
    con.print(t)
    for r in pred["results"]:
        if r["status"] != "passed":
            _err(f"  {r['status']}: {r['contract']} seed {r['seed']} {r['dtype']}: {r['message']}")
    ms = pred["summary"]["mutants"]
    con.print(f"mutants: {ms['killed']} killed, {ms['survived']} survived")
    for m in pred["mutants"]:
        if not m["killed"]:
            _err(f"  survived: mutant {m['id']} ({m['description']}); expected killers: "
                 f"{', '.join(m['expected_killers'])}" + (f"; {m['error']}" if m.get("error") else ""))
    for cid in pred["unproven_contracts"]:
        _err(f"  unproven: contract {cid} was not shown to fail on any mutant")
    for e in pred["errors"]:
        _err(f"  {e}")
    c = pred["cost"]
    con.print(f"wall {c['wall_s']:.2f} s, {c['optimizer_updates']} optimizer updates, {c['sampled_tokens']} sampled "
              f"tokens; receipt {receipt}")


def _check_cells(plans: list, device: str, executor: str, jobs: int, address: Optional[str], receipts_dir: Path,
                 json_out: bool, policy: Optional[str] = None, threads: Optional[int] = None,
                 sign_key=None) -> None:
    """Run every (method, seed) cell on the executor, write one merged receipt per method, exit like check."""
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
    )

    from engine.run.executors import EXECUTORS, execute
    from engine.store.receipts import ensure_writable

    if executor not in EXECUTORS:
        raise E.UsageError(f"--executor {executor!r} is not an executor; use {' or '.join(EXECUTORS)}")
    if jobs < 1:
        raise E.UsageError(f"--jobs {jobs}: give 1 or more processes")
    if address and executor != "ray":
        raise E.UsageError("--address names a Ray cluster; add --executor ray")
    if executor == "ray" and jobs != 1:
        raise E.UsageError("--jobs is for the local executor; Ray schedules by the cluster's CPUs and GPUs")
    if policy is not None:
        raise E.UsageError("--policy runs in one process for now; drop --jobs/--executor to check a checkpoint")
    if executor == "local":
        from engine.run.devices import resolve_device

        resolve_device(device)  # exit 4 here, before any worker starts; Ray workers resolve it on their node
    ensure_writable(receipts_dir)
    cells = sum(len(p.seeds) for p in plans)
    progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                        console=Console(stderr=True), transient=True)
    from engine.cli.check import _StopFlag

    with progress, _StopFlag() as stop:
        task = progress.add_task(f"{cells} cells on {executor}", total=cells)

        def on_progress(cell, r: dict) -> None:
            what = f"mutant {r['mutant']} / {r['contract']}" if r.get("phase") == "mutant" else \
                f"{r['contract']} {r['dtype']}"
            progress.update(task, description=f"{cell.method} seed {cell.seed}: {what} {r['status']}")

        def on_cell(o) -> None:
            progress.update(task, advance=1, description=f"{o.cell.method} seed {o.cell.seed}: "
                                                         f"{'done' if o.data is not None else o.failure}")

        try:
            statements = execute(plans, device, executor=executor, jobs=jobs, address=address, threads=threads,
                                 on_progress=on_progress, on_cell=on_cell, should_stop=lambda: stop.stopped)
        except KeyboardInterrupt as exc:
            statements = getattr(exc, "statements", [])
    outcomes = [_write_merged(stmt, receipts_dir, json_out, sign_key) for stmt in statements]
    if json_out:
        _print_json({"runs": outcomes})
    statuses = {o["status"] for o in outcomes}
    code = (E.EXIT_INTERRUPTED if "interrupted" in statuses or not outcomes else E.EXIT_INTERNAL
            if "error" in statuses else E.EXIT_FAILED if "failed" in statuses else E.EXIT_OK)
    raise typer.Exit(code)


def _write_merged(stmt: dict, receipts_dir: Path, json_out: bool, sign_key=None) -> dict:
    from engine.store.receipts import write_receipt

    path = write_receipt(receipts_dir, stmt, sign_key=sign_key)  # after every cell finished
    pred = stmt["predicate"]
    shown = display_path(path, _paths.project_root())
    if not json_out:
        _print_summary(pred, shown)
    return {"method": pred["method"], "status": pred["status"], "receipt": shown, "receipt_id": pred["receipt_id"],
            "summary": pred["summary"], "cost": pred["cost"], "unproven_contracts": pred["unproven_contracts"],
            "execution": pred["execution"],
            "results": [{k: r[k] for k in ("contract", "seed", "dtype", "status", "measurements", "message")}
                        for r in pred["results"]],
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
