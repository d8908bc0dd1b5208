"""Run `check` as cells, one per (method, seed), in local worker processes or as Ray tasks.

The serial runner does, per method, the baseline for every seed, then every
mutant on the first seed. A cell is one seed of that: its baseline, plus the
mutant phase when it is the first seed. Every check call reseeds torch from
its own seed, so a cell measures exactly what the same seed measures inside a
serial run; the cells of a method are merged back, in the serial run's order,
into the one receipt the serial run writes.

What a cell cannot report is still recorded: a cell that raises, a worker
that dies, or a cell past its deadline becomes an `error` result for each
(contract, seed, dtype) it owned (and an error on each mutant, for the first
seed), with the reason, so the receipt says what is missing and why, and the
run's verdict is `error`. Nothing waits forever: every wait has a deadline.

Importing this module does not import torch; running cells does.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import time
import traceback
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

from engine.errors import EnvironmentProblem, UsageError

EXECUTORS = ("local", "ray")
# A Ray task's clock starts at submission: it may wait for a free CPU and for a worker to import torch.
START_GRACE_S = 120.0
# After an interrupt, how long busy workers get to hand back what they finished.
INTERRUPT_GRACE_S = 10.0


@dataclass
class Cell:
    """One (method, seed) unit of work: `plan` is the method's plan restricted to that seed."""

    index: int
    method: str
    seed: int
    plan: Any  # engine.run.runner.Plan with seeds=[seed]; mutants only on the first seed
    device: str
    deadline_s: float
    threads: int | None = None  # torch threads for this cell (None: leave the worker's as they are)


@dataclass
class CellOutcome:
    """What came back from a cell: its runner's record (`data`), or why there is none (`failure`)."""

    cell: Cell
    data: dict | None = None
    failure: str | None = None
    interrupted: bool = False
    wall_s: float = 0.0
    worker: str = ""


@dataclass
class MethodRun:
    """Everything needed to merge one method's cells into one receipt."""

    plan: Any
    created_at: str
    started: float
    cells: list[Cell] = field(default_factory=list)
    outcomes: dict[int, CellOutcome] = field(default_factory=dict)


def split(plans: Iterable[Any], device: str, deadline_s: float | None = None) -> tuple[list[MethodRun], list[Cell]]:
    """Cut each plan into one cell per seed; the first seed keeps the mutant phase, as in a serial run."""
    from engine.store.receipts import utc_now

    runs, cells = [], []
    for plan in plans:
        mr = MethodRun(plan=plan, created_at=utc_now(), started=time.perf_counter())
        budget = plan.spec.data["budget"]
        # The runner stops itself between calls past max_wall_seconds, and a call past the per-contract
        # timeout; only a cell stuck where no signal reaches (native code) outlives both.
        limit = deadline_s if deadline_s is not None else \
            float(budget["max_wall_seconds"]) + float(budget.get("per_contract_timeout_seconds") or 60)
        light = dataclasses.replace(plan, spec=dataclasses.replace(plan.spec, doc=None))  # the YAML tree is not needed
        for i, seed in enumerate(plan.seeds):
            sub = dataclasses.replace(light, seeds=[seed], mutants=list(plan.mutants) if i == 0 else [])
            cell = Cell(index=len(cells), method=plan.spec.key, seed=seed, plan=sub, device=device, deadline_s=limit)
            mr.cells.append(cell)
            cells.append(cell)
        runs.append(mr)
    # The first-seed cells carry the mutants and run longest: start them first so the others fill in around them.
    cells.sort(key=lambda c: (c.plan.mutants == [], c.index))
    return runs, cells


# --- the worker side ------------------------------------------------------------------------


def run_cell(cell: Cell, on_result: Callable[[dict], None] | None = None) -> dict:
    """Run one cell with the real runner; return its record (plain data, picklable)."""
    from engine.paths import project_root
    from engine.run.binding import imported_files
    from engine.run.devices import resolve_device
    from engine.run.runner import Runner

    dev = resolve_device(cell.device)
    if cell.threads is not None:
        import torch

        torch.set_num_threads(cell.threads)
    cpu0 = time.process_time()
    runner = Runner(cell.plan, dev, on_result=on_result)
    runner.run()
    pred = runner.predicate()
    cpu_s = round(time.process_time() - cpu0, 3)
    return {
        "results": runner.results,
        "mutants": runner.mutant_results,
        "mechanism": runner.mechanism,
        "errors": runner.errors,
        "status": runner.status,
        "environment": pred["environment"],
        "cpu_s": cpu_s,
        # Every checkout file this worker imported, with the digest of the copy it ran: the driver binds the
        # union of these and its own, and refuses a cell whose files differ from its tree.
        "sources": _digests(project_root(), imported_files(project_root())),
    }


def _digests(root, names: Iterable[str]) -> dict[str, str | None]:
    from engine.store.receipts import sha256_file

    return {n: (sha256_file(root / n) if (root / n).is_file() else None) for n in names}


def _worker_main(conn, threads: int) -> None:
    """Local worker: take (cell, stream) messages until None; answer each with its record or its exception."""
    # The driver decides what an interrupt means: it forwards SIGINT to busy workers only.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    import torch

    torch.set_num_threads(threads)
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            return
        if msg is None:
            return
        cell, fn = msg
        conn.send(("started", cell.index, None))  # the deadline counts from here, not from the spawn and imports
        signal.signal(signal.SIGINT, signal.default_int_handler)

        def progress(r: dict, _i=cell.index) -> None:
            keys = ("phase", "contract", "seed", "dtype", "status", "mutant")
            conn.send(("progress", _i, {k: r.get(k) for k in keys}))

        try:
            out = fn(cell, progress)
            reply = ("done", cell.index, out)
        except BaseException as exc:  # noqa: BLE001 - anything a cell raises is that cell's error
            reply = ("raised", cell.index, _describe(exc))
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        try:
            conn.send(reply)
        except (OSError, ValueError) as exc:  # an unpicklable record is still that cell's error
            conn.send(("raised", cell.index, f"the cell's record could not be sent back: {exc}"))


def _describe(exc: BaseException) -> str:
    from engine.paths import project_root

    where = ""
    for fr in reversed(traceback.extract_tb(exc.__traceback__)):
        try:
            where = os.path.relpath(fr.filename, project_root())
        except ValueError:
            continue
        if not where.startswith(".."):
            where = f" (at {where}:{fr.lineno})"
            break
        where = ""
    return f"{type(exc).__name__}: {exc}{where}"


# --- local process pool ---------------------------------------------------------------------


class _Worker:
    def __init__(self, ctx, threads: int, name: str):
        self.conn, child = ctx.Pipe(duplex=True)
        self.proc = ctx.Process(target=_worker_main, args=(child, threads), name=name, daemon=True)
        self.proc.start()
        child.close()
        self.name = name
        self.cell: Cell | None = None
        self.started = 0.0

    def stop(self, kill: bool = False) -> None:
        try:
            if not kill:
                self.conn.send(None)
        except (OSError, ValueError):
            pass
        self.proc.join(timeout=0 if kill else 5)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join(timeout=5)
        self.conn.close()


def _exit_reason(proc) -> str:
    code = proc.exitcode
    if code is None:
        return "did not exit"
    from engine.run.isolation import exit_text

    return exit_text(code)


def _preload_modules() -> list[str]:
    """What the worker server imports before it forks: engine.run.worker_server, which imports the rest."""
    return ["engine.run.worker_server"]


def _worker_context():
    """Workers fork from a server that imported torch and the methods once but never ran a torch op:
    no import per worker, and no fork of a process whose OpenMP pool may be live."""
    import multiprocessing as mp

    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(_preload_modules())
    return ctx


def prestart_local_workers() -> None:
    """Start the worker server now, so its imports overlap with this process's own (call before importing torch)."""
    from multiprocessing import forkserver

    _worker_context()
    forkserver.ensure_running()


def worker_threads(jobs: int, threads: int | None = None) -> int:
    """torch threads per local worker: `threads` (or cpu_count // jobs), never more than cpu_count // jobs,
    so jobs x threads never oversubscribes the machine."""
    cap = max(1, (os.cpu_count() or 1) // max(1, jobs))
    return cap if threads is None else max(1, min(threads, cap))


def run_local(cells: list[Cell], outcomes: dict[int, CellOutcome], jobs: int, cell_fn: Callable = run_cell,
              on_progress: Callable[[Cell, dict], None] | None = None,
              on_cell: Callable[[CellOutcome], None] | None = None,
              should_stop: Callable[[], bool] | None = None, threads: int | None = None) -> dict[int, CellOutcome]:
    """Run cells in `jobs` spawned worker processes; every cell gets an outcome, whatever happens to its worker.

    `cell_fn` must be importable by name (it is sent to the workers by reference).
    Each worker gets `worker_threads(jobs, threads)` torch threads.
    """
    import multiprocessing as mp
    from multiprocessing.connection import wait

    if jobs < 1:
        raise UsageError(f"--jobs {jobs}: give 1 or more")
    ctx = _worker_context()
    threads = worker_threads(jobs, threads)
    pending = deque(cells)
    workers: list[_Worker] = []
    serial = 0
    on_progress = on_progress or (lambda c, r: None)
    on_cell = on_cell or (lambda o: None)
    should_stop = should_stop or (lambda: False)

    def new_worker() -> _Worker:
        nonlocal serial
        serial += 1
        return _Worker(ctx, threads, f"contracts-worker-{serial}")

    def finish(w: _Worker, data: dict | None = None, failure: str | None = None, interrupted: bool = False) -> None:
        cell = w.cell
        o = CellOutcome(cell=cell, data=data, failure=failure, interrupted=interrupted,
                        wall_s=round(time.perf_counter() - w.started, 6),
                        worker=w.name)
        outcomes[cell.index] = o
        w.cell = None
        on_cell(o)

    def replace(w: _Worker) -> None:
        w.stop(kill=True)
        workers[workers.index(w)] = new_worker()

    try:
        for _ in range(min(jobs, len(cells))):
            workers.append(new_worker())
        while pending or any(w.cell for w in workers):
            if should_stop():
                raise KeyboardInterrupt
            for w in workers:
                if w.cell is None and pending:
                    w.cell, w.started = pending.popleft(), time.perf_counter()
                    try:
                        w.conn.send((w.cell, cell_fn))
                    except (OSError, ValueError) as exc:
                        finish(w, failure=f"could not hand the cell to worker {w.name}: {exc}")
                        replace(w)
            busy = [w for w in workers if w.cell]
            if not busy:
                continue
            now = time.perf_counter()
            timeout = max(0.0, min(w.started + w.cell.deadline_s - now for w in busy))
            wait([w.conn for w in busy] + [w.proc.sentinel for w in busy], timeout=min(timeout, 1.0))
            for w in busy:
                _drain(w, finish, on_progress)
                if w.cell is None:
                    continue
                if not w.proc.is_alive():
                    _drain(w, finish, on_progress)  # it may have answered just before it exited
                    if w.cell is not None:
                        finish(w, failure=f"worker {w.name} {_exit_reason(w.proc)} while running this cell")
                    replace(w)
                elif time.perf_counter() - w.started > w.cell.deadline_s:
                    finish(w, failure=f"cell ran past its deadline of {w.cell.deadline_s:.0f} s and its worker was "
                                      "killed")
                    replace(w)
    except KeyboardInterrupt:
        _interrupt(workers, pending, finish, on_progress)
        raise
    finally:
        for w in workers:
            w.stop(kill=w.cell is not None)
    return outcomes


def _drain(w: _Worker, finish, on_progress) -> None:
    """Read every message a worker has sent; a final reply finishes its cell."""
    while w.cell is not None:
        try:
            if not w.conn.poll():
                return
            kind, _idx, payload = w.conn.recv()
        except (EOFError, OSError):
            return
        if kind == "started":
            w.started = time.perf_counter()
        elif kind == "progress":
            on_progress(w.cell, payload)
        elif kind == "done":
            finish(w, data=payload)
        else:
            finish(w, failure=f"the cell raised {payload}")


def _interrupt(workers: list[_Worker], pending: deque, finish, on_progress) -> None:
    """Ask busy workers to stop (SIGINT: their runner keeps what it finished), collect, then give up on them."""
    busy = [w for w in workers if w.cell]
    for w in busy:
        try:
            os.kill(w.proc.pid, signal.SIGINT)
        except OSError:
            pass
    end = time.perf_counter() + INTERRUPT_GRACE_S
    while any(w.cell for w in workers) and time.perf_counter() < end:
        for w in workers:
            _drain(w, finish, on_progress)
            if w.cell is not None and not w.proc.is_alive():
                finish(w, failure=f"interrupted: worker {w.name} {_exit_reason(w.proc)}", interrupted=True)
        time.sleep(0.05)
    for w in workers:
        if w.cell is not None:
            finish(w, failure="interrupted: the cell did not stop in time and its worker was killed",
                   interrupted=True)


# --- Ray --------------------------------------------------------------------------------------


def _ray_cell(cell: Cell) -> dict:
    """Ray task body: the same cell, with no progress stream (Ray reports per task)."""
    return run_cell(cell)


def run_ray(cells: list[Cell], outcomes: dict[int, CellOutcome], address: str | None = None,
            cell_fn: Callable = _ray_cell,
            on_cell: Callable[[CellOutcome], None] | None = None,
            should_stop: Callable[[], bool] | None = None) -> dict[int, CellOutcome]:
    """Run each cell as a Ray task (one CPU each, one GPU where the cell's device is CUDA).

    Reuses a Ray instance already initialised in this process; otherwise
    connects to `address` (shipping this checkout as the job's working_dir)
    or starts a local one. A task that raises, a worker that dies and a task
    past its deadline all become that cell's failure; tasks are never retried,
    so a cell is never measured twice.
    """
    try:
        import ray
    except ImportError:
        raise EnvironmentProblem("--executor ray needs Ray: pip install 'paper-contracts[ray]' (or pip install ray)") \
            from None
    from engine.paths import project_root

    on_cell = on_cell or (lambda o: None)
    should_stop = should_stop or (lambda: False)
    root = str(project_root())
    if not ray.is_initialized():
        try:
            if address:
                ray.init(address=address, runtime_env={"working_dir": root, "excludes": _SHIP_EXCLUDES},
                         log_to_driver=False)
            else:
                ray.init(include_dashboard=False, log_to_driver=False)
        except Exception as exc:  # noqa: BLE001 - a cluster that cannot be reached is the environment's problem
            raise EnvironmentProblem(f"could not start or reach Ray{' at ' + address if address else ''}: "
                                     f"{type(exc).__name__}: {exc}") from None
    # A local instance shares this file system: point its workers at this checkout, whatever their cwd.
    env = None if address else {"env_vars": {"PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH", "")])}}
    task = ray.remote(max_retries=0)(cell_fn)
    refs: dict[Any, tuple[Cell, float]] = {}
    for c in cells:
        gpu = 1 if c.device.startswith("cuda") else 0
        cell = dataclasses.replace(c, device="cuda" if gpu else c.device)  # Ray picks the GPU and shows only it
        opts = {"num_cpus": 1, "num_gpus": gpu, "name": f"{c.method}-seed{c.seed}"}
        if env:
            opts["runtime_env"] = env
        refs[task.options(**opts).remote(cell)] = (c, time.perf_counter())

    def finish(ref, data=None, failure=None, interrupted=False) -> None:
        c, t0 = refs.pop(ref)
        o = CellOutcome(cell=c, data=data, failure=failure, interrupted=interrupted,
                        wall_s=round(time.perf_counter() - t0, 6), worker="ray")
        outcomes[c.index] = o
        on_cell(o)

    try:
        while refs:
            if should_stop():
                raise KeyboardInterrupt
            # Tasks queue for resources, so a deadline counts from submission plus the start grace.
            done, _ = ray.wait(list(refs), num_returns=1, timeout=1.0)
            for ref in done:
                try:
                    finish(ref, data=ray.get(ref))
                except ray.exceptions.RayTaskError as exc:
                    cause = exc.cause if getattr(exc, "cause", None) is not None else exc
                    finish(ref, failure=f"the cell raised {type(cause).__name__}: {_first_line(cause)}")
                except ray.exceptions.RayError as exc:  # worker crashed, node died, task cancelled, ...
                    finish(ref, failure=f"the Ray worker running this cell failed: {type(exc).__name__}: "
                                        f"{_first_line(exc)}")
            now = time.perf_counter()
            for ref, (c, t0) in list(refs.items()):
                if now - t0 > c.deadline_s + START_GRACE_S:
                    ray.cancel(ref, force=True)
                    finish(ref, failure=f"cell ran past its deadline of {c.deadline_s:.0f} s; its Ray task was "
                                        "cancelled")
    except KeyboardInterrupt:
        for ref in list(refs):
            ray.cancel(ref, force=True)
            finish(ref, failure="interrupted: the Ray task was cancelled", interrupted=True)
        raise
    return outcomes


_SHIP_EXCLUDES = [".git", "receipts", ".venv", "**/__pycache__", ".pytest_cache", ".hypothesis", "*.egg-info"]


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[-1] if text else type(exc).__name__


# --- merging ----------------------------------------------------------------------------------


def merge(mr: MethodRun, executor: str, jobs: int | None = None, threads: int | None = None) -> dict:
    """The in-toto statement for one method, from its cells, ordered as a serial run orders it."""
    import torch

    from engine.paths import project_root
    from engine.run.runner import ERROR, FAILED, INTERRUPTED, build_statement

    plan = mr.plan
    runner = _merged_runner_class()(plan, torch.device(mr.cells[0].device if mr.cells else "cpu"))
    runner.t0 = mr.started
    c_order = {c["id"]: i for i, c in enumerate(plan.contracts)}
    d_order = {c["id"]: {d: j for j, d in enumerate(c["dtypes"])} for c in plan.contracts}
    s_order = {s: i for i, s in enumerate(plan.seeds)}

    def key(r: dict) -> tuple:
        return c_order[r["contract"]], s_order[r["seed"]], d_order[r["contract"]][r["dtype"]]

    from engine.run.binding import imported_files
    import importlib

    importlib.import_module("engine.store.redact")  # shapes the receipt; bound as in a serial run (build_statement)

    root = project_root()
    bound = set(imported_files(root))
    for o in mr.outcomes.values():
        if o.data is not None and isinstance(o.data.get("sources"), dict):
            bound.update(n for n in o.data["sources"] if isinstance(n, str))
    mine = _digests(root, sorted(bound))
    results, mechanism, mutants, errors, statuses, cells_info = [], [], None, [], set(), []
    for cell in mr.cells:
        o = mr.outcomes.get(cell.index) or CellOutcome(cell=cell, failure="no outcome was recorded for this cell")
        data, failure = o.data, o.failure
        theirs = (data.get("sources") or {}) if data is not None else {}
        differ = sorted(k for k in theirs if mine.get(k) != theirs[k]) if isinstance(theirs, dict) else ["?"]
        if data is not None and (differ or not theirs):
            differ = differ or ["(the worker reported no files)"]
            failure = ("the worker ran source files that differ from this checkout's: " + ", ".join(differ[:5])
                       + (" ..." if len(differ) > 5 else ""))
            data = None
        info = {"seed": cell.seed, "wall_s": o.wall_s, "worker": o.worker}
        if data is None:
            info["status"], info["error"] = ("interrupted" if o.interrupted else "lost"), failure
            errors.append(f"seed {cell.seed}: {failure}")
            if o.interrupted:  # as in a serial run: what never ran is not a result
                statuses.add(INTERRUPTED)
            else:
                statuses.add(ERROR)
                results += _lost_results(cell, failure)
                if cell.plan.mutants:
                    mutants = _lost_mutants(cell, failure)
        else:
            info["status"] = data["status"] or "finished"
            info["cpu_s"] = data.get("cpu_s")
            info["environment"] = data["environment"]
            results += data["results"]
            mechanism += data["mechanism"]
            if cell.plan.mutants:
                mutants = data["mutants"]
            errors += data["errors"] if len(mr.cells) == 1 else [f"seed {cell.seed}: {e}" for e in data["errors"]]
            if data["status"]:
                statuses.add(data["status"])
        cells_info.append(info)
    runner.results = sorted(results, key=key)
    runner.mechanism = sorted(mechanism, key=key)
    runner.mutant_results = mutants or []
    runner.errors = errors
    runner.status = INTERRUPTED if INTERRUPTED in statuses else FAILED if FAILED in statuses else None
    envs = [i["environment"] for i in cells_info if "environment" in i]
    runner.cell_environment = envs[0] if envs else None
    runner.execution = {"executor": executor, "jobs": jobs, "threads": threads, "cells": cells_info}
    runner.bound_files = sorted(mine)
    return build_statement(runner, mr.created_at)


_MERGED = None


def _merged_runner_class():
    """engine.run.runner.Runner with its predicate filled from cells (defined lazily: Runner imports torch)."""
    global _MERGED
    if _MERGED is None:
        from engine.run.runner import Runner

        class MergedRunner(Runner):
            cell_environment: dict | None = None
            execution: dict | None = None
            bound_files: list | None = None

            def predicate(self) -> dict:
                import torch

                # The driver may have no GPU (a Ray cluster's may): describe no device here, only what was asked.
                asked, self.device = self.device, torch.device("cpu")
                try:
                    pred = super().predicate()
                finally:
                    self.device = asked
                pred["request"]["device"] = str(asked)
                if self.cell_environment is not None:
                    # The workers measured, so the receipt names their environment (device, threads), not ours.
                    pred["environment"] = self.cell_environment
                elif asked.type != "cpu":
                    pred["environment"]["device"] = {"kind": asked.type, "index": asked.index,
                                                     "name": "unknown: no cell reported", "cuda": None,
                                                     "capability": None}
                pred["execution"] = self.execution
                return pred

        _MERGED = MergedRunner
    return _MERGED


def _lost_results(cell: Cell, reason: str) -> list[dict]:
    """One `error` result per (contract, dtype) the cell owned: the receipt shows the hole and its cause."""
    out = []
    for c in cell.plan.contracts:
        for dtype in c["dtypes"]:
            out.append({"contract": c["id"], "kind": c["kind"], "check": c["check"], "seed": cell.seed,
                        "dtype": dtype, "status": "error", "measurements": {}, "expectations": [],
                        "message": f"no measurement: {reason}", "cases_requested": c["cases"], "wall_s": 0.0,
                        "cost": {"optimizer_updates": 0, "sampled_tokens": 0}})
    return out


def _lost_mutants(cell: Cell, reason: str) -> list[dict]:
    return [{"id": m["id"], "mutant": m["mutant"], "description": m["description"],
             "expected_killers": list(m["killed_by"]), "killed_by": [], "killed": False, "seed": cell.seed,
             "results": [], "error": f"not run: {reason}"} for m in cell.plan.mutants]


def execute(plans: list[Any], device: str, executor: str = "local", jobs: int = 1, address: str | None = None,
            cell_fn: Callable | None = None, deadline_s: float | None = None,
            on_progress: Callable[[Cell, dict], None] | None = None,
            on_cell: Callable[[CellOutcome], None] | None = None,
            should_stop: Callable[[], bool] | None = None, threads: int | None = None) -> list[dict]:
    """Run plans as cells on the chosen executor; one merged statement per plan, in plan order.

    `threads`: torch threads per cell (local workers: at most cores / jobs; None: cores / jobs locally, the
    Ray worker's own on Ray); the receipts' execution record says what was used.

    On an interrupt the statements are still built (status `interrupted`, with
    what finished) and handed back on the KeyboardInterrupt as `.statements`.
    """
    if executor not in EXECUTORS:
        raise UsageError(f"--executor {executor!r}: use one of {', '.join(EXECUTORS)}")
    runs, cells = split(plans, device, deadline_s)
    used = worker_threads(jobs, threads) if executor == "local" else threads
    for c in cells:
        c.threads = used
    outcomes: dict[int, CellOutcome] = {}
    extra = {"cell_fn": cell_fn} if cell_fn else {}
    interrupted = None
    try:
        if executor == "ray":
            run_ray(cells, outcomes, address, on_cell=on_cell, should_stop=should_stop, **extra)
        else:
            run_local(cells, outcomes, jobs, on_progress=on_progress, on_cell=on_cell, should_stop=should_stop,
                      threads=threads, **extra)
    except KeyboardInterrupt as exc:
        interrupted = exc
        for c in cells:
            outcomes.setdefault(c.index, CellOutcome(cell=c, failure="interrupted: not run", interrupted=True))
    for mr in runs:
        for c in mr.cells:
            if c.index in outcomes:
                mr.outcomes[c.index] = outcomes[c.index]
    statements = [merge(mr, executor, jobs if executor == "local" else None, used) for mr in runs]
    if interrupted is not None:
        interrupted.statements = statements  # type: ignore[attr-defined]
        raise interrupted
    return statements
