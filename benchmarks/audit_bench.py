"""What the supervisor's audits cost a full `contracts check METHOD --impl FILE`: with them against without, in one
process, alternating.

With: this head as it runs (the gradient audit of every update of every run, engine/run/run_audit.py, and the
gradient_audit and reported_metrics_agree contracts with the spec mutants they kill). Without: the same check with
`run_audit.ENABLED` off (no update compared, no report kept: the switch only this benchmark sets) and those two
contracts left out with `--only` (so the spec mutants only they kill are not run either; a candidate-side mutant
that only they kill runs and survives there). Each side gets a new candidate file each call (the fixture plus a
numbered comment), sandboxed where bubblewrap is available.
"""

from __future__ import annotations

import statistics
import tempfile
from pathlib import Path

from benchmarks.harness import Candidates, Row, spread
from benchmarks.sandbox_bench import _alternate, _check_spares_ready

METHOD = "tapo-trajectory"
AUDIT_KINDS = ("gradient_audit", "reported_metrics")


def run(device: str = "cpu", repeats: int = 5) -> list[Row]:
    from typer.testing import CliRunner

    from engine.cli import app
    from engine.paths import project_root
    from engine.run import run_audit, sandbox
    from engine.spec.loader import load_spec

    spec = load_spec(project_root() / "specs" / f"{METHOD}.yaml", project_root())
    rest = [c["id"] for c in spec.data["contracts"] if c["kind"] not in AUDIT_KINDS]
    boxed = [] if not sandbox.unavailable() else ["--no-sandbox"]
    cli = CliRunner()
    with tempfile.TemporaryDirectory(prefix="bench-audit-") as tmp:
        tmp = Path(tmp)
        fresh = Candidates(tmp)

        def check(on: bool):
            def go():
                only = [] if on else [a for c in rest for a in ("--only", c)]
                run_audit.ENABLED = on
                try:
                    r = cli.invoke(app, ["check", METHOD, "--impl", str(fresh()), "--device", device, "--receipts",
                                         str(tmp / ("on" if on else "off")), "--json", *only, *boxed])
                finally:
                    run_audit.ENABLED = True
                # off, a mutant only the audits kill (proximal_negated_later) survives its remaining killer, so
                # that side may exit 1; the work timed is the same
                if r.exit_code not in ((0,) if on else (0, 1)):
                    raise RuntimeError(f"check --impl exited {r.exit_code}: {r.output[-400:]}")
            return go

        check(True)()  # primes both sides' imports and the sandbox's spare
        check(False)()
        ta, tb = _alternate(check(True), check(False), repeats, before_a=_check_spares_ready)
    ma, mb = statistics.median(ta), statistics.median(tb)
    return [Row(
        name="check --impl (full), audits on", shape="every contract x budget seeds, candidate and spec mutants, "
        + ("sandboxed" if not boxed else "--no-sandbox"), against="the same check, audits off (run_audit.ENABLED "
        "off, gradient_audit and reported_metrics_agree left out)", value=ma / mb, unit="x",
        target="(shown: the audits' cost)", ok=None, spread=spread(min(ta) / max(tb), max(ta) / min(tb), len(ta)),
        note=f"audits on {ma:.1f} s, off {mb:.1f} s (medians of {len(ta)})",
        details={"on_s": ta, "off_s": tb})]
