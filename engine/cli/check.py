"""`contracts check`: run a method's contracts and mutants on a device; write one receipt per method."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Annotated, Any, Callable, Optional

import typer

from engine import errors as E
from engine import paths as _paths
from engine.cli.check_report import (
    _check_cells,
    _note_policy,
    _policy_summary,
    _print_summary,
    check_document,
    print_all_summary,
    result_summary,
    run_coverage,
)
from engine.cli.common import (
    JsonOpt,
    LoraRankOpt,
    PolicyOpt,
    ReceiptsOpt,
    SpecsOpt,
    _dirs,
    _err,
    _flags,
    _print_json,
    app,
    handles_errors,
)
from engine.cli.stopflag import _StopFlag
from engine.paths import spec_path
from engine.spec.loader import SpecError, display_path, spec_files


def _parse_seeds(text: Optional[str]) -> Optional[list[int]]:
    """A list of seeds (`mutate`, `evolve-evaluator`): `fresh` is `check`'s alone."""
    from engine.run.seeds import parse

    req = parse(text)
    if req.fresh:
        raise E.UsageError(f"--seeds {text!r}: give a comma-separated list of seeds here, e.g. 42,43,44")
    return None if req.seeds is None else list(req.seeds)


def _parse_tiers(values: Optional[list[str]]) -> Optional[list[str]]:
    from engine.tiers import parse_tiers

    try:
        return parse_tiers(values)
    except ValueError as err:
        raise E.UsageError(str(err)) from None


_STOP: Optional[_StopFlag] = None
_CHECK_RAN = False  # main() may skip interpreter teardown after `check` (see main)


def stops_on_signals(fn: Callable[..., Any]) -> Callable[..., Any]:
    """SIGTERM/SIGINT mean "stop, keep what is done, exit 130" from the command's first line (torch import
    included), not only once the runner starts; the flag is `_STOP` while the command runs."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        global _STOP
        with _StopFlag() as stop:
            _STOP = stop
            try:
                return fn(*args, **kwargs)
            finally:
                _STOP = None

    return wrapper


@app.command()
@handles_errors
@stops_on_signals
def check(
    method: Annotated[Optional[str], typer.Argument(help="Method key (or use --all).")] = None,
    all_: Annotated[bool, typer.Option("--all", help="Check every spec.")] = False,
    device: Annotated[str, typer.Option(metavar="DEVICE", help="cpu, cuda or cuda:N. Never falls back.")] = "cpu",
    seeds: Annotated[Optional[str], typer.Option(metavar="S,S,...|fresh", help="Comma-separated seeds (default: the spec budget's), or "
                                                                        "fresh (alias random; fresh:N for N of them): as many seeds as "
                                                                        "the budget lists, drawn from the operating system at run time "
                                                                        "and recorded in the receipt, so --seeds with them reruns it.")] = None,
    tier: Annotated[Optional[list[str]], typer.Option("--tier", metavar="TIER", help="Run only the contracts of this tier "
                                                                         "(math, budget, scale; repeatable or comma-separated; "
                                                                         "default all): a quick local run; the receipt is partial "
                                                                         "and the gate needs every tier.")] = None,
    only: Annotated[Optional[list[str]], typer.Option("--only", metavar="CONTRACT", help="Run only this contract id (repeatable).")] = None,
    case: Annotated[Optional[int], typer.Option("--case", metavar="N", min=0, help="Run only case N of each selected contract measured by a kind (the failing case a report names).")] = None,
    no_mutants: Annotated[bool, typer.Option("--no-mutants", help="Skip the mutant phase: the receipt is partial "
                                                                  "and shows no contract able to fail, which the "
                                                                  "gate needs.")] = False,
    policy: PolicyOpt = None,
    lora_rank: LoraRankOpt = None,
    specs: SpecsOpt = None,
    receipts: ReceiptsOpt = None,
    json_out: JsonOpt = False,
    jobs: Annotated[int, typer.Option("--jobs", "-j", metavar="N", help="Run (method, seed) cells in N local processes.")] = 1,
    executor: Annotated[str, typer.Option(metavar="local|ray", help="local (processes on this machine) or ray (tasks on a "
                                                "Ray cluster; needs the [ray] extra).")] = "local",
    address: Annotated[Optional[str], typer.Option(metavar="HOST:PORT", help="Ray cluster address for --executor ray (default: "
                                                        "start a local Ray instance).")] = None,
    threads: Annotated[Optional[int], typer.Option("--threads", metavar="N", help="torch threads per process (default: 1 on "
                                                                      "cpu, torch's own on cuda; with --jobs N at "
                                                                      "most cores / N).")] = None,
    # [impl] options: check a candidate implementation in isolated workers (engine/cli/check_impl.py)
    impl: Annotated[Optional[str], typer.Option("--impl", metavar="TARGET", help="Check this implementation instead of the registered "
                                                                "one: path/to/file.py, package.module, "
                                                                "module:attribute (see contracts interface METHOD), "
                                                                "or verl:NAME for a verl policy loss.")]
    = None,
    impl_timeout: Annotated[Optional[float], typer.Option("--impl-timeout", metavar="SECONDS", help="Seconds one check call of an --impl "
                                                                                 "candidate may take before its worker "
                                                                                 "is killed (default: the spec's "
                                                                                 "per_contract_timeout_seconds).")]
    = None,
    impl_memory_mb: Annotated[Optional[int], typer.Option("--impl-memory-mb", metavar="MIB", help="Address space an --impl worker "
                                                                                  "may add after its imports, in MiB "
                                                                                  "(cpu only; 0: no limit; default "
                                                                                  "4096).")] = None,
    no_sandbox: Annotated[bool, typer.Option("--no-sandbox", help="Run an --impl candidate without the bubblewrap "
                                                                  "sandbox (where bwrap is not installed); its "
                                                                  "receipt records sandbox: none.")] = False,
    sign_key: Annotated[Optional[Path], typer.Option(
        "--sign-key", metavar="FILE", help="Sign each receipt (DSSE, ed25519) with this private key (default: "
                           "$CONTRACTS_SIGNING_KEY). Only a separate signing process reads it, after the checks.")] = None,
    sign_command: Annotated[Optional[str], typer.Option(
        "--sign-command", metavar="COMMAND", help="Sign each receipt with this command instead (default: $CONTRACTS_SIGN_COMMAND): it "
                               "reads the receipt on stdin and prints its DSSE envelope, e.g. the signing module "
                               "run as another user who alone can read the key (docs/trust.md).")] = None,
) -> None:
    """Run a method's contracts and mutants on a device; write one receipt per method."""
    global _CHECK_RAN
    _CHECK_RAN = True
    from engine.run.devices import default_threads, parse_device

    specs_dir, receipts_dir = _dirs(specs, receipts)
    parse_device(device)
    from engine.run.seeds import parse as parse_seed_request

    seed_request = parse_seed_request(seeds)
    seed_list = None if seed_request.seeds is None else list(seed_request.seeds)
    tiers = _parse_tiers(tier)
    _check_policy_options(policy, lora_rank)
    if all_ and method:
        raise E.UsageError("give a method or --all, not both")
    if not all_ and not method:
        raise E.UsageError("name a method (e.g. contracts check tapo-trajectory) or pass --all")
    if only and all_:
        raise E.UsageError("--only selects contracts of one method; name the method instead of --all")
    if threads is not None and threads < 1:
        raise E.UsageError(f"--threads {threads}: give 1 or more")
    from engine.run.isolation import check_options  # [impl] hook

    check_options(impl, all_, jobs, executor, address, policy, no_sandbox)
    sign_key = _signer(sign_key, sign_command)
    if all_:
        paths = spec_files(specs_dir)
        if not paths:
            raise E.NothingSelected(f"no specs in {display_path(specs_dir)}/")
        from engine.spec.depends import ordered

        paths = ordered(paths, _paths.project_root())  # dependencies first (the control before its dependents)
    else:
        paths = [spec_path(specs_dir, method)]
    if jobs > 1 and executor == "local" and not address and policy is None:
        from engine.run.executors import prestart_local_workers

        # First: the workers' server imports torch and the methods (about 2 s) while this process reads the
        # specs and imports its own; the workers' imports are the --jobs run's serial part.
        prestart_local_workers()
    from engine.run import session

    try:
        plans = session.load_plans(paths, _paths.project_root(), seed_list, only, mutants=not no_mutants,
                                   fresh=(seed_request.count or True) if seed_request.fresh else False, tiers=tiers)
        for plan in plans:
            plan.case = case
    except SpecError:
        _every_spec_error(paths)  # load_plans stops at the first; a user fixes them all in one go
        raise
    if tiers is not None and not any(p.contracts for p in plans):
        raise E.NothingSelected(f"no contract of tier {', '.join(tiers)} in "
                                + ", ".join(p.spec.display for p in plans))
    for plan in plans:  # before anything runs: what a quick run leaves out, and the seeds nobody knew
        _announce(plan, tiers, json_out)
    threads = default_threads(device, threads)
    if impl is not None:  # [impl] hook: a candidate implementation, in isolated workers; exits
        from engine.cli.check_impl import run_impl_check

        run_impl_check(plans[0], impl, device, threads, receipts_dir, _STOP, json_out, impl_timeout, impl_memory_mb,
                       flags=_flags(specs, receipts) + (" --no-sandbox" if no_sandbox else ""), sign_key=sign_key,
                       no_sandbox=no_sandbox, load_provider=lambda: _load_policy(policy, lora_rank))
    if jobs != 1 or executor != "local" or address:
        _check_cells(plans, device, executor, jobs, address, receipts_dir, json_out, policy, threads,
                     flags=_flags(specs, receipts), all_summary=all_, sign_key=sign_key)  # exits
    stop = _STOP
    outcomes: list[dict] = []
    bars = _Progress()

    by_key = {p.spec.key: p.spec for p in plans}

    def report(stmt: dict, path: Path) -> None:
        bars.close()
        outcomes.append(_outcome(stmt, path, json_out, by_key.get(stmt["predicate"]["method"]),
                                 _flags(specs, receipts)))

    try:
        session.run_serial(plans, device, receipts_dir, stop, load_provider=lambda: _load_policy(policy, lora_rank),
                           threads=threads, on_result=functools.partial(_progress_for, progress=bars),
                           on_receipt=report, sign_key=sign_key)
    finally:
        bars.close()
    if json_out:
        _print_json(check_document(outcomes))
    elif all_:
        print_all_summary(outcomes, len(plans))
    statuses = {o["status"] for o in outcomes}
    code = (E.EXIT_INTERRUPTED if "interrupted" in statuses or stop.stopped else E.EXIT_INTERNAL if "error" in statuses
            else E.EXIT_FAILED if "failed" in statuses else E.EXIT_OK)
    raise typer.Exit(code)


def _announce(plan, tiers: Optional[list[str]], json_out: bool) -> None:
    """On stderr: the tiers a --tier run leaves out, and the seeds `--seeds fresh` drew (the receipt records them)."""
    from engine.tiers import TIERS, tier_of

    if tiers is not None:
        left = [t for t in TIERS if t not in tiers]
        n = sum(1 for c in plan.spec.data["contracts"] if tier_of(c) in left)
        if n:
            _err(f"{plan.spec.key}: --tier {','.join(tiers)}: {n} contract(s) of tier {', '.join(left)} not run; "
                 "the receipt is partial and the gate needs every tier")
    if plan.seed_source == "fresh" and not json_out:
        _err(f"{plan.spec.key}: fresh seeds {','.join(map(str, plan.seeds))} (drawn now; rerun with --seeds "
             f"{','.join(map(str, plan.seeds))})")


def _every_spec_error(paths: list[Path]) -> None:
    """Every problem of every spec asked for, one `error:` line each, then exit 2; returns if none is found."""
    from engine.spec.loader import validate_file

    errors = [e for p in paths for e in validate_file(p, _paths.project_root())[1]]
    if not errors:
        return
    for e in errors:
        _err(f"error: {e.line()}")
    if len(errors) > 1:
        _err(f"{len(errors)} spec errors; nothing was run")
    raise typer.Exit(E.EXIT_USAGE)


def _signer(key: Optional[Path], command: Optional[str]):
    """--sign-key / --sign-command (or their environment variables), proven to work before any check runs
    (engine.store.signing.usable_signer: this process never opens the key file)."""
    from engine.store.signing import KeyProblem, usable_signer

    try:
        return usable_signer(key, command)
    except KeyProblem as err:
        raise E.UsageError(f"signing: {err}") from None


class _Progress:
    """One transient progress bar per method on stderr, closed when the next method starts or the run ends."""

    def __init__(self) -> None:
        self.current = None

    def close(self) -> None:
        if self.current is not None:
            self.current.stop()
            self.current = None

    def start(self, plan):
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        from engine.run.session import calls_in

        self.close()
        self.current = Progress(TextColumn("{task.description}", markup=False), BarColumn(), MofNCompleteColumn(),
                                TimeElapsedColumn(), console=Console(stderr=True), transient=True)
        self.current.start()
        return self.current, self.current.add_task(f"{plan.spec.key}", total=calls_in(plan))


def _progress_for(plan, progress: _Progress) -> Callable[[dict], None]:
    bar, task = progress.start(plan)

    def on_result(r: dict) -> None:
        label = f"mutant {r['mutant']} / {r['contract']}" if r["phase"] == "mutant" else \
            f"{r['contract']} seed {r['seed']} {r['dtype']}"
        bar.update(task, advance=1, description=f"{plan.spec.key}: {label} {r['status']}")

    return on_result


def _outcome(stmt: dict, path: Path, json_out: bool, spec=None, flags: str = "") -> dict:
    """Print one written receipt's summary; the --json record of it."""
    pred = stmt["predicate"]
    shown = display_path(path, _paths.project_root())
    if not json_out:
        _print_summary(pred, shown, spec, flags)
    _note_policy(pred)
    return {"method": pred["method"], "status": pred["status"], "coverage": run_coverage(pred, spec),
            "receipt": shown, "receipt_id": pred["receipt_id"], "policy": _policy_summary(pred),
            "summary": pred["summary"], "cost": pred["cost"], "unproven_contracts": pred["unproven_contracts"],
            "results": [result_summary(r) for r in pred["results"]],
            "mutants": [{k: m[k] for k in ("id", "killed", "killed_by")} for m in pred["mutants"]]}


def _check_policy_options(policy: Optional[str], lora_rank: Optional[int]) -> None:
    """Refuse a bad --policy/--lora-rank before anything is imported or run."""
    if policy is None:
        if lora_rank is not None:
            raise E.UsageError("--lora-rank applies to --policy hf:PATH; give the checkpoint too")
        return
    if lora_rank is not None and lora_rank < 0:
        raise E.UsageError(f"--lora-rank {lora_rank}: give 0 (train every weight) or a positive rank, e.g. 8")
    from engine.run.policy import check_policy  # only now: a run without --policy neither imports nor binds it

    check_policy(policy)


def _load_policy(policy: Optional[str], lora_rank: Optional[int]):
    if policy is None:
        return None
    from engine.run.policy import load_policy

    _err(f"loading {policy} ...")
    return load_policy(policy, lora_rank)
