"""Determinism: two CPU runs with the same seeds write identical measurements into their receipts.

TAPO's mechanism contract (real rollouts, optimizer updates, a control arm),
a random-input value contract in four dtypes and the clip schedule, with
their mutants, run three times: twice with seeds 42,43 (once in this
process, once in a fresh `python -m engine.cli` process, which has its own
hash seed and its own torch state) and once with seed 43 alone after the
others (a result may depend on its seed only, not on what ran before it).
Everything measured must be equal bit for bit; only times and ids may differ.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from typer.testing import CliRunner

from engine.cli import app
from engine.paths import project_root
from tests.toy_spec import toy_spec

ROOT = project_root()
ONLY = ["--only", "mechanism", "--only", "prefix_ratio_forward", "--only", "clip_schedule"]


def measured(pred: dict, seeds: tuple[int, ...] | None = None) -> dict:
    """What a run measured, keyed so that two runs can be compared; times, dates and ids left out."""
    keep = (lambda r: True) if seeds is None else (lambda r: r["seed"] in seeds)
    results = {(r["contract"], r["seed"], r["dtype"]): {
        "status": r["status"], "message": r["message"], "measurements": r["measurements"],
        "expectations": r["expectations"], "cases": r["cases_requested"], "cost": r["cost"]}
        for r in pred["results"] if keep(r)}
    mechanism = {(m["contract"], m["seed"], m["dtype"]): {"steps": m["steps"], "comparisons": m["comparisons"]}
                 for m in pred["mechanism"] if keep(m)}
    out = {"results": results, "mechanism": mechanism}
    if seeds is None:
        out["mutants"] = [{k: m[k] for k in ("id", "killed", "killed_by", "seed", "results")} for m in pred["mutants"]]
        out["cost"] = {k: v for k, v in pred["cost"].items() if k != "wall_s"}
        out["summary"] = pred["summary"]
        out["status"] = pred["status"]
    return out


def _receipt(store: Path) -> dict:
    (path,) = (store / "tapo-trajectory").glob("*.json")
    return json.loads(path.read_text())["predicate"]


def test_two_cpu_runs_with_the_same_seeds_measure_the_same(tmp_path):
    a, b, c = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    res = CliRunner().invoke(app, ["check", "tapo-trajectory", *ONLY, "--seeds", "42,43", "--receipts", str(a)])
    assert res.exit_code == 0, res.output
    fresh = subprocess.run([sys.executable, "-m", "engine.cli", "check", "tapo-trajectory", *ONLY, "--seeds", "42,43",
                            "--receipts", str(b)], cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
                           capture_output=True, text=True, timeout=300)
    assert fresh.returncode == 0, fresh.stderr[-3000:]
    res = CliRunner().invoke(app, ["check", "tapo-trajectory", *ONLY, "--seeds", "43", "--no-mutants",
                                   "--receipts", str(c)])
    assert res.exit_code in (0, 1), res.output  # without mutants the verdict is not the point here
    pa, pb, pc = _receipt(a), _receipt(b), _receipt(c)

    first, second = measured(pa), measured(pb)
    assert first["results"] and first["mechanism"] and first["mutants"]
    assert any(step for m in first["mechanism"].values() for step in m["steps"]), "the mechanism recorded updates"
    assert first == second, "a fresh process measured something else"
    assert measured(pc, (43,)) == measured(pa, (43,)), "seed 43's results depend on what ran before them"
    # the parts allowed to differ did differ: these really were separate runs
    assert pa["receipt_id"] != pb["receipt_id"] and pa["created_at"] != pb["created_at"]


# --- a check that draws from torch's global generator: the runner seeds it per call ---------------

GLOBAL_RNG_SPEC = toy_spec(
    "reliab-rng", "reliab_rng", title="Test-only: a check drawing from torch's global generator", arxiv="2601.00005",
    budget={"seeds": [42, 43], "max_seeds": 2},
    formulas='  - {id: f1, latex: "u \\\\sim U(0,1)", implements: draw}',
    contracts="""\
  - {id: draw, description: a draw from the global generator, formulas: [f1], kind: value, tier: math,
     check: reliab_rng.global_draw, dtypes: [float64, float32], cases: 1, expect: [{metric: u, le: 1.0}]}""",
    mutants="  - {id: shifted, description: adds 2, mutant: reliab_rng.shifted, killed_by: [draw]}")


def test_a_check_using_the_global_generator_is_seeded_per_call(tmp_path):
    import torch

    from engine.spec import registry

    reg = registry.load()
    impl = registry.implementation("reliab_rng", draw=lambda: torch.rand((), dtype=torch.float64))
    registry.check("reliab_rng.global_draw")(lambda impl, ctx: {"u": impl.draw().item()})
    registry.mutant("reliab_rng.shifted", base="reliab_rng")(
        lambda: impl.replace("reliab_rng.shifted", draw=lambda: torch.rand((), dtype=torch.float64) + 2))
    try:
        specs = tmp_path / "specs"
        specs.mkdir()
        (specs / "reliab-rng.yaml").write_text(GLOBAL_RNG_SPEC)
        preds = []
        for run, seeds in enumerate(("42,43", "42,43", "43")):
            store = tmp_path / f"r{run}"
            res = CliRunner().invoke(app, ["check", "reliab-rng", "--seeds", seeds, "--specs", str(specs),
                                           "--receipts", str(store)])
            assert res.exit_code == 0, res.output
            (path,) = (store / "reliab-rng").glob("*.json")
            preds.append(json.loads(path.read_text())["predicate"])
        first, second, alone = preds
        assert measured(first) == measured(second)
        assert measured(alone, (43,)) == measured(first, (43,))
        draws = {(r["seed"], r["dtype"]): r["measurements"]["u"] for r in first["results"]}
        assert draws[(42, "float64")] != draws[(43, "float64")], "different seeds draw differently"
    finally:
        del reg.implementations["reliab_rng"], reg.checks["reliab_rng.global_draw"], reg.mutants["reliab_rng.shifted"]
