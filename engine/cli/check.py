"""`contracts check`: run a method's contracts and mutants on a device; write one receipt per method."""

from __future__ import annotations

import functools
import signal
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
)
from engine.cli.common import (
    JsonOpt,
    LoraRankOpt,
    PolicyOpt,
    ReceiptsOpt,
    SpecsOpt,
    _dirs,
    _err,
    _print_json,
    app,
    handles_errors,
)
from engine.paths import spec_path
from engine.spec.loader import display_path, spec_files


def _parse_seeds(text: Optional[str]) -> Optional[list[int]]:
    if text is None:
        return None
    try:
        seeds = [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise E.UsageError(f"--seeds {text!r} is not a comma-separated list of integers, e.g. 42,43,44") from None
    if not seeds or any(s < 0 for s in seeds):
        raise E.UsageError(f"--seeds {text!r}: give one or more non-negative integers")
    return seeds


class _StopFlag:
    """SIGTERM (and SIGINT) set a flag the runner checks between check calls, and interrupt the check running.

    While `hold` is set (the receipt is being built and written) a signal only
    sets the flag: the receipt is written whole, then the command exits 130.
    """

    def __init__(self) -> None:
        self.stopped = False
        self.hold = False
        self._old: dict = {}

    def __enter__(self) -> "_StopFlag":
        def handler(signum, frame):  # noqa: ARG001
            self.stopped = True
            if not self.hold:
                raise KeyboardInterrupt

        for sig in (signal.SIGTERM, signal.SIGINT):
            try:
                self._old[sig] = signal.signal(sig, handler)
            except ValueError:  # not the main thread
                pass
        return self

    def __exit__(self, *exc: Any) -> None:
        for sig, old in self._old.items():
            signal.signal(sig, old)


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
    device: Annotated[str, typer.Option(help="cpu, cuda or cuda:N. Never falls back.")] = "cpu",
    seeds: Annotated[Optional[str], typer.Option(help="Comma-separated seeds (default: the spec budget's).")] = None,
    only: Annotated[Optional[list[str]], typer.Option("--only", help="Run only this contract id (repeatable).")] = None,
    no_mutants: Annotated[bool, typer.Option("--no-mutants", help="Skip the mutant phase (the run cannot pass).")] = False,
    policy: PolicyOpt = None,
    lora_rank: LoraRankOpt = None,
    specs: SpecsOpt = None,
    receipts: ReceiptsOpt = None,
    json_out: JsonOpt = False,
    jobs: Annotated[int, typer.Option("--jobs", "-j", help="Run (method, seed) cells in N local processes.")] = 1,
    executor: Annotated[str, typer.Option(help="local (processes on this machine) or ray (tasks on a Ray "
                                                "cluster; needs the [ray] extra).")] = "local",
    address: Annotated[Optional[str], typer.Option(help="Ray cluster address for --executor ray (default: "
                                                        "start a local Ray instance).")] = None,
    threads: Annotated[Optional[int], typer.Option("--threads", help="torch threads per process (default: 1 on "
                                                                      "cpu, torch's own on cuda; with --jobs N at "
                                                                      "most cores / N).")] = None,
    sign_key: Annotated[Optional[Path], typer.Option(
        "--sign-key", help="Sign each receipt (DSSE, ed25519) with this private key (default: "
                           "$CONTRACTS_SIGNING_KEY). Only a separate signing process reads it, after the checks.")] = None,
    sign_command: Annotated[Optional[str], typer.Option(
        "--sign-command", help="Sign each receipt with this command instead (default: $CONTRACTS_SIGN_COMMAND): it "
                               "reads the receipt on stdin and prints its DSSE envelope, e.g. the signing module "
                               "run as another user who alone can read the key (docs/trust.md).")] = None,
) -> None:
    """Run a method's contracts and mutants on a device; write one receipt per method."""
    global _CHECK_RAN
    _CHECK_RAN = True
    from engine.run.devices import default_threads, parse_device
    from engine.spec.loader import load_spec
    from engine.store.receipts import ensure_writable

    specs_dir, receipts_dir = _dirs(specs, receipts)
    parse_device(device)
    seed_list = _parse_seeds(seeds)
    _check_policy_options(policy, lora_rank)
    if all_ and method:
        raise E.UsageError("give a method or --all, not both")
    if not all_ and not method:
        raise E.UsageError("name a method (e.g. contracts check tapo-trajectory) or pass --all")
    if only and all_:
        raise E.UsageError("--only selects contracts of one method; name the method instead of --all")
    if threads is not None and threads < 1:
        raise E.UsageError(f"--threads {threads}: give 1 or more")
    sign_key = _signer(sign_key, sign_command)
    if all_:
        paths = spec_files(specs_dir)
        if not paths:
            raise E.NothingSelected(f"no specs in {display_path(specs_dir)}/")
    else:
        paths = [spec_path(specs_dir, method)]
    if jobs > 1 and executor == "local" and not address and policy is None:
        from engine.run.executors import prestart_local_workers

        # First: the workers' server imports torch and the methods (about 2 s) while this process reads the
        # specs and imports its own; the workers' imports are the --jobs run's serial part.
        prestart_local_workers()
    loaded = [load_spec(p, _paths.project_root()) for p in paths]
    from engine.run.imports import gc_paused

    with gc_paused():
        from engine.run.runner import plan_run  # imports torch from here on

    plans = [plan_run(s, seed_list, only, mutants=not no_mutants) for s in loaded]
    threads = default_threads(device, threads)
    if jobs != 1 or executor != "local" or address:
        _check_cells(plans, device, executor, jobs, address, receipts_dir, json_out, policy, threads,
                     sign_key)  # exits
    import torch

    from engine.run.devices import resolve_device

    dev = resolve_device(device)
    ensure_writable(receipts_dir)
    provider = _load_policy(policy, lora_rank)
    outcomes = []
    stop = _STOP
    before = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        for plan in plans:
            outcomes.append(_run_one(plan, dev, receipts_dir, stop, json_out, provider, sign_key))
            if outcomes[-1]["status"] == "interrupted" or stop.stopped:
                break
    finally:
        torch.set_num_threads(before)  # `check` called in-process (tests, the pytest plugin) leaves torch as it was
    if json_out:
        _print_json({"runs": outcomes})
    statuses = {o["status"] for o in outcomes}
    code = (E.EXIT_INTERRUPTED if "interrupted" in statuses or stop.stopped else E.EXIT_INTERNAL if "error" in statuses
            else E.EXIT_FAILED if "failed" in statuses else E.EXIT_OK)
    raise typer.Exit(code)


def _signer(key: Optional[Path], command: Optional[str]):
    """--sign-key / --sign-command (or their environment variables), proven to work before any check runs
    (engine.store.signing.usable_signer: this process never opens the key file)."""
    from engine.store.signing import KeyProblem, usable_signer

    try:
        return usable_signer(key, command)
    except KeyProblem as err:
        raise E.UsageError(f"signing: {err}") from None


def _run_one(plan, dev, receipts_dir: Path, stop: _StopFlag, json_out: bool, provider=None,
             sign_key=None) -> dict:
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
    )

    from engine.run.runner import Runner, build_statement
    from engine.store.receipts import utc_now, write_receipt

    total = sum(len(plan.seeds) * len(c["dtypes"]) for c in plan.contracts)
    by_id = {c["id"]: c for c in plan.contracts}
    total += sum(len(by_id[cid]["dtypes"]) for m in plan.mutants for cid in m["killed_by"])
    created = utc_now()
    from rich.console import Console

    progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                        console=Console(stderr=True), transient=True)
    with progress:
        task = progress.add_task(f"{plan.spec.key}", total=total)

        def on_result(r: dict) -> None:
            label = f"mutant {r['mutant']} / {r['contract']}" if r["phase"] == "mutant" else \
                f"{r['contract']} seed {r['seed']} {r['dtype']}"
            progress.update(task, advance=1, description=f"{plan.spec.key}: {label} {r['status']}")

        runner = Runner(plan, dev, on_result=on_result, should_stop=lambda: stop.stopped, policy=provider)
        try:
            runner.run()
        finally:
            stop.hold = True  # from here a signal is only noted: the receipt is written whole, or not at all
    try:
        stmt = build_statement(runner, created)
        path = write_receipt(receipts_dir, stmt, sign_key=sign_key)  # every check has finished by now
    finally:
        stop.hold = False
    pred = stmt["predicate"]
    shown = display_path(path, _paths.project_root())
    if not json_out:
        _print_summary(pred, shown)
    _note_policy(pred)
    return {"method": pred["method"], "status": pred["status"], "receipt": shown, "receipt_id": pred["receipt_id"],
            "policy": _policy_summary(pred),
            "summary": pred["summary"], "cost": pred["cost"], "unproven_contracts": pred["unproven_contracts"],
            "results": [{k: r[k] for k in ("contract", "seed", "dtype", "status", "measurements", "message")}
                        for r in pred["results"]],
            "mutants": [{k: m[k] for k in ("id", "killed", "killed_by")} for m in pred["mutants"]]}


def _check_policy_options(policy: Optional[str], lora_rank: Optional[int]) -> None:
    """Refuse a bad --policy/--lora-rank before anything is imported or run."""
    from engine.run.policy import check_policy

    if policy is None:
        if lora_rank is not None:
            raise E.UsageError("--lora-rank applies to --policy hf:PATH; give the checkpoint too")
        return
    if lora_rank is not None and lora_rank < 0:
        raise E.UsageError(f"--lora-rank {lora_rank}: give 0 (train every weight) or a positive rank, e.g. 8")
    check_policy(policy)


def _load_policy(policy: Optional[str], lora_rank: Optional[int]):
    if policy is None:
        return None
    from engine.run.policy import load_policy

    _err(f"loading {policy} ...")
    return load_policy(policy, lora_rank)
