"""The control is an audited arm (engine/kinds/arm_audit.py): each survivor of the control-arm class, planted, fails
the method's `contracts check` naming arm_audit and the arm and update; so does a replay snapshot that is taken once
and never refreshed (what a mechanism records about itself is rescored from the policy's sampling-time weights).

Each bug is a registered mutant that the spec names with arm_audit as its killer; it is planted by standing it in for
the method's registered implementation, so the unmodified CLI checks it as it would the method.
"""

from __future__ import annotations

import json

import pytest
import torch
from typer.testing import CliRunner

import engine.cli as cli
from engine.spec import registry

SPEC = {"tapo": "tapo-trajectory", "mrtpo": "mrtpo", "tar": "tar-adaptive-replay"}

# (mutant, the metric whose failure names it, the arm it names)
BUGS = [
    ("tapo.control_clip_narrow", "loss_max_scaled_err", "grpo-control"),
    ("mrtpo.control_adv_whole_batch", "advantages_max_err", "grpo-control"),
    ("tar.control_adv_whole_batch", "advantages_max_err", "grpo-control"),
    ("mrtpo.control_never_moves", "frozen_updates", "grpo-control"),
    ("tar.control_never_moves", "frozen_updates", "grpo-control"),
    ("mrtpo.snapshot_taken_once", "claims_max_err", "mrtpo"),
]


def _check(spec: str, tmp_path, *extra: str):
    out = CliRunner().invoke(cli.app, ["check", spec, "--device", "cpu", "--seeds", "42", "--only", "arm_audit",
                                       "--no-mutants", "--receipts", str(tmp_path), "--json", *extra])
    return out


@pytest.mark.parametrize("mutant, metric, arm", BUGS, ids=[b[0] for b in BUGS])
def test_planted_control_bug_fails_arm_audit(mutant, metric, arm, tmp_path, monkeypatch):
    method = mutant.split(".")[0]
    reg = registry.load()
    monkeypatch.setitem(registry._REGISTRY.implementations, method, reg.mutants[mutant].factory())
    out = _check(SPEC[method], tmp_path)
    assert out.exit_code == 1, (mutant, out.output[-2000:])
    (run,) = json.loads(out.stdout)["runs"]
    (failed,) = [r for r in run["results"] if r["status"] == "failed"]
    assert failed["contract"] == "arm_audit"
    assert metric in failed["message"] and f"arm {arm}, update" in failed["message"], failed["message"]


@pytest.mark.parametrize("method", sorted(SPEC))
def test_each_arm_of_the_honest_run_passes(method, tmp_path):
    out = _check(SPEC[method], tmp_path)
    assert out.exit_code == 0, out.output[-2000:]


def test_the_arm_record_keeps_what_each_update_read_and_how_far_it_moved():
    """The record itself, on one TAPO seed: a loss record per optimiser step of each arm, each with a non-zero
    parameter change, Adam's learning rate, and the behaviour log-probs' claim matched to a kept sampling state."""
    from engine.kinds.paired_control import _fresh, get_run
    from engine.run.context import CheckContext

    reg = registry.load()
    ctx = CheckContext(device=torch.device("cpu"), dtype=torch.float32, seed=42, cases=1)
    run = _fresh(ctx, params={"groups": 1, "group_size": 4, "inner_updates": 2, "max_new_tokens": 8,
                              "validation_prompts": 1, "validation_samples": 1})
    run.__dict__["paired_keep_states"] = True
    get_run("tapo.mechanism")(reg.implementations["tapo"], run)
    for name, entry in run.__dict__["paired_record"].arms.items():
        assert entry.updates == len(entry.losses) == len(entry.changes) == 2, name
        assert all(c > 0 for c in entry.changes) and {o for o, _ in entry.optimisers} == {"Adam"}
        for rec in entry.losses:
            (claim,) = rec["claims"]
            own = entry.rescore(claim)
            assert own is not None and claim.name == "old_logp"
            assert float(torch.where(claim.mask, (own - claim.used.double()).abs(), 0.0).max()) < 1e-5
