"""One `contracts check` session: plan the specs, run them (here or in cells), build and write the receipts.

The CLI (engine/cli/check.py, engine/cli/check_report.py) parses arguments,
shows progress and prints; what runs and what each receipt says is decided
here, in code the receipt binds. Nothing here imports a front door
(engine.run.binding.FRONT_DOORS), so editing the CLI leaves receipts fresh.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Optional, Protocol

from engine import errors as E


class Stop(Protocol):
    """What the runner reads between check calls (`stopped`) and sets while a receipt is written (`hold`)."""

    stopped: bool
    hold: bool


def load_plans(paths: list[Path], root: Path, seeds: Optional[list[int]], only: Optional[list[str]],
               mutants: bool, fresh: int | bool = False, tiers: Optional[list[str]] = None) -> list:
    """Load every spec and plan its run; torch is imported from here on. `fresh`: each spec's seeds drawn from the
    operating system (engine/run/seeds.py); `tiers`: only contracts of these tiers."""
    from engine.run import sourceonly
    from engine.run.imports import gc_paused
    from engine.spec.loader import load_spec

    sourceonly.install()  # before the runner and the methods are imported: they run from source
    loaded = [load_spec(p, root) for p in paths]
    with gc_paused():
        from engine.run.runner import plan_run

    return [plan_run(s, seeds, only, mutants=mutants, fresh=fresh, tiers=tiers) for s in loaded]


def calls_in(plan) -> int:
    """How many check calls a plan makes (baseline for every seed and dtype, mutants on the first seed)."""
    total = sum(len(plan.seeds) * len(c["dtypes"]) for c in plan.contracts)
    by_id = {c["id"]: c for c in plan.contracts}
    return total + sum(len(by_id[cid]["dtypes"]) for m in plan.mutants for cid in m["killed_by"])


def write(runner, created: str, receipts_dir: Path, sign_key=None) -> tuple[dict, Path]:
    """Build a finished (or interrupted) run's statement and write its receipt; every front door writes through
    here (`contracts check`, the pytest plugin), so both bind the same modules."""
    from engine.run.runner import build_statement
    from engine.store.receipts import write_receipt

    stmt = build_statement(runner, created)
    return stmt, write_receipt(receipts_dir, stmt, sign_key=sign_key)  # every check has finished by now


def run_one(plan, dev, receipts_dir: Path, stop: Stop, provider: Any = None,
            on_result: Callable[[dict], None] | None = None, sign_key=None) -> tuple[dict, Path]:
    """Run one plan in this process and write its receipt whole (a signal meanwhile is only noted)."""
    from engine.run.runner import Runner
    from engine.store.receipts import utc_now

    created = utc_now()
    runner = Runner(plan, dev, on_result=on_result, should_stop=lambda: stop.stopped, policy=provider)
    try:
        runner.run()
    finally:
        stop.hold = True  # from here a signal is only noted: the receipt is written whole, or not at all
    try:
        return write(runner, created, receipts_dir, sign_key)
    finally:
        stop.hold = False


def run_serial(plans: list, device: str, receipts_dir: Path, stop: Stop,
               load_provider: Callable[[], Any] = lambda: None, threads: Optional[int] = None,
               on_result: Callable[[Any], Callable[[dict], None] | None] = lambda plan: None,
               on_receipt: Callable[[dict, Path], None] = lambda stmt, path: None, sign_key=None) -> list[dict]:
    """Run plans one after the other in this process; `on_result(plan)` gives each run's progress callback,
    `load_provider()` the `--policy` stand-in (called once the device and the store are known to work).
    Returns each written statement (stops after an interrupted one)."""
    import torch

    from engine.run.devices import resolve_device
    from engine.store.receipts import ensure_writable

    dev = resolve_device(device)
    ensure_writable(receipts_dir)
    provider = load_provider()
    before = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    out = []
    try:
        for plan in plans:
            stmt, path = run_one(plan, dev, receipts_dir, stop, provider, on_result(plan), sign_key)
            out.append(stmt)
            on_receipt(stmt, path)
            if stmt["predicate"]["status"] == "interrupted" or stop.stopped:
                break
    finally:
        torch.set_num_threads(before)  # `check` called in-process (tests, the pytest plugin) leaves torch as it was
    return out


def check_cells_options(executor: str, jobs: int, address: Optional[str], policy: Optional[str]) -> None:
    """Refuse, before anything runs, a cells request that cannot be honoured."""
    from engine.run.executors import EXECUTORS

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


def run_cells(plans: list, device: str, executor: str, jobs: int, address: Optional[str], receipts_dir: Path,
              threads: Optional[int] = None, stop: Stop | None = None,
              on_progress: Callable | None = None, on_cell: Callable | None = None,
              sign_key=None) -> list[tuple[dict, Path]]:
    """Run every (method, seed) cell on the executor; write one merged receipt per method.

    On an interrupt the receipts of what finished are still written."""
    from engine.run.executors import execute
    from engine.store.receipts import ensure_writable, write_receipt

    if executor == "local":
        from engine.run.devices import resolve_device

        resolve_device(device)  # exit 4 here, before any worker starts; Ray workers resolve it on their node
    ensure_writable(receipts_dir)
    try:
        statements = execute(plans, device, executor=executor, jobs=jobs, address=address, threads=threads,
                             on_progress=on_progress, on_cell=on_cell,
                             should_stop=(lambda: stop.stopped) if stop is not None else None)
    except KeyboardInterrupt as exc:
        statements = getattr(exc, "statements", [])
    return [(stmt, write_receipt(receipts_dir, stmt, sign_key=sign_key)) for stmt in statements]  # after every cell
