"""Where a warm evolve stage 1 spends its time, across the boundary and sandboxed: one profiled evaluation after
`repeats` timed ones, its wall time split by what the supervisor was doing.

Buckets (cumulative time of the functions that do each, from cProfile, in the supervisor's process):

* references: the float64 and exact-arithmetic loops the checks compare with (`engine.kinds.calls.reference`);
* round trips: waiting on the candidate's process, call backs served included (`Connection.request`), and how
  many (calls; the rest are vector-Jacobian requests, some of them a whole Jacobian's rows at once);
* sandbox start: building and starting the candidate's sandbox (`sandbox.LoopBox`/`Pool.take`), its spare
  started ahead not counted;
* close: ending the candidate's process and its sandbox;
* the rest: drawing inputs, the kinds' own arithmetic, the receipt.

cProfile slows Python-heavy parts more than the rest: the shares are what to read, beside the unprofiled medians.
"""

from __future__ import annotations

import cProfile
import pstats
import statistics
import tempfile
import time
from pathlib import Path

from benchmarks.harness import Candidates, Row, spread

METHOD = "tapo-trajectory"
BUCKETS = {
    "references": ("engine/kinds/calls.py", "reference"),
    "round trips": ("engine/run/boundary.py", "request"),
    "sandbox start": ("engine/run/sandbox.py", "take"),
    "close": ("engine/run/isolation.py", "close"),
}


def _cumulative(stats: pstats.Stats, where: str, name: str) -> tuple[float, int]:
    total, calls = 0.0, 0
    for (path, _line, fn), (_cc, nc, _tt, ct, _callers) in stats.stats.items():  # type: ignore[attr-defined]
        if fn == name and path.replace("\\", "/").endswith(where):
            total, calls = max(total, ct), max(calls, nc)  # recursive entries repeat the outermost figure
    return total, calls


def run(device: str = "cpu", repeats: int = 5) -> list[Row]:
    from benchmarks.sandbox_bench import _spares_ready
    from engine.evolve.evaluator import Evaluator
    from engine.run import sandbox

    why = sandbox.unavailable()
    if why:
        return [Row(name="evolve stage 1 breakdown", shape="", against="", value=None, unit="", target="", ok=None,
                    note=f"not measured: {why}")]
    with tempfile.TemporaryDirectory(prefix="bench-stage1-") as tmp:
        tmp = Path(tmp)
        fresh = Candidates(tmp)
        ev = Evaluator(METHOD, receipts=tmp / "r", device=device)
        ev.stage(1, str(fresh()))  # the first start: no spare yet
        times = []
        for _ in range(repeats):
            _spares_ready(ev)
            t0 = time.perf_counter()
            ev.stage(1, str(fresh()))
            times.append(time.perf_counter() - t0)
        _spares_ready(ev)
        prof = cProfile.Profile()
        t0 = time.perf_counter()
        prof.enable()
        ev.stage(1, str(fresh()))
        prof.disable()
        profiled = time.perf_counter() - t0
    stats = pstats.Stats(prof)
    split = {k: _cumulative(stats, *v) for k, v in BUCKETS.items()}
    whole = _cumulative(stats, "engine/run/boundary.py", "vjp_rows")[1]
    calls = _cumulative(stats, "engine/run/boundary.py", "call")[1]
    rest = profiled - sum(t for t, _ in split.values())
    parts = "; ".join(f"{k} {t:.2f} s ({t / profiled:.0%})" for k, (t, _n) in split.items())
    med = statistics.median(times)
    return [Row(
        name="evolve stage 1, where the time goes", shape="4 value/gradient contracts x 1 seed, sandboxed, warm",
        against="(absolute)", value=med, unit="s", target="(shown)", ok=None,
        spread=spread(min(times), max(times), len(times), " s"),
        note=(f"one profiled stage 1 of {profiled:.2f} s: {parts}; the rest {rest:.2f} s ({rest / profiled:.0%}). "
              f"{split['round trips'][1]} round trips: {calls} calls, the rest vector-Jacobian requests ({whole} of "
              "them a Jacobian's rows fetched whole)"),
        details={"times_s": times, "profiled_s": profiled, "round_trips": split["round trips"][1], "calls": calls,
                 "jacobians_fetched_whole": whole, **{k.replace(" ", "_") + "_s": t for k, (t, _n) in split.items()}})]
