"""`contracts check METHOD --impl TARGET`: a candidate implementation under the spec's contracts, in isolated workers.

The verb's options live in engine/cli/check.py; this module runs the --impl
path (engine/run/isolation.py does the work) and writes the one receipt.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from engine import errors as E
from engine import paths as _paths
from engine.cli.check_report import _print_summary
from engine.cli.common import _err, _out, _print_json
from engine.spec.loader import display_path


def run_impl_check(plan, impl: str, device: str, threads: Optional[int], receipts_dir: Path, stop, json_out: bool,
                   timeout_s: Optional[float], memory_mb: Optional[int], flags: str = "",
                   sign_key=None, no_sandbox: bool = False, load_provider=lambda: None) -> None:
    """Check `plan` against the --impl target, write the receipt, exit like `check` (0/1/3/130). `load_provider()`
    is the `--policy` stand-in: the supervisor holds it; the candidate meets it only as a handle."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from engine.run.devices import resolve_device
    from engine.run.impl_loader import identity, parse_target
    from engine.run.isolation import DEFAULT_MEMORY_MB, make_runner, run_candidate
    from engine.run import sandbox
    from engine.run.runner import build_statement, for_candidate
    from engine.spec.interface import from_spec
    from engine.spec.registry import known_names
    from engine.store.receipts import ensure_writable, utc_now, write_receipt

    if timeout_s is not None and not timeout_s > 0:
        raise E.UsageError(f"--impl-timeout {timeout_s}: give a positive number of seconds")
    if memory_mb is not None and memory_mb < 0:
        raise E.UsageError(f"--impl-memory-mb {memory_mb}: give 0 (no limit) or a positive number of MiB")
    plan = for_candidate(plan)  # a candidate is never held to a contract about how the registered one is built
    target = parse_target(impl)
    ident = identity(target)
    spec = plan.spec
    names = list(from_spec(spec.data, known_names().implementations.get(spec.data["implementation"])).names)
    dev = resolve_device(device)
    ensure_writable(receipts_dir)
    # The sandbox masks the store, the signer and the policy; without bwrap (and no --no-sandbox): exit 4 here.
    hidden = sandbox.hidden_paths(receipts_dir, sign_key if isinstance(sign_key, Path) else None,
                                  sign_key if isinstance(sign_key, tuple) else None) \
        if sandbox.require(no_sandbox) else None
    budget = spec.data["budget"]
    deadline = timeout_s or float(budget.get("per_contract_timeout_seconds") or 60)
    provider = load_provider()  # after the store and the sandbox are known to work: loading takes seconds
    created = utc_now()
    total = sum(len(plan.seeds) * len(c["dtypes"]) for c in plan.contracts)
    progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                        console=Console(stderr=True), transient=True)
    with progress:
        task = progress.add_task(f"{spec.key} --impl {ident['target']}", total=total)

        def on_result(r: dict) -> None:
            label = f"mutant {r['mutant']} / {r['contract']}" if r["phase"] == "mutant" else \
                f"{r['contract']} seed {r['seed']} {r['dtype']}"
            progress.update(task, advance=1 if r["phase"] == "baseline" else 0,
                            description=f"{spec.key} --impl {ident['target']}: {label} {r['status']}")

        runner = make_runner(plan, dev, ident, on_result=on_result, should_stop=lambda: stop.stopped, policy=provider)
        try:
            run_candidate(runner, target, ident, names, str(dev), threads, deadline,
                          DEFAULT_MEMORY_MB if memory_mb is None else memory_mb,
                          sandbox.confine(ident, target, hidden, str(dev)))
        finally:
            stop.hold = True  # the receipt is written whole, or not at all
    try:
        stmt = build_statement(runner, created)
        path = write_receipt(receipts_dir, stmt, sign_key=sign_key)  # the workers have finished
    finally:
        stop.hold = False
    pred = stmt["predicate"]
    shown = display_path(path, _paths.project_root())
    if json_out:
        from engine.cli.check_report import check_document, result_summary, run_coverage

        _print_json(check_document([{
            "method": pred["method"], "implementation": pred["implementation"], "status": pred["status"],
            "coverage": run_coverage(pred, spec),
            "receipt": shown, "receipt_id": pred["receipt_id"], "summary": pred["summary"],
            "unproven_contracts": pred["unproven_contracts"], "applicability": pred.get("applicability"),
            "registered_only": pred.get("registered_only"),
            "not_implemented": [{"function": fn, **entry} for fn, entry in not_implemented(pred).items()],
            "results": [result_summary(r) for r in pred["results"]],
            "mutants": [{k: m[k] for k in ("id", "killed", "killed_by")} for m in pred["mutants"]],
            "candidate_mutants": [{k: m[k] for k in ("id", "replaced", "killed", "killed_by")}
                                  for m in pred["candidate_mutants"]]}]))
    else:
        import shlex

        _print_summary(pred, shown, spec=spec, flags=f" --impl {shlex.quote(impl)}{flags}")
        cm = pred["summary"]["candidate_mutants"]
        files = ", ".join(f"{s['name']} sha256 {s['digest']['sha256'][:12]}" for s in ident["subjects"][:4])
        more = f", +{len(ident['subjects']) - 4} more files" if len(ident["subjects"]) > 4 else ""
        _out(f"implementation {ident['target']} (id {ident['digest'][:12]}: {files}{more}); "
                   f"single-function mutants in it: {cm['killed']} killed, {cm['survived']} survived")
        iso = pred.get("isolation") or {}
        _out(f"isolation: sandbox {iso.get('sandbox')}" + (f" {iso['version']}" if iso.get("version") else "")
             + ("" if iso.get("sandbox") != "none" else " (--no-sandbox: a trust policy requiring sandboxed "
                                                          "refuses this receipt)"))
        if iso.get("checks_in"):
            beside = [str(c.get("contract")) for c in iso.get("checks_in_candidate") or []]
            metered = [str(c.get("contract")) for c in iso.get("measured_in_candidate") or []]
            _out(f"checks ran in: {iso['checks_in']}"
                 + (f"; beside the candidate: {', '.join(beside)}" if beside else "")
                 + (f"; memory/time measured in the candidate's process: {', '.join(metered)}" if metered else ""))
        skipped = (pred.get("registered_only") or {}).get("skipped") or []
        if skipped:
            _out(f"not run for a candidate (applies_to: registered, they test how {spec.data['implementation']!r} "
                 f"is built): {', '.join(skipped)}")
        for line in coverage_lines(pred):
            _out(line)
    stubs = not_implemented(pred)
    for m in pred["candidate_mutants"] if not stubs else ():  # with stubs left, the report says fill them in first
        if not m["killed"]:
            _err(f"  survived in the candidate: mutant {m['id']} (its {m['replaced']} swapped in); expected killers: "
                 f"{', '.join(m['expected_killers'])}")
    if not stubs and any(r["status"] not in ("passed", "partial", "not_applicable") for r in pred["results"]) and (
            pred["unproven_contracts"] or any(not m["killed"] for m in pred["mutants"] + pred["candidate_mutants"])):
        _err("  note: a mutant kill counts only where this implementation passed the contract, so the survivors "
             "and unproven contracts above follow from its failures: fix those first")
    status = pred["status"]
    code = (E.EXIT_INTERRUPTED if status == "interrupted" or stop.stopped else E.EXIT_NOT_IMPLEMENTED if stubs
            else E.EXIT_INTERNAL if status == "error" else E.EXIT_FAILED if status == "failed"
            else E.EXIT_OK)  # partial: 0, and the coverage lines say so
    raise typer.Exit(code)


def not_implemented(pred: dict) -> dict[str, dict]:
    """{function: {"at": "file.py:line", "contracts": [...]}} for the candidate's functions that raised
    NotImplementedError in this run (engine/run/unimplemented.py), in the order first met."""
    out: dict[str, dict] = {}
    for r in pred["results"]:
        for d in r.get("not_implemented") or []:
            entry = out.setdefault(str(d.get("function")), {"at": str(d.get("at")), "contracts": []})
            if r["contract"] not in entry["contracts"]:
                entry["contracts"].append(r["contract"])
    return out


def coverage_lines(pred: dict) -> list[str]:
    """What an adapted implementation is (the framework object, its file and version) and which contracts it could
    not be held to: not applicable, or measured in part. Empty for an implementation with the whole interface."""
    impl = pred.get("implementation") or {}
    lines = []
    fn, fw, adapter = impl.get("function"), impl.get("framework"), impl.get("adapter") or {}
    if fn and fw:
        lines.append(f"{fw['name']} {fw.get('version') or '?'} object {fn['name']!r}: {fn['qualname']} in "
                     f"{fn['file']} (sha256 {fn['sha256'][:12]})")
        for name, why in adapter.get("supplied", {}).items():
            lines.append(f"  {name}: supplied by the adapter, not {fw['name']}'s ({why})")
        by_why: dict[str, list[str]] = {}
        for m in adapter.get("mutants_not_run", []):
            by_why.setdefault(m["why"], []).append(m["id"])
        for why, ids in by_why.items():
            lines.append(f"  single-function mutants not run in it ({why}): {', '.join(ids)}")
    cov = pred.get("applicability")
    if not cov:
        return lines
    total = len(pred["summary"]["contracts"])
    na, part = cov.get("not_applicable") or {}, cov.get("partial") or {}
    lines.append(f"coverage PARTIAL: {total - len(na)} of {total} contracts measured, {len(part)} of them in part; "
                 "the gate never counts a partial or not-applicable result as passed")
    if na:
        reasons = sorted({str(v).removeprefix("not applicable: ") for v in na.values()})
        lines.append(f"  not applicable: {', '.join(na)} ({'; '.join(reasons)})")
    for cid, entry in part.items():
        lines.append(f"  partial: {cid}: {', '.join(entry['not_measured'])} not measured "
                     f"({'; '.join(entry['reasons'])})")
    return lines
