"""Run a method's contracts against the unmutated code (under coverage) and against each mutant, in workers.

Every run happens in a worker process forked from a server that has imported
torch and the runner but no method (multiprocessing's forkserver), so each
worker imports the method packages afresh. A mutant's worker first puts an
import hook (a meta-path finder) in front of the import system that serves the
mutated text of that one module from memory: nothing is written to the
checkout, which other processes may be reading.

Judgments are `engine.run.runner.Runner.call`'s, the ones `contracts check`
makes: the same contracts, expectations, per-contract limits and seeds. A
mutant's run stops at its first contract result that is not `passed`.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import multiprocessing
import os
import signal
import sys
import time
import traceback
from collections import deque
from dataclasses import dataclass, field
from multiprocessing.connection import wait
from pathlib import Path
from typing import Any, Callable

# What the server imports once before forking workers (never a method package: the hook must see it first). The
# last, engine.run.mutate.server, clears what the others imported with the source-only finder: each worker's runner
# then checks only what it imports itself, not torch's thousands of modules again.
PRELOAD = ["torch", "torch._dynamo", "engine.run.runner", "engine.run.mutate.execute", "engine.run.mutate.server"]
KILLED, SURVIVED, TIMEOUT = "killed", "survived", "timeout"

_CONTEXT: Any = None


def _context():
    global _CONTEXT
    if _CONTEXT is None:
        _CONTEXT = multiprocessing.get_context("forkserver")
        _CONTEXT.set_forkserver_preload(PRELOAD)
    return _CONTEXT


@dataclass
class Job:
    """What a worker needs: plain data only (it crosses a process boundary)."""

    spec_path: str
    root: str
    seeds: list[int]
    # The spec as the parent validated it, and the sha256 of the bytes it was read from: a worker whose read of
    # spec_path has that digest uses this data instead of validating the same bytes again (once per mutant).
    spec_data: dict | None = None
    spec_sha256: str = ""
    device: str = "cpu"
    threads: int = 1
    order: list[str] = field(default_factory=list)  # contract ids, in the order to run them
    sys_path: list[str] = field(default_factory=list)  # extra import roots (e.g. a method outside methods/)
    imports: list[str] = field(default_factory=list)  # modules to import after methods/ (they register more)
    coverage_include: list[str] = field(default_factory=list)  # baseline only: where to record executed lines
    module: str | None = None  # the mutated module, its file and its text (None: the baseline)
    path: str | None = None
    source: str | None = None
    limit_s: float = 3600.0  # the worker ends itself after this, whatever the parent does


class MutantSource(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Serves `source` as the module `name` (file name `path`, for tracebacks); every other import is untouched."""

    def __init__(self, name: str, path: str, source: str):
        self.name, self.path, self.source = name, path, source

    def find_spec(self, fullname, path=None, target=None):  # noqa: ARG002
        if fullname != self.name:
            return None
        spec = importlib.machinery.ModuleSpec(fullname, self, origin=self.path)
        spec.has_location = True
        return spec

    def create_module(self, spec):  # noqa: ARG002
        return None

    def exec_module(self, module) -> None:
        module.__file__ = self.path
        exec(compile(self.source, self.path, "exec"), module.__dict__)

    def get_source(self, fullname):  # noqa: ARG002
        return self.source


def _prepare(job: Job) -> None:
    for p in job.sys_path:
        if p not in sys.path:
            sys.path.insert(0, p)
    if job.module is not None:
        sys.meta_path.insert(0, MutantSource(job.module, job.path, job.source))


def _load(job: Job):
    """Registry (imports the methods), the plan and a runner for this job."""
    import torch

    from engine.run.devices import resolve_device
    from engine.run.runner import Runner, plan_run
    from engine.spec import registry
    from engine.spec.loader import load_spec

    torch.set_num_threads(max(1, job.threads))
    reg = registry.load()
    for name in job.imports:
        importlib.import_module(name)
    spec = _validated(job) or load_spec(Path(job.spec_path), Path(job.root))
    plan = plan_run(spec, job.seeds, None, mutants=False)
    runner = Runner(plan, resolve_device(job.device))
    impl = reg.get_implementation(spec.data["implementation"])
    contracts = {c["id"]: c for c in plan.contracts}
    order = [contracts[c] for c in job.order if c in contracts] or list(plan.contracts)
    return runner, impl, order, spec


def _validated(job: Job):
    """The parent's validated spec, when spec_path still holds exactly the bytes it validated; else None (the
    worker validates whatever the file holds now)."""
    import hashlib

    from engine.spec.loader import Spec, display_path

    if job.spec_data is None or not job.spec_sha256:
        return None
    path = Path(job.spec_path)
    try:
        raw = path.read_bytes()
    except OSError:
        return None
    if hashlib.sha256(raw).hexdigest() != job.spec_sha256:
        return None
    return Spec(path=path, display=display_path(path, Path(job.root)), data=job.spec_data, doc=None,
                sha256=job.spec_sha256, raw=raw)


def _baseline(job: Job) -> dict:
    import coverage

    cov = coverage.Coverage(data_file=None, include=job.coverage_include, config_file=False, branch=False)
    cov.start()
    try:
        runner, impl, order, spec = _load(job)
        results = []
        for contract in order:
            cov.switch_context(contract["id"])  # which contract ran each line: only those can see a mutant there
            for seed in runner.plan.seeds:
                for dtype in contract["dtypes"]:
                    results.append(runner.call(impl, contract, seed, dtype, record_mechanism=False))
    finally:
        cov.stop()
    from engine.run.devices import describe
    from engine.run.mutate.generate import target_modules
    from engine.paths import project_root
    from engine.run.binding import imported_files
    from engine.run.runner import implementation_files

    modules = sorted({getattr(impl, f).__module__ for f in impl.functions})
    files = {m: sys.modules[m].__file__ for m in modules}
    targets = target_modules(modules, files)
    data = cov.get_data()
    # line -> contracts that executed it; "" is the import (module-level code runs before any contract).
    executed = {path: {line: sorted(ctxs) for line, ctxs in data.contexts_by_lineno(path).items()}
                for _, path in targets}
    import platform

    import torch

    return {"results": results, "targets": targets, "executed": executed, "source_files": imported_files(project_root()),
            "implementation_files": implementation_files(impl),
            "environment": {"python": platform.python_version(), "torch": torch.__version__,
                            "platform": f"{platform.system()}-{platform.machine()}",
                            "device": describe(runner.device), "torch_threads": torch.get_num_threads()}}


def _judge(job: Job) -> dict:
    """The mutant's contracts, in order, up to the first result that is not `passed`."""
    from engine.run.runner import PASSED

    t0 = time.perf_counter()
    try:
        runner, impl, order, _ = _load(job)
    except BaseException as exc:  # the mutated module does not import: the mutant cannot be used, it is caught
        return {"status": KILLED, "killed_by": "(import)", "seed": None, "dtype": None, "calls": 0,
                "message": f"{type(exc).__name__}: {exc}", "wall_s": round(time.perf_counter() - t0, 3)}
    calls = 0
    for contract in order:
        for seed in runner.plan.seeds:
            for dtype in contract["dtypes"]:
                r = runner.call(impl, contract, seed, dtype, record_mechanism=False)
                calls += 1
                if r["status"] != PASSED:
                    hung = (r["message"] or "").startswith("CheckTimeout")
                    return {"status": TIMEOUT if hung else KILLED, "killed_by": None if hung else contract["id"],
                            "seed": seed, "dtype": dtype, "calls": calls, "contract_status": r["status"],
                            "message": r["message"], "wall_s": round(time.perf_counter() - t0, 3)}
    return {"status": SURVIVED, "killed_by": None, "seed": None, "dtype": None, "calls": calls, "message": None,
            "wall_s": round(time.perf_counter() - t0, 3)}


def _watchdog(limit_s: float) -> None:
    """End this worker when the server that forked it is gone (the command was killed) or past `limit_s`:
    a mutant that hangs must never outlive the run that planted it."""
    import threading

    server, start = os.getppid(), time.monotonic()

    def watch() -> None:
        while True:
            time.sleep(0.5)
            if os.getppid() != server or time.monotonic() - start > limit_s:
                os._exit(3)

    threading.Thread(target=watch, name="mutate-watchdog", daemon=True).start()


def _worker(conn, job: Job) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides when a worker stops
    _watchdog(job.limit_s)
    # A mutant's warnings are noise on the terminal; what matters comes back through the pipe.
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.dup2(devnull, 2)
    try:
        _prepare(job)
        out = _baseline(job) if job.module is None else _judge(job)
        conn.send(("ok", out))
    except BaseException as exc:
        conn.send(("error", f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=8)}"))
    finally:
        conn.close()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)  # no interpreter teardown: torch's is slow and nothing here needs it


class WorkerFailed(RuntimeError):
    pass


def run_baseline(job: Job, timeout_s: float) -> dict:
    """The unmutated code's contracts under coverage, in a worker; raises WorkerFailed with why."""
    (out,) = _run_many([job], 1, timeout_s, None)
    if out["status"] != "ok":
        raise WorkerFailed(out["message"])
    return out["data"]


def run_mutants(jobs: list[Job], parallel: int, timeout_s: float,
                on_done: Callable[[int, dict], None] | None = None) -> list[dict]:
    """Judge every mutant job; each outcome has `status` killed | survived | timeout."""
    def progress(i: int, out: dict) -> None:
        if on_done is not None:
            on_done(i, _outcome(out))

    return [_outcome(out) for out in _run_many(jobs, parallel, timeout_s, progress)]


def _outcome(out: dict) -> dict:
    if out["status"] == "ok":
        return {**out["data"], "wall_s": out["wall_s"]}
    if out["status"] == TIMEOUT:
        return {"status": TIMEOUT, "killed_by": None, "seed": None, "dtype": None, "calls": None,
                "message": out["message"], "wall_s": out["wall_s"]}
    # The worker raised outside a contract, or died: the mutant broke the run, so it is caught.
    return {"status": KILLED, "killed_by": "(worker)", "seed": None, "dtype": None, "calls": None,
            "message": (out["message"] or "worker died").splitlines()[0], "wall_s": out["wall_s"]}


def _run_many(jobs: list[Job], parallel: int, timeout_s: float, on_done) -> list[dict]:
    ctx = _context()
    for job in jobs:  # a little past the parent's own limit: the parent normally stops it first
        job.limit_s = timeout_s + 30.0
    pending = deque(enumerate(jobs))
    running: dict[int, tuple[Any, Any, float]] = {}  # index -> (process, connection, start)
    outs: list[dict | None] = [None] * len(jobs)

    def finish(i: int, out: dict) -> None:
        proc, conn, _ = running.pop(i)
        conn.close()
        proc.join(timeout=5)
        if proc.is_alive():
            proc.kill()
            proc.join()
        outs[i] = out
        if on_done is not None:
            on_done(i, out)

    try:
        while pending or running:
            while pending and len(running) < max(1, parallel):
                i, job = pending.popleft()
                recv, send = ctx.Pipe(duplex=False)
                proc = ctx.Process(target=_worker, args=(send, job), daemon=True)
                proc.start()
                send.close()
                running[i] = (proc, recv, time.monotonic())
            now = time.monotonic()
            nearest = min(start + timeout_s for _, _, start in running.values())
            ready = wait([c for _, c, _ in running.values()] + [p.sentinel for p, _, _ in running.values()],
                         timeout=max(0.0, nearest - now) + 0.01)
            for i, (proc, conn, start) in list(running.items()):
                elapsed = round(time.monotonic() - start, 3)
                if conn in ready or conn.poll():
                    try:
                        kind, data = conn.recv()
                    except (EOFError, OSError):
                        kind, data = "error", f"worker exited with code {proc.exitcode} before reporting"
                    out = {"status": "ok", "data": data, "wall_s": elapsed} if kind == "ok" else \
                        {"status": "error", "message": data, "wall_s": elapsed}
                    finish(i, out)
                elif proc.sentinel in ready or not proc.is_alive():
                    finish(i, {"status": "error", "message": f"worker exited with code {proc.exitcode} before "
                                                             "reporting", "wall_s": elapsed})
                elif time.monotonic() - start > timeout_s:
                    proc.kill()
                    finish(i, {"status": TIMEOUT, "message": f"no verdict within {timeout_s:g} s; stopped",
                               "wall_s": elapsed})
    finally:
        for proc, conn, _ in running.values():  # interrupted: stop what is still running
            proc.kill()
            proc.join()
            conn.close()
    return outs  # type: ignore[return-value]
