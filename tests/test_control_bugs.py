"""Each bug a reviewer plants in the GRPO control, its pairing or the shared sampler makes `contracts check` of the
method concerned exit 1, naming the failed contract and its case.

Each bug is a registered mutant (the spec names it and the contract that kills it); it is planted by standing it in
for the method's registered implementation, so the unmodified CLI checks it as it would the method.
"""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

import engine.cli as cli
from engine.spec import registry

# (method spec, implementation name, mutant, the contract that must fail)
BUGS = [
    ("grpo", "grpo", "grpo.clip_no_upper", "loss_reference"),
    ("grpo", "grpo", "grpo.per_response_mean", "loss_reference"),
    ("grpo", "grpo", "grpo.adv_not_std_normalised", "advantages_reference"),
    ("grpo", "grpo", "grpo.adv_batch_normalised", "advantages_reference"),
    ("grpo", "grpo", "grpo.mask_drops_eos", "sampler_mask"),
    ("grpo", "grpo", "grpo.behaviour_logprobs_at_t1", "behaviour_logprobs_temperature"),
    ("tar-adaptive-replay", "tar", "tar.replay_whole_bank", "mechanism_run"),
    *[(spec, impl, f"{impl}.{defect}", "paired_control")
      for spec, impl in (("tapo-trajectory", "tapo"), ("mrtpo", "mrtpo"), ("tar-adaptive-replay", "tar"))
      for defect in ("control_trained_weights", "control_other_stream", "same_stream_every_seed")],
]

# The metric each mechanism run's failure must name.
MECHANISM_METRIC = {"mechanism_run": "replay_selection_mismatch_steps"}


@pytest.mark.parametrize("spec, impl, mutant, contract", BUGS, ids=[b[2] for b in BUGS])
def test_planted_bug_fails_check(spec, impl, mutant, contract, tmp_path, monkeypatch):
    reg = registry.load()
    entry = next(m for m in reg.mutants.values() if m.name == mutant)
    monkeypatch.setitem(registry._REGISTRY.implementations, impl, entry.factory())
    out = CliRunner().invoke(cli.app, ["check", spec, "--device", "cpu", "--seeds", "42", "--only", contract,
                                       "--no-mutants", "--receipts", str(tmp_path), "--json"])
    assert out.exit_code == 1, (mutant, out.output[-2000:])
    (run,) = json.loads(out.stdout)["runs"]
    failed = [r for r in run["results"] if r["status"] == "failed"]
    assert run["status"] == "failed" and failed and {r["contract"] for r in failed} == {contract}
    # A kind names its failing case; a mechanism run (one training run per seed, no cases) names its metric.
    said = MECHANISM_METRIC.get(contract, "first failing case: seed 42 case")
    assert all(said in r["message"] for r in failed), failed[0]["message"]


def test_unplanted_control_passes(tmp_path):
    out = CliRunner().invoke(cli.app, ["check", "tapo-trajectory", "--device", "cpu", "--seeds", "42", "--only",
                                       "paired_control", "--no-mutants", "--receipts", str(tmp_path), "--json"])
    assert out.exit_code == 0, out.output[-2000:]


# The arm swap: the method arm runs the control and the control arm the method. Each arm is still seeded, streamed
# and stepped alike, so only the record of which arm called the implementation under check tells them apart.
SWAPS = [("tar-adaptive-replay", "tar.mechanism", "methods.tar.mechanism", "run", ("tar", "grpo-control")),
         ("mrtpo", "mrtpo.mechanism", "methods.mrtpo.mechanism", "trace", ("mrtpo", "grpo-control"))]


@pytest.mark.parametrize("spec, run_name, module, method_fn, arms", SWAPS, ids=[s[0] for s in SWAPS])
def test_swapped_arms_fail_paired_control(spec, run_name, module, method_fn, arms, tmp_path, monkeypatch):
    import importlib

    from engine.kinds import paired_control as pc
    from methods.common import paired

    registry.load()
    mod = importlib.import_module(module)

    def swapped(impl, ctx):
        for arm in paired.arms(ctx, arms, method=arms[0]):
            (mod.grpo_control if arm == arms[0] else getattr(mod, method_fn))(impl, ctx)

    monkeypatch.setitem(pc._RUNS, run_name, swapped)
    out = CliRunner().invoke(cli.app, ["check", spec, "--device", "cpu", "--seeds", "42", "--only", "paired_control",
                                       "--no-mutants", "--receipts", str(tmp_path), "--json"])
    assert out.exit_code == 1, out.output[-2000:]
    (run,) = json.loads(out.stdout)["runs"]
    (failed,) = [r for r in run["results"] if r["status"] == "failed"]
    assert "method_arm_interface_calls 0 < limit 1" in failed["message"]
    assert "control_arm_interface_calls" in failed["message"]
