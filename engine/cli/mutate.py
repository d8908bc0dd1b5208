"""`contracts mutate`: mutation testing of a method's source, judged by the method's own contracts."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from engine import errors as E
from engine import paths as _paths
from engine.cli.common import JsonOpt, ReceiptsOpt, SpecsOpt, _dirs, _err, _out, _print_json, app, handles_errors
from engine.paths import spec_path
from engine.spec.loader import display_path


def _print_report(section: dict, method: str, receipt: str) -> None:
    score = section["score"]
    shown = "n/a" if score is None else f"{score:.3f}"
    verdict = "PASSED" if section["passed"] else "FAILED"
    _out(f"{method}: mutation score {shown} (threshold {section['threshold']:g}, {section['threshold_source']}) "
         f"{verdict}")
    _out(f"  {section['mutants']} mutants of executed lines: {section['killed']} killed, "
         f"{section['survived']} survived, {section['timeout']} timeout, {section['equivalent']} equivalent"
         + ("" if section["complete"] else f" (a selection: {section['selection']['run']} of "
                                           f"{section['selection']['candidates']} candidates)"))
    for f in section["files"]:
        _out(f"  {f['file']}: {f['executed_lines']} executed lines, {f['mutants']} mutants")
    killers: dict[str, int] = {}
    for r in section["results"]:
        if r["status"] == "killed":
            killers[r["killed_by"]] = killers.get(r["killed_by"], 0) + 1
    if killers:
        _out("  killed by: " + ", ".join(f"{k} {n}" for k, n in
                                         sorted(killers.items(), key=lambda kv: (-kv[1], kv[0]))))
    for s in section["survivors"]:
        _out(f"  survived {s['id']} ({s['description']})")
        for line in s["diff"].splitlines()[2:]:
            _out(f"      {line}")
    for s in section["timeouts"]:
        _out(f"  timeout  {s['id']} ({s['description']})")
    for s in section["equivalents"]:
        _out(f"  equivalent {s['id']}: {s['reason']}")
    for i in section["listed_but_killed"]:
        _err(f"  warning: {i} is listed in equivalent_mutants but was killed: remove it from the spec")
    if section["complete"]:
        for i in section["listed_not_run"]:
            _err(f"  warning: {i} is listed in equivalent_mutants but no such mutant was run (the code changed: "
                 "re-judge it)")
    elif section["listed_not_run"]:  # a selection leaves most listed ids out: one line, not one per id
        n = len(section["listed_not_run"])
        _err(f"  note: {n} mutant{'s' if n != 1 else ''} listed in equivalent_mutants {'were' if n != 1 else 'was'} "
             "not in this selection; a complete run (no --max-mutants, --only-file or --operators) checks every "
             "listed id")
    _out(f"  wall {section['wall_s']:.1f} s (baseline {section['baseline_wall_s']:.1f} s, --jobs "
         f"{section['jobs']}); receipt {receipt}")


@app.command()
@handles_errors
def mutate(
    method: Annotated[str, typer.Argument(help="Method key, e.g. tapo-trajectory.")],
    jobs: Annotated[int, typer.Option("--jobs", "-j", metavar="N", help="Judge N mutants at once, each in its own process.")] = 1,
    seeds: Annotated[Optional[str], typer.Option(metavar="S,S,...", help="Comma-separated seeds (default: the budget's first).")] = None,
    max_mutants: Annotated[Optional[int], typer.Option("--max-mutants", metavar="N", help="Judge at most N mutants, spread "
                                                                             "evenly over the candidates.")] = None,
    only_file: Annotated[Optional[list[str]], typer.Option("--only-file", metavar="FILE", help="Mutate only this file (name or "
                                                                               "repository path; repeatable).")] = None,
    operators: Annotated[Optional[str], typer.Option(metavar="OP,OP,...", help="Comma-separated operators (default: all): arith, compare, "
                                                          "logic, minmax, sign, constant, dim, detach, reduce.")] = None,
    timeout: Annotated[Optional[float], typer.Option(metavar="SECONDS", help="Seconds one mutant may take before it counts as "
                                                          "`timeout` (default: from the baseline's time).")] = None,
    device: Annotated[str, typer.Option(metavar="DEVICE", help="cpu, cuda or cuda:N. Never falls back.")] = "cpu",
    sign_key: Annotated[Optional[Path], typer.Option(
        "--sign-key", metavar="FILE", help="Sign the receipt (DSSE, ed25519) with this private key (default: "
                           "$CONTRACTS_SIGNING_KEY), as contracts check does; only a separate signing process "
                           "reads it, after every mutant's process has ended.")] = None,
    sign_command: Annotated[Optional[str], typer.Option(
        "--sign-command", metavar="COMMAND", help="Sign the receipt with this command instead (default: "
                               "$CONTRACTS_SIGN_COMMAND); see docs/trust.md.")] = None,
    specs: SpecsOpt = None,
    receipts: ReceiptsOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Plant small source bugs (mutants) on executed lines; report which the contracts catch; write a receipt.

    Exit 0 when the score meets promotion.requires.mutation_score (0.9 when unset), 1 when not or when the
    unmutated code fails its contracts, 5 when no mutant was generated.
    """
    from engine.cli.check import _parse_seeds
    from engine.run.devices import parse_device
    from engine.run.mutate.operators import OPERATORS
    from engine.run.mutate.session import Options, run, statement
    from engine.spec.loader import load_spec
    from engine.store.receipts import ensure_writable, utc_now, write_receipt

    specs_dir, receipts_dir = _dirs(specs, receipts)
    if parse_device(device)[0] != "cpu":
        from engine.run.devices import resolve_device

        resolve_device(device)  # no CUDA here: exit 4 now, not a failed baseline later
    if jobs < 1:
        raise E.UsageError(f"--jobs {jobs}: give 1 or more processes")
    if max_mutants is not None and max_mutants < 1:
        raise E.UsageError(f"--max-mutants {max_mutants}: give 1 or more")
    if timeout is not None and timeout <= 0:
        raise E.UsageError(f"--timeout {timeout}: give a positive number of seconds")
    ops = frozenset(OPERATORS)
    if operators is not None:
        ops = frozenset(o.strip() for o in operators.split(",") if o.strip())
        unknown = sorted(ops - set(OPERATORS))
        if unknown or not ops:
            raise E.UsageError(f"--operators {operators!r}: unknown {', '.join(unknown) or '(none given)'}; "
                               f"choose from {', '.join(OPERATORS)}")
    root = _paths.project_root()
    spec = load_spec(spec_path(specs_dir, method), root)
    seed_list = _parse_seeds(seeds) or [spec.data["budget"]["seeds"][0]]
    if len(seed_list) > spec.data["budget"]["max_seeds"]:
        raise E.BudgetError(f"{len(seed_list)} seeds requested but {spec.display} budget.max_seeds is "
                            f"{spec.data['budget']['max_seeds']}; ask for fewer seeds")
    ensure_writable(receipts_dir)
    from engine.cli.check import _signer

    signer = _signer(sign_key, sign_command)  # proven before any mutant runs: a bad key costs no run (exit 2)
    opts = Options(seeds=seed_list, device=device, jobs=jobs, timeout_s=timeout, max_mutants=max_mutants,
                   only_files=list(only_file or []), operators=ops)
    created = utc_now()
    total = {"n": 0, "done": 0}

    def on_start(n: int) -> None:
        total["n"] = n
        _err(f"{method}: judging {n} mutants with --jobs {jobs}")

    def on_done(m, r) -> None:
        total["done"] += 1
        if not json_out:
            _err(f"  [{total['done']}/{total['n']}] {r['status']:<8} {m.id}"
                 + (f" by {r['killed_by']}" if r.get("killed_by") else ""))

    _err(f"{method}: baseline (contracts under coverage, seeds {','.join(map(str, seed_list))}) ...")

    def on_term(signum, frame):  # noqa: ARG001
        raise KeyboardInterrupt  # as Ctrl-C: the workers are stopped, the command exits 130

    import signal

    old_term = signal.signal(signal.SIGTERM, on_term)
    try:
        outcome = run(spec, root, opts, on_start=on_start, on_done=on_done)
    finally:
        signal.signal(signal.SIGTERM, old_term)
    section = outcome["mutation"]
    if section["mutants"] == 0:
        raise E.NothingSelected(f"no mutant of {method}'s executed lines"
                                + (f" in {', '.join(opts.only_files)}" if opts.only_files else "")
                                + " with operators " + ", ".join(sorted(ops)))
    stmt = statement(spec, root, outcome, opts, created)
    path = write_receipt(receipts_dir, stmt, sign_key=signer)  # every mutant's process has ended
    shown = display_path(path, root)
    if json_out:
        _print_json({"method": spec.key, "receipt": shown, "receipt_id": stmt["predicate"]["receipt_id"],
                     **{k: section[k] for k in ("mutants", "killed", "survived", "timeout", "equivalent", "score",
                                                "threshold", "threshold_source", "passed", "complete", "survivors",
                                                "equivalents", "timeouts", "listed_but_killed", "listed_not_run",
                                                "files", "wall_s", "baseline_wall_s", "jobs", "seeds")},
                     "results": section["results"]})
    else:
        _print_report(section, spec.key, shown)
    raise typer.Exit(E.EXIT_OK if section["passed"] else E.EXIT_FAILED)
