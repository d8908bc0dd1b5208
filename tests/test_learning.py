"""The learning contract (engine/kinds/learning.py): on a budget where the toy task is learnable, each arm of the
paired run beats its own initial policy and the method arm keeps up with the GRPO control; an arm whose gradient
reaches its optimiser negated or not at all fails it, naming the arm. The honest runs pass, for the registered
implementations and for the plain-torch candidates of tests/fixtures checked across the boundary.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from typer.testing import CliRunner

import engine.cli as cli
from engine.spec import registry

ROOT = Path(__file__).resolve().parent.parent
SPEC = {"tapo": "tapo-trajectory", "mrtpo": "mrtpo"}

# (mutant, the metric whose failure names it, the arm it names)
BUGS = [
    ("tapo.method_grad_negated", "method_gain_low", "tapo"),
    ("tapo.method_grad_frozen", "method_gain_low", "tapo"),
    ("tapo.control_grad_negated", "control_gain_low", "grpo-control"),
    ("mrtpo.method_grad_negated", "method_gain_low", "mrtpo"),
    ("mrtpo.method_grad_frozen", "method_gain_low", "mrtpo"),
]


def _check(spec: str, tmp_path, *extra: str):
    return CliRunner().invoke(cli.app, ["check", spec, "--device", "cpu", "--seeds", "42", "--only", "learning",
                                        "--no-mutants", "--receipts", str(tmp_path), "--json", *extra])


def _result(out) -> dict:
    (run,) = json.loads(out.stdout)["runs"]
    (res,) = run["results"]
    return res


@pytest.mark.parametrize("mutant, metric, arm", BUGS, ids=[b[0] for b in BUGS])
def test_an_arm_that_does_not_learn_fails(mutant, metric, arm, tmp_path, monkeypatch):
    method = mutant.split(".")[0]
    reg = registry.load()
    monkeypatch.setitem(registry._REGISTRY.implementations, method, reg.mutants[mutant].factory())
    out = _check(SPEC[method], tmp_path)
    assert out.exit_code == 1, (mutant, out.output[-2000:])
    res = _result(out)
    assert res["contract"] == "learning" and res["status"] == "failed"
    assert metric in res["message"] and f"at arm {arm}: accuracy" in res["message"], res["message"]
    m = res["measurements"]
    role = metric.split("_")[0]
    if "frozen" in mutant:  # the same weights on the same prompts and stream: exactly no gain
        assert m[f"{role}_gain"] == 0.0 and m[f"{role}_final"] == m[f"{role}_initial"]
    else:
        assert m[f"{role}_gain"] < 0 and m[f"{role}_final"] < m[f"{role}_initial"]


def test_arms_trained_with_each_others_loss_fail_though_both_learn(tmp_path, monkeypatch):
    """The swap learns as well as the honest run (the gain and lag hold); the calls into the implementation under
    check, counted per arm, show the control running it."""
    reg = registry.load()
    monkeypatch.setitem(registry._REGISTRY.implementations, "tapo", reg.mutants["tapo.arms_swapped"].factory())
    out = _check("tapo-trajectory", tmp_path)
    assert out.exit_code == 1, out.output[-2000:]
    res = _result(out)
    assert res["status"] == "failed" and res["message"].startswith("control_arm_interface_calls "), res["message"]
    assert ";" not in res["message"].split("; first failing case")[0], res["message"]  # the only broken expectation
    m = res["measurements"]
    assert m["control_arm_interface_calls"] > 0 and m["method_arm_interface_calls"] > 0
    assert m["method_gain_low"] > 0.25 and m["control_gain_low"] > 0.25


@pytest.mark.parametrize("method", sorted(SPEC))
def test_the_honest_run_learns(method, tmp_path):
    out = _check(SPEC[method], tmp_path)
    assert out.exit_code == 0, out.output[-2000:]
    m = _result(out)["measurements"]
    assert m["arms"] == 2 and m["initial_differ"] == 0
    assert m["method_final"] > m["method_initial"] and m["control_final"] > m["control_initial"]
    assert m["method_gain_low"] <= m["method_gain"] and m["lag_high"] >= m["lag"]
    assert m["method_arm_interface_calls"] >= m["method_updates"] > 0 and m["control_arm_interface_calls"] == 0


@pytest.mark.parametrize("method, fixture", [("tapo", "my_tapo.py"), ("mrtpo", "my_mrtpo.py")])
def test_a_candidate_across_the_boundary_learns(method, fixture, tmp_path):
    out = _check(SPEC[method], tmp_path, "--impl", str(ROOT / "tests" / "fixtures" / fixture))
    assert out.exit_code == 0, out.output[-2000:]
    res = _result(out)
    assert res["status"] == "passed" and res["measurements"]["method_gain_low"] > 0


def test_the_kind_measures_what_the_run_left_not_what_it_says(monkeypatch):
    """A run that trains nothing and says nothing: the kind's own sampling finds no gain, the paired intervals
    collapse to 0, and both arms measured from the same seeded weights agree exactly."""
    import torch

    from engine.kinds import learning, paired_control
    from engine.run.context import CheckContext, Meter
    from methods.common import make_policy, paired
    from methods.common.rollout import sample
    from methods.common.tasks import TargetTokenTask

    def idle(impl, ctx):
        for arm in paired.arms(ctx, ("m", "c"), method="m"):
            policy = make_policy(ctx, hidden_size=8)
            g = paired.stream(ctx, impl, 5)
            sample(policy, TargetTokenTask().prompts(4, g), 4, g)

    monkeypatch.setitem(paired_control._RUNS, "test.idle", idle)
    ctx = CheckContext(device=torch.device("cpu"), dtype=torch.float32, seed=7, cases=1, params={},
                       meter=Meter(max_updates=0, max_tokens=10_000))
    m = learning.Learning().measure(None, ctx, {
        "run": "test.idle", "run_params": {}, "task": "target_token", "method_arm": "m", "control_arm": "c",
        "validation": {"prompts": 16, "samples": 2, "max_new_tokens": 4}})
    assert m["arms"] == 2 and m["method_updates"] == m["control_updates"] == 0
    assert m["method_gain"] == m["method_gain_low"] == 0.0 and m["lag"] == m["lag_high"] == 0.0
    assert m["initial_differ"] == 0.0 and 0.0 < m["method_initial"] < 1.0
    assert not any(isinstance(v, float) and math.isnan(v) for v in m.values())
