"""The isolated worker that runs a candidate implementation's checks (`python -m engine.run.impl_worker RFD WFD`).

Started by engine/run/isolation.py with a scrubbed environment; talks JSON
lines over two inherited pipes (never stdout, which the candidate may print
to). It imports torch and the methods, lowers its own address-space limit,
loads the candidate, then runs the units it is sent one check call at a time,
answering each call with its result. It writes no receipt and holds no key:
the parent decides what the answers mean.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
import traceback
from pathlib import Path


class _Channel:
    def __init__(self, rfd: int, wfd: int):
        self._in = os.fdopen(rfd, "rb")
        self._out = os.fdopen(wfd, "wb", buffering=0)

    def send(self, msg: dict) -> None:
        # NaN and inf stay numbers (Python's json reads them back); anything else unknown goes as its repr
        self._out.write(json.dumps(msg, default=repr).encode() + b"\n")

    def recv(self) -> dict | None:
        line = self._in.readline()
        return json.loads(line) if line else None


def _vm_bytes() -> int:
    """This process's current virtual size (what RLIMIT_AS counts), from /proc; 0 where unknown."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _limit_memory(extra_mb: int | None) -> str | None:
    """Cap the address space at what the imports mapped plus `extra_mb`: an unbounded allocation then fails
    with MemoryError/RuntimeError inside the check (recorded as an error) instead of exhausting the machine."""
    if not extra_mb:
        return None
    try:
        import resource
    except ImportError:
        return "no resource module: memory is not limited"
    cap = _vm_bytes() + int(extra_mb) * 1024 * 1024
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    if hard != resource.RLIM_INFINITY:
        cap = min(cap, hard)
    resource.setrlimit(resource.RLIMIT_AS, (cap, hard))
    return None


def _where(exc: BaseException) -> str:
    frames = traceback.extract_tb(exc.__traceback__)
    for fr in reversed(frames):
        name = Path(fr.filename).name
        return f" ({name}:{fr.lineno})"
    return ""


def import_harness() -> None:
    """torch, the runner and every method package: what a worker needs before it loads a candidate (a warm
    server, engine/run/warm_server.py, does this once and forks a worker per candidate)."""
    from engine.run.imports import gc_paused

    with gc_paused():
        import torch  # noqa: F401

        from engine.run import impl_loader, runner  # noqa: F401
        from engine.spec import registry

        registry.load()


def main(argv: list[str]) -> int:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides what an interrupt means
    chan = _Channel(int(argv[0]), int(argv[1]))
    init = chan.recv()
    if init is None:
        return 0
    import_harness()
    return serve(chan, init)


def _take_place(init: dict) -> None:
    """Work in the folder and with the (allow-listed) environment of the check that asked for this worker. A
    cold worker starts with both; a worker forked from a warm server has the server's, from when it started."""
    env = init.get("env")
    if isinstance(env, dict):
        os.environ.clear()
        os.environ.update({str(k): str(v) for k, v in env.items()})
    cwd = init.get("cwd")
    if isinstance(cwd, str) and cwd:
        try:
            os.chdir(cwd)
        except OSError:
            pass  # gone since: a cold worker would run where it was started, which is where it is


def serve(chan: _Channel, init: dict) -> int:
    """Load the candidate `init` names, then answer the units sent on `chan` until told to stop."""
    import torch

    from engine.run.impl_loader import load
    from engine.run.runner import Plan, Runner
    from engine.spec import registry
    from engine.spec.registry import Implementation

    _take_place(init)
    if init.get("threads"):
        torch.set_num_threads(int(init["threads"]))
    framework = init["target"].get("framework")
    if framework:  # the framework itself (verl and what it imports) is mapped before the cap; the candidate after
        try:
            from engine.run.impl_loader import _framework

            _framework(framework).preload()
        except Exception as exc:  # noqa: BLE001 - a broken framework install is the environment's, said in one line
            chan.send({"type": "load_error", "fatal": False,
                       "message": f"cannot import {framework}: {type(exc).__name__}: {exc}{_where(exc)}"})
            return 0
    note = _limit_memory(init.get("memory_mb")) if init["device"].startswith("cpu") else None
    adapted = function = None
    try:
        if framework:
            from engine.run.impl_loader import load_framework_object

            obj, function = load_framework_object(init["target"])
            adapted = registry.load().get_adapter(framework, init["implementation"])(obj)
            found = dict(adapted.functions)
            missing = [n for n in init["names"] if n not in found and n not in adapted.absent]
            not_callable = [n for n in found if not callable(found[n])]
        else:
            found, missing, not_callable = load(init["target"], init["names"])
    except BaseException as exc:  # noqa: BLE001 - SystemExit and KeyboardInterrupt in module code too
        # An Exception (SyntaxError, ImportError, ...) is a problem with the target; anything else (sys.exit)
        # is the candidate's behaviour, which the parent records as errors like a crash.
        if isinstance(exc, SyntaxError):  # its str() holds the file's absolute path: name the file only
            text = f"{exc.msg} ({Path(exc.filename or '?').name}:{exc.lineno})"
        else:
            text = f"{exc}{_where(exc)}"
        chan.send({"type": "load_error", "fatal": not isinstance(exc, Exception),
                   "message": f"{type(exc).__name__}: {text}"})
        return 0
    loaded = {"type": "loaded", "missing": missing, "not_callable": not_callable, "note": note}
    if adapted is not None:
        loaded["function"] = function
        loaded["adapter"] = {"own": list(adapted.own), "supplied": dict(adapted.supplied),
                             "absent": dict(adapted.absent), "notes": list(adapted.notes)}
    chan.send(loaded)
    if missing or not_callable:
        return 0
    candidate = adapted.implementation(init["name"]) if adapted is not None else Implementation(init["name"], **found)

    from types import SimpleNamespace

    budget = dict(init["budget"])
    budget["per_contract_timeout_seconds"] = None  # the parent's deadline kills a stuck call: it becomes an error
    budget["max_wall_seconds"] = float("inf")  # the parent keeps the run's wall budget
    # check --case N holds here too: the checks that run beside the candidate draw case N alone
    plan = Plan(spec=SimpleNamespace(data={"budget": budget}), seeds=[], contracts=[], mutants=[], only=None,
                case=init.get("case"))
    from engine.run.devices import resolve_device

    runner = Runner(plan, resolve_device(init["device"]))
    while True:
        unit = chan.recv()
        if unit is None or unit.get("type") == "stop":
            return 0
        impl = candidate
        if unit.get("replace"):
            fn = unit["replace"]["function"]
            mutated = registry.load().get_mutant(unit["replace"]["mutant"]).factory()
            impl = candidate.replace(f"{init['name']}+{unit['replace']['mutant']}", **{fn: getattr(mutated, fn)})
        for call in unit["calls"]:
            before = len(runner.mechanism)
            chan.send({"type": "start", "contract": call["contract"]["id"], "seed": call["seed"],
                       "dtype": call["dtype"], "t": time.time()})
            try:
                r = runner.call(impl, call["contract"], call["seed"], call["dtype"],
                                record_mechanism=bool(call.get("record_mechanism")))
            except BaseException as exc:  # noqa: BLE001 - e.g. KeyboardInterrupt raised by the candidate itself
                r = {"contract": call["contract"]["id"], "kind": call["contract"]["kind"],
                     "check": call["contract"]["check"], "seed": call["seed"], "dtype": call["dtype"],
                     "status": "error", "measurements": {}, "expectations": [],
                     "message": f"{type(exc).__name__}: {exc}", "cases_requested": call["contract"]["cases"],
                     "wall_s": 0.0, "cost": {"optimizer_updates": 0, "sampled_tokens": 0}}
            chan.send({"type": "result", "result": r, "mechanism": runner.mechanism[before:]})
        chan.send({"type": "unit_done"})


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
