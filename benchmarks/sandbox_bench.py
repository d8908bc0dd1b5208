"""What the bubblewrap sandbox costs a candidate: the same work sandboxed and not, warm, paired in one run.

Stage 1 of the OpenEvolve evaluator: two Evaluators in this process, one with each candidate in a sandbox of
its own (a spare started ahead: the default) and one with workers forked from the plain warm server
(`sandbox=False`); each primed with one call, then alternating, every call on a candidate neither has seen.

A full `contracts check METHOD --impl FILE` (baseline, single-function mutants in the candidate, the spec's
mutants on the registered implementation): in this process, sandboxed and `--no-sandbox` alternating, each
primed twice (the sandboxed side keeps a spare started once a process has checked a second candidate).
"""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path

from benchmarks.harness import Candidates, Row, spread

METHOD = "tapo-trajectory"
STAGE1_TARGET_S = 1.0


def _alternate(a, b, n: int, before_a=None) -> tuple[list[float], list[float]]:
    """a and b alternating (a, b, b, a, ...); `before_a` runs untimed before each a."""
    ta, tb = [], []
    for i in range(n):
        for fn in ((a, b) if i % 2 == 0 else (b, a)):
            if fn is a and before_a is not None:
                before_a()
            t = time.perf_counter()
            fn()
            (ta if fn is a else tb).append(time.perf_counter() - t)
    return ta, tb


def run(device: str = "cpu", repeats: int = 5, check_repeats: int = 3) -> list[Row]:
    from typer.testing import CliRunner

    from engine.cli import app
    from engine.evolve.evaluator import Evaluator
    from engine.run import sandbox

    why = sandbox.unavailable()
    if why:
        return [Row(name="sandbox cost", shape="", against="", value=None, unit="", target="", ok=None,
                    note=f"not measured: {why}")]
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-sandbox-") as tmp:
        tmp = Path(tmp)
        fresh = Candidates(tmp)
        boxed = Evaluator(METHOD, receipts=tmp / "boxed", device=device)
        plain = Evaluator(METHOD, receipts=tmp / "plain", device=device, sandbox=False)

        def stage1(ev):
            def go():
                r = ev.stage(1, str(fresh()))
                if r.metrics["combined_score"] != 0.5:
                    raise RuntimeError(f"stage 1 did not pass the fixture: {r.artifacts.get('verdict')}")
            return go

        def spare_ready():
            """Untimed: what OpenEvolve's LLM round trip between two candidates gives the spare template."""
            for box in list(boxed._pool._spares.values()) if boxed._pool else []:
                box.wait_ready(120)

        t0 = time.perf_counter()
        stage1(boxed)()
        first_boxed = time.perf_counter() - t0
        stage1(plain)()
        tb, tp = _alternate(stage1(boxed), stage1(plain), repeats, before_a=spare_ready)
        mb, mp = statistics.median(tb), statistics.median(tp)
        rows.append(Row(
            name="evolve stage 1, sandboxed, warm", shape="4 value/gradient contracts x 1 seed, a new candidate "
            "each call, its spare sandbox started", against="the same evaluator unsandboxed (workers forked from "
            "the plain warm server)", value=mb, unit="s", target=f"<= {STAGE1_TARGET_S:g} s", ok=mb <= STAGE1_TARGET_S,
            spread=spread(min(tb), max(tb), len(tb), " s"),
            note=f"unsandboxed {mp:.2f} s median ({spread(min(tp), max(tp), len(tp), ' s')}): sandboxed/unsandboxed "
                 f"{mb / mp:.2f}x; the first sandboxed call (no spare yet: bwrap, torch imported inside) took "
                 f"{first_boxed:.1f} s",
            details={"sandboxed_s": tb, "unsandboxed_s": tp, "ratio": mb / mp, "first_sandboxed_s": first_boxed}))
        back = []
        for _ in range(repeats):  # back to back: each call finds the spare its predecessor started still importing
            t = time.perf_counter()
            stage1(boxed)()
            back.append(time.perf_counter() - t)
        mk = statistics.median(back)
        rows.append(Row(
            name="evolve stage 1, sandboxed, back to back", shape="as above, no pause between candidates",
            against="the same evaluator unsandboxed (above)", value=mk / mp, unit="x", target="(shown: a template "
            "per candidate is imported afresh)", ok=None, spread=spread(min(back), max(back), len(back), " s"),
            note=f"{mk:.2f} s median: a candidate waits for its template's imports when candidates come faster "
                 "than one template starts",
            details={"sandboxed_s": back}))

        cli = CliRunner()

        def check(*extra):
            def go():
                r = cli.invoke(app, ["check", METHOD, "--impl", str(fresh()), "--device", device, "--receipts",
                                     str(tmp / "check"), "--json", *extra])
                if r.exit_code != 0:
                    raise RuntimeError(f"check --impl exited {r.exit_code}: {r.output[-400:]}")
            return go

        for _ in range(2):  # the sandboxed side's second call starts the spare the timed calls use
            check()()
            check("--no-sandbox")()
        def spare_ready_check():
            for pool in list(sandbox._POOLS.values()):
                for box in list(pool._spares.values()):
                    box.wait_ready(120)

        tb, tp = _alternate(check(), check("--no-sandbox"), check_repeats, before_a=spare_ready_check)
        mb, mp = statistics.median(tb), statistics.median(tp)
        rows.append(Row(
            name="check --impl (full), sandboxed, warm", shape="every contract x budget seeds, candidate and spec "
            "mutants", against="the same check --no-sandbox in the same process", value=mb / mp, unit="x",
            target="(shown: the sandbox's cost)", ok=None, spread=spread(min(tb) / max(tp), max(tb) / min(tp), len(tb)),
            note=f"sandboxed {mb:.1f} s, --no-sandbox {mp:.1f} s (medians of {len(tb)})",
            details={"sandboxed_s": tb, "unsandboxed_s": tp}))
    return rows


def boundary(device: str = "cpu", repeats: int = 4, check_repeats: int = 1) -> list[Row]:
    """The checks out of the candidate's process (engine/run/boundary.py) against the checks beside it (the way
    before), both sandboxed, alternating in one process: stage 1 of the evaluator, and a full check --impl."""
    from typer.testing import CliRunner

    from engine.cli import app
    from engine.evolve.evaluator import Evaluator
    from engine.run import isolation, sandbox

    why = sandbox.unavailable()
    if why:
        return [Row(name="boundary cost", shape="", against="", value=None, unit="", target="", ok=None,
                    note=f"not measured: {why}")]

    def beside(flag: bool, fn):
        def go():
            isolation.ALL_BESIDE = flag
            try:
                fn()
            finally:
                isolation.ALL_BESIDE = False
        return go

    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-boundary-") as tmp:
        tmp = Path(tmp)
        fresh = Candidates(tmp)
        across = Evaluator(METHOD, receipts=tmp / "across", device=device)
        old = Evaluator(METHOD, receipts=tmp / "beside", device=device)

        def stage1(ev):
            def go():
                r = ev.stage(1, str(fresh()))
                if r.metrics["combined_score"] != 0.5:
                    raise RuntimeError(f"stage 1 did not pass the fixture: {r.artifacts.get('verdict')}")
            return go

        def spares_ready():
            """Untimed: what OpenEvolve's LLM round trip between two candidates gives the spares."""
            for ev in (across, old):
                for box in list(ev._pool._spares.values()) if ev._pool else []:
                    box.wait_ready(120)

        t0 = time.perf_counter()
        stage1(across)()
        first = time.perf_counter() - t0
        beside(True, stage1(old))()
        spares_ready()
        ta, tb = _alternate(stage1(across), beside(True, stage1(old)), repeats, before_a=spares_ready)
        ma, mb = statistics.median(ta), statistics.median(tb)
        rows.append(Row(
            name="evolve stage 1, boundary, sandboxed, warm", shape="4 value/gradient contracts x 1 seed, a new "
            "candidate each call, its spare started", against="the same, checks beside the candidate (before)",
            value=ma, unit="s", target=f"<= {STAGE1_TARGET_S:g} s", ok=ma <= STAGE1_TARGET_S,
            spread=spread(min(ta), max(ta), len(ta), " s"),
            note=f"checks beside the candidate {mb:.2f} s median ({spread(min(tb), max(tb), len(tb), ' s')}): "
                 f"boundary/before {ma / mb:.2f}x; the first call (no spare yet) took {first:.1f} s",
            details={"boundary_s": ta, "beside_s": tb, "ratio": ma / mb, "first_s": first}))

        cli = CliRunner()

        def check():
            r = cli.invoke(app, ["check", METHOD, "--impl", str(fresh()), "--device", device, "--receipts",
                                 str(tmp / "check"), "--json"])
            if r.exit_code != 0:
                raise RuntimeError(f"check --impl exited {r.exit_code}: {r.output[-400:]}")

        check()
        beside(True, check)()

        def spare_ready_check():
            for pool in list(sandbox._POOLS.values()):
                for box in list(pool._spares.values()):
                    box.wait_ready(120)

        ta, tb = _alternate(check, beside(True, check), check_repeats, before_a=spare_ready_check)
        ma, mb = statistics.median(ta), statistics.median(tb)
        rows.append(Row(
            name="check --impl (full), boundary, sandboxed", shape="every contract x budget seeds, candidate and "
            "spec mutants", against="the same check, checks beside the candidate (before)", value=ma / mb,
            unit="x", target="(shown: the boundary's cost)", ok=None,
            spread=spread(min(ta) / max(tb), max(ta) / min(tb), len(ta)),
            note=f"boundary {ma:.1f} s, before {mb:.1f} s (medians of {len(ta)})",
            details={"boundary_s": ta, "beside_s": tb}))
    return rows
