"""Run a candidate implementation's contracts with the candidate in processes of its own; the checks and the
record stay here.

`contracts check METHOD --impl TARGET` runs, in order:

1. the candidate's baseline: every selected contract, seed and dtype;
2. the candidate with one function replaced: for each spec mutant that differs
   from the registered implementation in exactly one function, that function
   swapped in (the registered mutant's, run here), through the contracts the
   spec says kill it;
3. the spec's mutants on the registered implementation, in this (trusted)
   process, exactly as a plain `contracts check` runs them.

A kill counts only where the candidate's own baseline passed that (contract,
dtype), so every contract is shown to pass on the candidate and to fail on a
known-bad variant.

Where each contract runs (`CandidateSession`):

* across the boundary (`Supervised`, engine/run/boundary.py): the check runs
  here and calls the candidate's functions in a call-loop process that holds
  the candidate, torch and that loop, nothing of the engine (tensors in and
  out, gradients by a vector-Jacobian call there, a policy module as a handle
  both ways: MRTPO's `freeze` returns one); one such process per run, a fresh
  one after a lost call;
* beside the candidate (`CandidateRun`, the way every contract ran before):
  in a worker holding the engine and the candidate (engine/run/impl_worker.py)
  that answers one result per call over JSON pipes, checked against the call;
  for contracts with an argument that cannot cross (none of the five methods
  has one), that measure the candidate's own memory or time with engine code
  outside the `budget` kind (none does), and every contract of a framework
  target. The receipt lists them (isolation.checks_in_candidate).

Either way: every wait has a deadline (`--impl-timeout`, default the spec's
per_contract_timeout_seconds); past it, or when the process dies, it is killed
with its process group (or sandbox) and the calls it owned become `error`
results with the reason; on CPU the candidate's process caps its address space
at what its imports mapped plus `--impl-memory-mb`; the environment is the
allow-listed one (no key, token or credential variables); the receipt is built
and written here, after every candidate process is gone. How they are confined
(a bubblewrap sandbox each, engine/run/sandbox.py, or none with --no-sandbox)
is the caller's `Confinement`.
"""

from __future__ import annotations

import json
import os
import re
import select
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from engine.errors import UsageError

STARTUP_S = 180.0  # importing torch and the methods on a loaded 2-core machine, then loading the candidate
from engine.run.candidate_limits import DEFAULT_MEMORY_MB  # noqa: E402,F401 (the interface states it too)

# The worker's environment: only what Python, torch and CUDA need to run; never anything that looks like a secret.
_KEEP = re.compile(r"^(PATH|HOME|LANG|LANGUAGE|LC_[A-Z]+|TZ|TMPDIR|TEMP|TMP|PYTHONPATH|PYTHONHASHSEED|VIRTUAL_ENV|"
                   r"CONDA_PREFIX|LD_LIBRARY_PATH|OMP_[A-Z_]+|MKL_[A-Z_]+|OPENBLAS_[A-Z_]+|KMP_[A-Z_]+|"
                   r"CUDA_[A-Z_]+|CUBLAS_[A-Z_]+|NVIDIA_[A-Z_]+|TORCH_[A-Z_]+|CONTRACTS_DEBUG|NO_COLOR|TERM)$")
_SECRET = re.compile(r"KEY|TOKEN|SECRET|PASSW|CREDENTIAL|AUTH|SIGN|COOKIE|SESSION|PRIVATE", re.I)


def worker_env(environ: dict[str, str] | None = None) -> dict[str, str]:
    """The allow-listed environment a candidate's worker gets (no key, token or credential variables)."""
    environ = os.environ if environ is None else environ
    return {k: v for k, v in environ.items() if _KEEP.match(k) and not _SECRET.search(k)}


class WorkerLost(Exception):
    """The worker died, or did not answer in time; `reason` says which."""


class _Worker:
    """One isolated worker process and its two JSON pipes."""

    def __init__(self, init: dict):
        to_child_r, to_child_w = os.pipe()
        from_child_r, from_child_w = os.pipe()
        self.log = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "engine.run.impl_worker", str(to_child_r), str(from_child_w)],
            pass_fds=(to_child_r, from_child_w), env=worker_env(), stdin=subprocess.DEVNULL,
            stdout=self.log, stderr=self.log, start_new_session=True)  # its own group: killed whole, no Ctrl-C
        os.close(to_child_r)
        os.close(from_child_w)
        self._w = to_child_w
        self._r = from_child_r
        self._buf = b""
        self.send(init)

    def send(self, msg: dict) -> None:
        try:
            os.write(self._w, json.dumps(msg).encode() + b"\n")
        except OSError as exc:
            raise WorkerLost(f"could not write to the worker: {exc.strerror}") from None

    def recv(self, timeout: float) -> dict:
        """The next message, or WorkerLost (died, or nothing within `timeout` seconds)."""
        end = time.monotonic() + timeout
        while b"\n" not in self._buf:
            left = end - time.monotonic()
            if left <= 0:
                raise WorkerLost(f"no answer within {timeout:g} s")
            ready, _, _ = select.select([self._r], [], [], left)
            if not ready:
                continue
            chunk = os.read(self._r, 1 << 16)
            if not chunk:
                raise WorkerLost(self._death())
            self._buf += chunk
        line, self._buf = self._buf.split(b"\n", 1)
        try:
            msg = json.loads(line)
        except ValueError:
            raise WorkerLost("the worker sent something that is not a JSON message") from None
        if not isinstance(msg, dict):
            raise WorkerLost("the worker sent something that is not a JSON object")
        return msg

    def _exit_code(self) -> int | None:
        """The worker's exit status once it has ended, None if it is still running a few seconds on."""
        try:
            return self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            return None

    def _death(self) -> str:
        code = self._exit_code()
        if code is None:
            return "the worker closed its pipe"
        if code < 0:
            try:
                how = f"was killed by {signal.Signals(-code).name}"
            except ValueError:
                how = f"was killed by signal {-code}"
        else:
            how = f"exited with code {code}"
        tail = self.tail()
        return f"the worker process {how}" + (f" (last output: {tail})" if tail else "")

    def tail(self) -> str:
        """The last line the worker (or the candidate) wrote to stdout/stderr, printable characters only."""
        return log_tail(self.log)

    def close(self, kill: bool = False) -> None:
        if not kill and self.proc.poll() is None:
            try:
                self.send({"type": "stop"})
                self.proc.wait(timeout=5)
            except (WorkerLost, subprocess.TimeoutExpired):
                kill = True
        if self.proc.poll() is None or kill:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)  # the candidate's own children too
            except (ProcessLookupError, PermissionError):
                pass
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        self._release()

    def _release(self) -> None:
        """Close this side's pipe ends and the output log, once the worker has ended (or been killed)."""
        for fd in (self._w, self._r):
            try:
                os.close(fd)
            except OSError:
                pass
        self.log.close()


@dataclass
class Unit:
    """Calls one worker runs back to back: one contract's cells, or one replaced-function mutant's."""

    label: str
    calls: list[dict]
    replace: dict | None = None  # {"function": name, "mutant": registered mutant name}
    results: list[dict] = field(default_factory=list)
    mechanism: list[dict] = field(default_factory=list)


def _lost(call: dict, reason: str) -> dict:
    c = call["contract"]
    return {"contract": c["id"], "kind": c["kind"], "check": c["check"], "seed": call["seed"], "dtype": call["dtype"],
            "status": "error", "measurements": {}, "expectations": [], "message": f"no measurement: {reason}",
            "cases_requested": c["cases"], "wall_s": 0.0, "cost": {"optimizer_updates": 0, "sampled_tokens": 0}}


_RESULT_KEYS = {"contract", "seed", "dtype", "status", "measurements", "expectations"}
_STATUSES = ("passed", "failed", "error", "partial", "not_applicable")  # engine.run.runner.RESULT_STATUSES


def _accept(call: dict, r: Any) -> dict:
    """The worker's answer for `call`, if it is one; otherwise an error result saying what came back."""
    if not isinstance(r, dict) or not _RESULT_KEYS <= set(r) or r.get("status") not in _STATUSES \
            or (r["contract"], r["seed"], r["dtype"]) != (call["contract"]["id"], call["seed"], call["dtype"]) \
            or not isinstance(r.get("measurements"), dict) or not isinstance(r.get("expectations"), list):
        return _lost(call, "the worker's answer does not match the call it was asked to run")
    r.setdefault("cost", {"optimizer_updates": 0, "sampled_tokens": 0})
    r.setdefault("message", None)
    r.setdefault("wall_s", 0.0)
    r.setdefault("cases_requested", call["contract"]["cases"])
    return r


class CandidateRun:
    """Runs units against a candidate, one worker at a time; a lost worker costs only the calls it owned."""

    def __init__(self, init: dict, timeout_s: float, on_result: Callable[[dict], None] | None = None,
                 should_stop: Callable[[], bool] | None = None, startup_s: float = STARTUP_S,
                 worker_factory: Callable[[dict], Any] | None = None):
        self.init = init
        # a fresh `python` per worker unless told otherwise; run_candidate forks them from the warm server
        self.worker_factory = worker_factory or _Worker
        self.timeout_s = timeout_s
        self.startup_s = startup_s
        self.on_result = on_result or (lambda r: None)
        self.should_stop = should_stop or (lambda: False)
        self.worker: _Worker | None = None
        self.notes: list[str] = []
        self.checked_interface = False
        self.load_failure: str | None = None  # the candidate cannot run at all (it exits or dies on import)
        self.loaded: dict = {}  # the first worker's "loaded" message: for a framework target, what it adapted

    # -- worker life -------------------------------------------------------------

    def _start(self) -> _Worker:
        w = self.worker_factory(self.init)
        msg = _load_report(lambda: w.recv(self.startup_s), "type", lambda: w.close(kill=True), self.init, "the worker",
                           self.notes)
        if not self.checked_interface:
            self.loaded = msg
        self.checked_interface = True
        return w

    def probe(self) -> None:
        """Load the candidate once before anything runs: a missing function is a usage error, not a receipt."""
        try:
            self.worker = self._start()
        except WorkerLost as lost:
            self.load_failure = str(lost)

    def close(self) -> None:
        if self.worker is not None:
            self.worker.close()
            self.worker = None

    # -- units -------------------------------------------------------------------

    def run(self, unit: Unit) -> None:
        """Fill `unit.results` with one result per call, whatever happens to the worker."""
        pending = list(unit.calls)
        while pending:
            if self.should_stop():
                raise KeyboardInterrupt
            if self.load_failure is not None:
                for call in pending:
                    self._record(unit, _lost(call, f"the candidate could not be run: {self.load_failure}"))
                return
            if self.worker is None:
                try:
                    self.worker = self._start()
                except WorkerLost as lost:
                    self.load_failure = str(lost)
                    continue
            try:
                self.worker.send({"type": "unit", "calls": pending, "replace": unit.replace})
                while pending:
                    msg = self.worker.recv(self.timeout_s)
                    if msg.get("type") == "start":
                        continue
                    if msg.get("type") != "result":
                        raise WorkerLost(f"unexpected message {str(msg.get('type'))[:40]!r}")
                    call = pending.pop(0)
                    self._record(unit, _accept(call, msg.get("result")), msg.get("mechanism"))
                msg = self.worker.recv(self.timeout_s)
                if msg.get("type") != "unit_done":
                    raise WorkerLost("the worker did not finish the unit cleanly")
            except WorkerLost as lost:
                reason = str(lost)
                if reason.startswith("no answer within"):
                    reason = (f"the call ran past its deadline of {self.timeout_s:g} s and the candidate's worker "
                              "was killed")
                self.worker.close(kill=True)
                self.worker = None
                # The call it was on owns the loss; the rest of this contract's calls are not tried again (a
                # candidate that hangs would cost a deadline and a worker start each), the next contract is.
                for i, call in enumerate(pending):
                    self._record(unit, _lost(call, reason if i == 0 else
                                             f"not run: an earlier call of this unit lost its worker ({reason})"))
                return

    def _record(self, unit: Unit, r: dict, mechanism: Any = None) -> None:
        unit.results.append(r)
        if isinstance(mechanism, list):
            unit.mechanism += [m for m in mechanism if isinstance(m, dict)]
        self.on_result(r)


# --- the whole --impl run ------------------------------------------------------------------------


def single_function_mutants(plan) -> list[tuple[dict, str]]:
    """(spec mutant, function) for each planned mutant that replaces exactly one function of the registered
    implementation: that function can be swapped into a candidate to show the contracts bite there too."""
    from engine.spec import registry

    reg = registry.load()
    ref = reg.get_implementation(plan.spec.data["implementation"])
    out = []
    for m in plan.mutants:
        try:
            mutated = reg.get_mutant(m["mutant"]).factory()
        except Exception:  # noqa: BLE001 - the reference mutant phase records the factory's error
            continue
        changed = [f for f in ref.functions if getattr(mutated, f, None) is not getattr(ref, f)]
        if len(changed) == 1:
            out.append((m, changed[0]))
    return out


# Contracts that measure the implementation's own memory or time: those numbers exist only in the process that
# runs it. The `budget` kind's are taken there by the call loop's own meter (engine/run/boundary.py:
# CandidateMeter) and checked here (the result says `measured_in: candidate`); any other contract measuring them
# (a bespoke check metering with the engine's code) runs beside the candidate (isolation.checks_in_candidate).
RESOURCE_METRICS = frozenset({"peak_ratio", "scratch_budget_ratio", "memory_budget_ratio", "peak_memory_ratio",
                              "ns_per_element"})


def measured_beside(contract: dict) -> bool:
    """True for a contract whose measurements can only be taken in the candidate's process by engine code (its
    memory, its time, outside the `budget` kind, which the call loop meters)."""
    if contract.get("kind") == "budget":
        return False
    return contract.get("tier") == "budget" or any(
        e.get("metric") in RESOURCE_METRICS for e in contract.get("expect") or [])


@dataclass
class Confinement:
    """How one run confines a candidate's code, built by its caller (engine.run.sandbox.confine):

    * `callee()` starts a fresh candidate process running the call loop (in its sandbox, or bare under
      --no-sandbox) and returns it as (connection, the target as that process sees it, its folder, its
      environment);
    * `workers(init)` starts a worker that runs checks beside the candidate (the old way), for the contracts
      that cannot run across the boundary: arguments that do not cross, a framework target, the candidate's
      own memory and time;
    * `outside(path)` maps a path a sandboxed worker reported to the file here; `close()` kills what is left;
    * `record` is what the receipt says of the isolation (engine.run.sandbox.record) before `checks_in`."""

    record: dict
    callee: Callable[[], tuple[Any, dict, str, dict]]
    workers: Callable[[dict], Any]
    outside: Callable[[str], str] = lambda p: p
    close: Callable[[], None] = lambda: None


class Supervised:
    """A candidate's functions in a process of their own, its checks here: one long-lived candidate process per
    run (a fresh one only after a loss), one Runner.call per cell with a deadline on every wait."""

    def __init__(self, runner, init: dict, confinement: Confinement, timeout_s: float, startup_s: float = STARTUP_S):
        self.runner, self.init, self.confinement = runner, init, confinement
        self.timeout_s, self.startup_s = timeout_s, startup_s
        self.conn = None
        self.impl = None
        self.load_failure: str | None = None
        self.notes: list[str] = []
        self.measured_in_candidate: dict[str, None] = {}  # contract ids metered by the call loop (ordered)

    def _start(self) -> None:
        conn, inside, cwd, env = self.confinement.callee()
        init = {"target": inside, "names": self.init["names"], "device": self.init["device"],
                "threads": self.init["threads"], "memory_mb": self.init["memory_mb"], "cwd": cwd, "env": env}
        _load_report(lambda: conn.load(init, self.startup_s, self.timeout_s), "op", lambda: conn.close(kill=True), self.init,
                     "the candidate's process", self.notes)
        self.conn = conn
        self.impl = conn.implementation(self.init["name"], self.init["names"], _returns_objects(self.init))

    def probe(self) -> None:
        """Start and load the candidate before anything runs: a missing function is a usage error."""
        try:
            self._start()
        except WorkerLost as lost:
            self.load_failure = str(lost)

    def close(self) -> None:
        if self.conn is not None:
            # killed, not asked to stop: nothing the candidate's process does on its way out can matter to the
            # verdict, and an interpreter holding torch takes about half a second to tear itself down
            self.conn.close(kill=True)
            self.conn = None

    def run(self, unit: Unit, record_mechanism: bool, on_result: Callable[[dict], None]) -> bool:
        """Fill `unit.results` (and the runner's mechanism records) with one result per call, the checks run here;
        False, with nothing recorded, when an argument of this contract cannot cross (run it beside instead)."""
        runner = self.runner
        saved, mech0 = runner.budget, len(runner.mechanism)
        # the deadline is on every wait for the candidate; the run's wall budget is kept by the caller
        runner.budget = dict(saved, per_contract_timeout_seconds=None, max_wall_seconds=float("inf"))
        done: list[tuple[dict, dict]] = []
        try:
            for i, call in enumerate(unit.calls):
                if self.load_failure is not None:
                    done.append((call, _lost(call, f"the candidate could not be run: {self.load_failure}")))
                    continue
                if self.conn is None:
                    try:
                        self._start()
                    except WorkerLost as lost:
                        self.load_failure = str(lost)
                        done.append((call, _lost(call, f"the candidate could not be run: {lost}")))
                        continue
                conn, impl = self.conn, self.impl
                if unit.replace:
                    from engine.spec import registry

                    fn = unit.replace["function"]
                    mutated = registry.load().get_mutant(unit.replace["mutant"]).factory()
                    impl = impl.replace(f"{self.init['name']}+{unit.replace['mutant']}", **{fn: getattr(mutated, fn)})
                conn.not_crossable = conn.refused = None
                conn.deadline_s = self.timeout_s  # on every wait for the candidate, not on the checks' own work
                metered = conn.metered_entries
                r = runner.call(impl, call["contract"], call["seed"], call["dtype"], record_mechanism)
                r = {**r, "checked_in": "supervisor"}
                if conn.metered_entries > metered:  # its memory/time: the call loop's meter, in the candidate
                    r["measured_in"] = "candidate"
                    self.measured_in_candidate.setdefault(call["contract"]["id"], None)
                if conn.not_crossable is not None:
                    del runner.mechanism[mech0:]
                    self.notes_crossing = conn.not_crossable
                    conn.reset()
                    return False
                if conn.lost is not None:
                    done.append((call, _lost(call, conn.lost)))
                    done += [(c, _lost(c, f"not run: an earlier call of this unit lost its candidate process "
                                          f"({conn.lost})")) for c in unit.calls[i + 1:]]
                    conn.close(kill=True)
                    self.conn = None
                    break
                conn.reset()
                if conn.refused is not None:
                    r = {**r, "status": "error", "message": f"refused at the boundary: {conn.refused}"}
                done.append((call, r))
        finally:
            runner.budget = saved
        for _call, r in done:
            unit.results.append(r)
            on_result(r)
        return True


def _returns_objects(init: dict) -> set[str]:
    """The interface functions the registered implementation annotates as returning a module (a policy): their
    return value crosses back as a handle (engine/run/boundary.py), anything else returned by them is refused."""
    from engine.spec import registry

    try:
        return returns_objects(registry.load().get_implementation(init["implementation"]))
    except Exception:  # noqa: BLE001 - no registered implementation to read: every function is called across
        return set()


def returns_objects(registered) -> set[str]:
    """The interface functions of `registered` (an engine Implementation) annotated to return a torch module.
    Here, not in engine/run/boundary.py, which imports this module: the two would import each other."""
    import typing

    import torch

    out = set()
    for n in registered.functions:
        try:
            ret = typing.get_type_hints(getattr(registered, n)).get("return")
        except Exception:  # noqa: BLE001 - an annotation that does not resolve says nothing
            continue
        if isinstance(ret, type) and issubclass(ret, torch.nn.Module):
            out.add(n)
    return out


def _contract_calls(plan, contract: dict) -> list[dict]:
    return [{"contract": contract, "seed": s, "dtype": d, "record_mechanism": True}
            for s in plan.seeds for d in contract["dtypes"]]


# The way every check ran before the boundary (all of them beside the candidate): only benchmarks/sandbox_bench.py
# sets it, to measure the boundary against it in one run.
ALL_BESIDE = False


class CandidateSession:
    """Where each of a candidate's contracts runs: across the boundary (checks here) where its arguments cross,
    beside the candidate (checks in its worker) where they cannot; `beside` lists the latter, for the receipt."""

    def __init__(self, runner, init: dict, confinement: Confinement, timeout_s: float, framework: bool):
        self.runner, self.init, self.confinement, self.timeout_s = runner, init, confinement, timeout_s
        self.sup = None if framework or ALL_BESIDE else Supervised(runner, init, confinement, timeout_s)
        self.cand = CandidateRun(init, timeout_s, should_stop=runner.should_stop, worker_factory=confinement.workers)
        self.beside: list[str] = []  # contract ids whose checks ran in the candidate's worker
        self.why_beside: dict[str, str] = {}

    def probe(self) -> None:
        (self.sup or self.cand).probe()

    @property
    def load_failure(self) -> str | None:
        return (self.sup or self.cand).load_failure

    @property
    def notes(self) -> list[str]:
        return list(dict.fromkeys((self.sup.notes if self.sup else []) + self.cand.notes))

    def run(self, unit: Unit, contract: dict, on_result: Callable[[dict], None], record_mechanism: bool) -> None:
        cid = contract["id"]
        if self.sup is not None and cid not in self.beside and not measured_beside(contract):
            if self.sup.run(unit, record_mechanism, on_result):
                return
            self.why_beside[cid] = getattr(self.sup, "notes_crossing", "an argument does not cross")
        elif self.sup is not None and cid not in self.why_beside:
            self.why_beside[cid] = "it measures the candidate's own memory or time"
        if cid not in self.beside:
            self.beside.append(cid)
        if self.sup is not None and self.sup.load_failure and self.cand.load_failure is None:
            self.cand.load_failure = self.sup.load_failure
        self.cand.on_result = on_result
        self.cand.run(unit)
        for r in unit.results:
            r["checked_in"] = "candidate"
        self.runner.mechanism += unit.mechanism

    def record(self) -> dict:
        """The receipt's isolation: where the checks ran, and, where some ran beside the candidate, which."""
        rec = dict(self.confinement.record)
        rec["checks_in"] = "candidate" if self.sup is None else "mixed" if self.beside else "supervisor"
        if self.beside:
            rec["checks_in_candidate"] = [{"contract": c, "why": self.why_beside.get(c, "a framework target")}
                                          for c in self.beside]
        if self.sup is not None and self.sup.measured_in_candidate:
            rec["measured_in_candidate"] = [
                {"contract": c, "why": "its memory, operations and time are the candidate's process's own: the call "
                                      "loop metered the call there and sent the reading; the check ran here"}
                for c in self.sup.measured_in_candidate]
        return rec

    def close(self) -> None:
        try:
            if self.sup is not None:
                self.sup.close()
            self.cand.close()
        finally:
            self.confinement.close()  # the sandboxes and all they held are gone before anything is built or signed


def run_candidate(runner, target, ident: dict, names: list[str], device: str, threads: int,
                  timeout_s: float, memory_mb: int | None, confinement: Confinement) -> None:
    """Fill `runner` (an engine.run.runner.Runner) with the candidate's results, its replaced-function mutants
    and the spec's mutants on the registered implementation; the caller builds and writes the receipt.

    The candidate's functions run in their own process (`confinement.callee`), the checks here
    (engine/run/boundary.py); a contract whose arguments cannot cross, or that measures the candidate's own
    memory or time, and every contract of a framework target, runs beside the candidate in a worker
    (`confinement.workers`). The receipt records which (`runner.isolation`)."""
    from engine.run.runner import ERROR, FAILED, INTERRUPTED, PARTIAL, PASSED, Interrupted
    from engine.run.context import BudgetExceeded

    plan = runner.plan
    init = {"type": "init", "method": plan.spec.key, "shown": ident["target"], "name": f"impl:{ident['target']}",
            "cwd": os.getcwd(), "env": worker_env(),
            "implementation": plan.spec.data["implementation"],
            "names": names, "device": device, "threads": threads, "memory_mb": memory_mb,
            "budget": dict(plan.spec.data["budget"]), "case": plan.case,
            "target": {"form": target.form, "path": str(target.path) if target.path else None,
                       "module": target.module, "attribute": target.attribute,
                       "framework": target.framework, "name": target.name}}

    def progress(phase: str, extra: dict | None = None):
        return lambda r: runner.on_result({"phase": phase, **(extra or {}), **r})

    session = CandidateSession(runner, init, confinement, timeout_s, framework=target.form == "framework")
    runner.isolation = session.record()
    runner.candidate_mutants = []
    wall = float(plan.spec.data["budget"]["max_wall_seconds"])
    try:
        session.probe()  # a usage error (missing function, syntax error) leaves here, before any result
        adapter = _adapted_identity(session.cand, ident, target, confinement.outside) if session.sup is None \
            else None
        for contract in plan.contracts:
            if time.perf_counter() - runner.t0 > wall:
                runner.errors.append(f"budget: run wall time is over budget.max_wall_seconds {wall:g}")
                runner.status = FAILED
                break
            unit = Unit(label=contract["id"], calls=_contract_calls(plan, contract))
            session.run(unit, contract, progress("baseline"), record_mechanism=True)
            runner.results += unit.results
        by_id = {c["id"]: c for c in plan.contracts}
        seed = plan.seeds[0]
        # partial: every expectation it could be held to held, so a mutant failing one of those is a kill
        baseline_ok = {(r["contract"], r["dtype"]) for r in runner.results
                       if r["seed"] == seed and r["status"] in (PASSED, PARTIAL)}
        if runner.status is None:
            for m, fn in single_function_mutants(plan):
                if adapter is not None and (fn in adapter["absent"] or not set(adapter["own"]) - {fn}):
                    # swapping in the function it lacks, or its only own one, would check the project's code
                    adapter.setdefault("mutants_not_run", []).append(
                        {"id": m["id"], "replaced": fn, "why": f"the candidate has no {fn} of its own" if fn in
                         adapter["absent"] else f"{fn} is all the candidate has of its own"})
                    continue
                record = {"id": m["id"], "mutant": m["mutant"], "replaced": fn, "description": m["description"],
                          "expected_killers": list(m["killed_by"]), "killed_by": [], "killed": False, "seed": seed,
                          "results": []}
                for cid in m["killed_by"]:
                    unit = Unit(label=m["id"], calls=[{"contract": by_id[cid], "seed": seed, "dtype": d}
                                                      for d in by_id[cid]["dtypes"]],
                                replace={"function": fn, "mutant": m["mutant"]})
                    session.run(unit, by_id[cid], progress("mutant", {"mutant": f"{m['id']} in the candidate"}),
                                record_mechanism=False)
                    for r in unit.results:
                        counts = (r["contract"], r["dtype"]) in baseline_ok
                        kills = r["status"] in (FAILED, ERROR) and counts
                        record["results"].append({"contract": r["contract"], "dtype": r["dtype"],
                                                  "status": r["status"], "message": r["message"],
                                                  "baseline_passed": counts, "kills": kills})
                        if kills and r["contract"] not in record["killed_by"]:
                            record["killed_by"].append(r["contract"])
                record["killed"] = bool(record["killed_by"])
                runner.candidate_mutants.append(record)
    except (KeyboardInterrupt, Interrupted):
        runner.status = INTERRUPTED
        runner.errors.append("interrupted: the run was stopped; results finished so far are kept")
        if session.cand.worker is not None:  # mid-call: do not wait for it to finish
            session.cand.worker.close(kill=True)
            session.cand.worker = None
    finally:
        session.close()
    runner.isolation = session.record()
    if session.load_failure:
        runner.errors.append(f"the candidate could not be run: {session.load_failure}")
    runner.errors += [f"isolation: {n}" for n in session.notes]
    if runner.status is None:
        try:
            runner.run_mutants()  # the registered implementation's mutants, here: trusted code, no candidate loaded
        except BudgetExceeded as exc:  # the wall budget ran out during them: a failed run, as Runner.run ends it
            runner.errors.append(f"budget: {exc}")
            runner.status = FAILED


def _adapted_identity(cand: "CandidateRun", ident: dict, target, outside=None) -> dict | None:
    """For a framework target: check that the file defining the adapted object is bound, and record in `ident`
    which object it is and what the method's adapter made of it. None for other targets. `outside` maps a path
    a sandboxed worker reported to the file here."""
    from engine.run.impl_loader import subject_of

    info = cand.loaded.get("function")
    if target.form != "framework" or not isinstance(info, dict):
        return None
    source = str(info.get("source") or "")
    subject = subject_of(ident, outside(source) if outside else source)
    if subject is None:
        where = Path(str(info.get("source") or "?")).name
        raise UsageError(f"--impl {ident['target']}: {target.framework}'s {target.name!r} is defined in {where}, "
                         f"which this target does not bind; name that file or module: "
                         f"{target.framework}:path/to/{where}:{target.name}")
    ident["function"] = {"name": str(info.get("name")), "qualname": str(info.get("qualname")),
                         "file": subject["name"], "sha256": subject["digest"]["sha256"]}
    raw = cand.loaded.get("adapter") or {}
    adapter = {"own": [str(x) for x in raw.get("own") or []],
               "supplied": {str(k): str(v) for k, v in (raw.get("supplied") or {}).items()},
               "absent": {str(k): str(v) for k, v in (raw.get("absent") or {}).items()},
               "notes": [str(x) for x in raw.get("notes") or []]}
    ident["adapter"] = adapter
    return adapter


def make_runner(plan, device, ident: dict, on_result=None, should_stop=None, policy=None):
    """An engine.run.runner.Runner whose receipt names the candidate: its identity in the predicate, its files as
    `impl:` subjects, its replaced-function mutants (a surviving one fails the run like any mutant). `plan` is
    narrowed to what a candidate is held to (engine.run.runner.for_candidate): no registered-only contract runs."""
    from engine.run.runner import FAILED, PARTIAL, PASSED, Runner, for_candidate

    plan = for_candidate(plan)

    class CandidateRunner(Runner):
        candidate_mutants: list = []
        isolation: dict = {"sandbox": "none", "candidate": True}  # set by run_candidate: where it ran

        def extra_subjects(self) -> list[dict]:
            return [dict(s) for s in ident["subjects"]]

        def verdict(self) -> str:
            v = super().verdict()
            if v in (PASSED, PARTIAL) and any(not m["killed"] for m in self.candidate_mutants):
                return FAILED
            return v

        def predicate(self) -> dict:
            pred = super().predicate()
            pred["isolation"] = self.isolation
            # which selected contracts a candidate is not held to (they test how the registered one is built)
            pred["registered_only"] = {"skipped": list(plan.registered_only), "applies_to": "registered"}
            # `name` is the spec's registered implementation whose interface the candidate exposes; `kind:
            # external` and the target say it ran instead of that one (engine.run.impl_loader.unit_of)
            pred["implementation"] = {k: v for k, v in ident.items() if k != "subjects"} | {
                "name": plan.spec.data["implementation"], "files": [s["name"] for s in ident["subjects"]]}
            pred["candidate_mutants"] = self.candidate_mutants
            pred["summary"]["candidate_mutants"] = {
                "killed": sum(m["killed"] for m in self.candidate_mutants),
                "survived": sum(not m["killed"] for m in self.candidate_mutants)}
            return pred

    return CandidateRunner(plan, device, on_result=on_result, should_stop=should_stop, policy=policy)


def check_options(impl: str | None, all_: bool, jobs: int, executor: str, address: str | None,
                  policy: str | None, no_sandbox: bool = False) -> None:
    """--impl runs one method serially in isolated workers: refuse the options it cannot honour."""
    if impl is None:
        if no_sandbox:
            raise UsageError("--no-sandbox applies to --impl (candidate code); leave it out here")
        return
    if all_:
        raise UsageError("--impl checks one implementation of one method; name the method instead of --all")
    if jobs != 1 or executor != "local" or address:
        raise UsageError("--impl runs in its own isolated workers; leave out --jobs, --executor and --address")


__all__ = ["CandidateRun", "CandidateSession", "Confinement", "Supervised", "Unit", "check_options", "make_runner", "run_candidate",
           "single_function_mutants", "worker_env"]


def _load_report(receive: Callable[[], dict], key: str, close: Callable[[], None], init: dict, who: str,
                 notes: list[str]) -> dict:
    """The candidate's load report, received, for a worker and a call-loop process alike: a process lost while
    loading is closed (killed) and reported lost; the report is checked (_require_loaded); a note it carries
    joins `notes` once."""
    try:
        msg = receive()
    except WorkerLost as lost:
        close()
        raise WorkerLost(f"while loading the candidate: {lost}") from None
    _require_loaded(msg, key, close, init, who)
    if msg.get("note") and str(msg["note"]) not in notes:
        notes.append(str(msg["note"]))
    return msg


def _require_loaded(msg: dict, key: str, close: Callable[[], None], init: dict, who: str) -> None:
    """The candidate's load report, the same for a worker and a call-loop process: an unloadable file is a usage
    error (or a lost worker, if fatal), a missing interface function a usage error naming them all; each closes it."""
    if msg.get(key) == "load_error":
        close()
        if msg.get("fatal"):
            raise WorkerLost(f"while loading the candidate: {msg.get('message')}")
        raise UsageError(f"--impl {init['shown']}: cannot load it: {msg.get('message')}")
    if msg.get(key) != "loaded":
        close()
        raise WorkerLost(f"{who} did not report the candidate loaded")
    problems = []
    for field, what in (("missing", "has no function"), ("not_callable", "has a non-callable")):
        names = [n for n in msg.get(field) or [] if isinstance(n, str)]
        if names:
            problems.append(f"{what} {', '.join(names)}")
    if problems:
        close()
        raise UsageError(f"--impl {init['shown']} {'; '.join(problems)}; the {init['method']} interface "
                         f"needs {', '.join(init['names'])} (see contracts interface {init['method']})")


LOG_TAIL = 8 << 10  # what is read of a candidate's stdout and stderr: its last lines, never the whole file


def log_tail(log) -> str:
    """The last non-blank line of a process's output file, printable characters only, read from its last LOG_TAIL
    bytes (a candidate that printed gigabytes costs the checks 8 KiB)."""
    try:
        size = log.seek(0, os.SEEK_END)
        log.seek(max(0, size - LOG_TAIL))
        lines = [ln for ln in log.read(LOG_TAIL).decode("utf-8", "replace").splitlines() if ln.strip()]
    except (OSError, ValueError):
        return ""
    last = lines[-1].strip() if lines else ""
    return "".join(ch for ch in last if ch.isprintable())[:300]


def exit_text(code: int) -> str:
    """How a process ended, for a one-line failure: 'exited with code 3', 'was killed by SIGKILL'."""
    if code < 0:
        if -code == getattr(signal, "SIGXFSZ", None):
            return "was killed by SIGXFSZ (it wrote past the file size limit, stdout and stderr included)"
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


def kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL a process started in a session of its own, and everything it started; reap it (10 s at most)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        pass
