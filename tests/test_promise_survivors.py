"""The held-out bugs that survived because they broke a promise the interface declared and no contract case tried,
each planted: `contracts check` of the method exits 1 naming the contract that now tries it and its failing case.

Each bug is a registered mutant (the spec names it and the contract that kills it) stood in for the registered
implementation, so the unmodified CLI checks it as it would the method; the control arm's wrapper is also patched
in its own module (methods/common/grpo.py), as a slip in that file would be.
"""

from __future__ import annotations

import json

import pytest
import torch
from typer.testing import CliRunner

import engine.cli as cli
from engine.spec import registry

# (method spec, implementation, mutant, the contract that must fail)
SURVIVORS = [
    ("grpo", "grpo", "grpo.adv_validates_masked_rewards", "advantages_masked_junk"),  # NaN reward of a masked row
    ("gspo", "gspo", "gspo.seq_adv_checked_on_empty_rows", "masked_junk_sequence"),  # NaN advantage, empty row
    ("grpo", "grpo", "grpo.kl_token_mean", "kl_reference"),  # KL after aggregation in seq-mean modes
    ("grpo", "grpo", "grpo.kl_in_input_dtype", "precision_agreement"),  # k3 in bf16
    ("grpo", "grpo", "grpo.ratio_max_over_padding", "loss_reference"),  # every valid ratio below 1
    ("gspo", "gspo", "gspo.ratio_no_clamp", "ratio_overflow_guard"),  # stand-alone sequence_ratio unclamped
    ("grpo", "grpo", "grpo.control_seq_mean", "control_loss_reference"),  # the control wrapper's seq-mean
    ("tar-adaptive-replay", "tar", "tar.kl_masked_after_sum", "kl_masked_junk"),  # found by coverage: NaN grads
]


def _check(spec: str, contract: str, tmp_path) -> dict:
    out = CliRunner().invoke(cli.app, ["check", spec, "--device", "cpu", "--seeds", "42", "--only", contract,
                                       "--no-mutants", "--receipts", str(tmp_path), "--json"])
    assert out.exit_code == 1, out.output[-2000:]
    (run,) = json.loads(out.stdout)["runs"]
    return run


@pytest.mark.parametrize("spec, impl, mutant, contract", SURVIVORS, ids=[s[2] for s in SURVIVORS])
def test_a_planted_survivor_fails_the_contract_that_now_tries_its_promise(spec, impl, mutant, contract, tmp_path,
                                                                          monkeypatch):
    reg = registry.load()
    entry = next(m for m in reg.mutants.values() if m.name == mutant)
    monkeypatch.setitem(registry._REGISTRY.implementations, impl, entry.factory())
    run = _check(spec, contract, tmp_path)
    failed = [r for r in run["results"] if r["status"] == "failed"]
    assert run["status"] == "failed" and failed and {r["contract"] for r in failed} == {contract}
    assert all("first failing case: seed 42 case" in r["message"] for r in failed), failed[0]["message"]


def test_the_control_wrappers_seq_mean_slip_in_its_own_file_fails_check_grpo(tmp_path, monkeypatch):
    """The survivor as it was written: methods/common/grpo.py passing the paper's seq-mean aggregation."""
    registry.load()
    from methods.common import grpo as control
    from methods.grpo.loss import grpo_loss

    def grpo_token_loss(logp, old_logp, advantages, mask, clip_eps: float = 0.2):
        return grpo_loss(logp, old_logp, advantages, mask, clip_low=clip_eps, clip_high=clip_eps,
                         agg="seq-mean-token-mean")

    monkeypatch.setattr(control, "grpo_token_loss", grpo_token_loss)
    run = _check("grpo", "control_loss_reference", tmp_path)
    (failed,) = {r["contract"] for r in run["results"] if r["status"] == "failed"}
    assert failed == "control_loss_reference"


def test_the_control_wrapper_is_what_grpo_binds_and_mutates():
    """Its receipts bind methods/common/grpo.py, and `contracts mutate grpo` plants in it (__mutate_also__)."""
    from pathlib import Path

    from engine.run.mutate.generate import declared_also

    root = Path(__file__).resolve().parents[1]
    assert declared_also(root / "methods" / "grpo" / "__init__.py") == ["methods.common.grpo"]
    impl = registry.load().get_implementation("grpo")
    assert impl.control_loss.__module__ == "methods.grpo.impl"  # the package's own: not all of methods/common
    logp = torch.tensor([[-1.0, -2.0, -0.5]], dtype=torch.float64)
    mask = torch.tensor([[True, True, False]])
    loss, _ = impl.control_loss(logp, logp - 0.1, torch.tensor([1.0], dtype=torch.float64), mask)
    from methods.common.grpo import grpo_token_loss

    assert torch.equal(loss, grpo_token_loss(logp, logp - 0.1, torch.tensor([1.0], dtype=torch.float64), mask)[0])
