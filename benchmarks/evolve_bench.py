"""The OpenEvolve evaluator's throughput: a warm evaluator beside a cold `contracts check --impl` process.

Warm: one engine.evolve.evaluator.Evaluator in this process, as in an OpenEvolve
worker, after its first call (which starts the warm server: reported, not
judged). Every timed call checks a candidate it has not seen (the same TAPO
with a different comment), so nothing is reused but the warm server: each
call forks fresh workers, runs the cells, writes a receipt and reads it back.
Cold: a fresh `python -m engine.cli check tapo-trajectory --impl FILE
--no-mutants` process running the same cells (torch and the methods imported
twice: by the process and by its worker), as a pipeline would call it per
candidate without this evaluator. The two alternate (cold, warm, warm, cold,
...) so the neighbours' load hits both alike.
"""

from __future__ import annotations

import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.harness import ROOT, Candidates, Row, spread

STAGE1_TARGET_S, FULL_TARGET_S = 1.0, 5.0
METHOD = "tapo-trajectory"


def _children_cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def _cold(cand: Path, store: Path, extra: list[str]) -> tuple[float, float]:
    """(wall, CPU seconds of the process and its worker): what one cold check of a candidate costs."""
    argv = [sys.executable, "-m", "engine.cli", "check", METHOD, "--impl", str(cand), "--no-mutants",
            "--receipts", str(store), "--json", *extra]
    c0, t0 = _children_cpu(), time.perf_counter()
    proc = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"cold check exited {proc.returncode}: {proc.stderr.strip()[-500:]}")
    return wall, _children_cpu() - c0


def _paired(warm, cold, repeats: int) -> tuple[list, list]:
    tw, tc = [], []
    for i in range(repeats):
        order = (cold, warm) if i % 2 == 0 else (warm, cold)
        for fn in order:
            (tc if fn is cold else tw).append(fn())
    return tw, tc


def _idle(rows: list[tuple[float, float]]) -> float:
    return statistics.median(c for _w, c in rows)


def run(device: str = "cpu", repeats: int = 5, cold_repeats: int = 3) -> list[Row]:
    from engine.evolve import stages as S
    from engine.evolve.evaluator import Evaluator
    from engine.spec.loader import load_spec

    spec = load_spec(ROOT / "specs" / f"{METHOD}.yaml", ROOT)
    stage1 = [x for c in S.contract_ids(spec.data, 1) for x in ("--only", c)]
    seed1 = ["--seeds", str(spec.data["budget"]["seeds"][0])]
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-evolve-") as tmp:
        tmp = Path(tmp)
        fresh = Candidates(tmp)
        ev = Evaluator(METHOD, receipts=tmp / "warm", device=device)
        t0 = time.perf_counter()
        first = ev.stage(1, str(fresh()))
        startup = time.perf_counter() - t0
        if first.metrics["combined_score"] != 0.5:
            raise RuntimeError(f"the warm evaluator did not pass the fixture: {first.artifacts.get('verdict')}")

        def timed(*calls):
            def go() -> tuple[float, float]:
                """(wall, critical-path CPU seconds): per call, this process and its git calls, then its busiest
                worker thread; on an idle machine with a core per worker the wall time would be about that."""
                from engine.run import warm as W

                path, wall, crit = str(fresh()), 0.0, 0.0
                for call in calls:
                    W.last_stats.clear()
                    c0, k0, t = time.process_time(), _children_cpu(), time.perf_counter()
                    r = call(path)
                    wall += time.perf_counter() - t
                    crit += time.process_time() - c0 + _children_cpu() - k0 + max(W.last_stats.get("workers_cpu_s")
                                                                                  or [0.0])
                    if r.metrics["combined_score"] <= 0:
                        raise RuntimeError(f"the fixture scored 0: {r.artifacts.get('verdict')}")
                return wall, crit
            return go

        cases = [
            ("evolve stage 1, warm", f"{len(S.contract_ids(spec.data, 1))} value/gradient contracts x 1 seed",
             timed(lambda p: ev.stage(1, p)), lambda: _cold(fresh(), tmp / "cold", stage1 + seed1), STAGE1_TARGET_S),
            ("evolve full check, warm", f"{len(spec.data['contracts'])} contracts x "
             f"{len(spec.data['budget']['seeds'])} seeds", timed(ev.evaluate),
             lambda: _cold(fresh(), tmp / "cold", []), FULL_TARGET_S),
        ]
        for name, shape, warm, cold, target in cases:
            n = repeats if target == STAGE1_TARGET_S else max(3, repeats - 2)
            pw, pc = _paired(warm, cold, min(n, cold_repeats))
            pw += [warm() for _ in range(max(0, n - len(pw)))]
            tw, tc = [w for w, _c in pw], [w for w, _c in pc]
            med_w, med_c = statistics.median(tw), statistics.median(tc)
            rows.append(Row(
                name=name, shape=shape, against="cold contracts check --impl process, same cells",
                value=med_w, unit="s", target=f"<= {target:g} s", ok=med_w <= target,
                spread=spread(min(tw), max(tw), len(tw), " s"),
                note=f"cold process {med_c:.2f} s median ({spread(min(tc), max(tc), len(tc), ' s')}): {med_c / med_w:.1f}x "
                     f"the warm time; from CPU times an idle machine would give {_idle(pw):.2f} s warm, {_idle(pc):.2f} s "
                     f"cold ({_idle(pc) / _idle(pw):.1f}x); the warm server's start (first call) took {startup:.1f} s",
                details={"warm_s": tw, "cold_s": tc, "ratio": med_c / med_w, "warm_idle_s": [c for _w, c in pw],
                         "cold_cpu_s": [c for _w, c in pc], "startup_s": startup, "jobs": ev.jobs}))
        p3 = [timed(*(lambda p, k=k: ev.stage(k, p) for k in S.STAGES))() for _ in range(max(3, repeats - 2))]
        t3 = [w for w, _c in p3]
        rows.append(Row(
            name="evolve cascade 1 -> 2 -> 3, warm", shape="one candidate through OpenEvolve's three stages",
            against="(absolute)", value=statistics.median(t3), unit="s", target="(none: shown beside the full check)",
            ok=None, spread=spread(min(t3), max(t3), len(t3), " s"),
            note="stage 3 runs only the mechanism contract: the receipts of stages 1 and 2 count for the rest; "
                 f"from CPU times an idle machine would give {_idle(p3):.2f} s",
            details={"warm_s": t3, "warm_idle_s": [c for _w, c in p3]}))
    return rows
