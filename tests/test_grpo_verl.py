"""verl's `vanilla` and `gspo` policy losses through the GRPO / GSPO adapters, against the float64 loop references:
where verl keeps the paper's math (every aggregation mode, the dual clip, the KL as its actor adds it) and where it
departs (NaN in masked slots, its +1e-8 denominators, the fixed clamps). Skips without the [verl] extra, except in
CI, where a missing verl is a failure (as tests/test_verl.py)."""

from __future__ import annotations

import os

import pytest
import torch

from engine.spec import registry
from methods.grpo import reference as gref
from methods.gspo import reference as sref
from tests.test_grpo import batch, compare, ref_lists


def _verl(name):
    try:
        from verl.trainer.ppo import core_algos
    except Exception as exc:  # noqa: BLE001 - any failure to import is "no usable verl here"
        if os.environ.get("CI"):
            pytest.fail(f"CI must run the verl tests: verl does not import ({type(exc).__name__}: {exc})")
        pytest.skip(f"verl is not importable ({type(exc).__name__}); install it with pip install -e '.[verl]'")
    return core_algos.POLICY_LOSS_REGISTRY[name]


def adapted(method, loss):
    return registry.load().get_adapter("verl", method)(_verl(loss)).implementation(f"verl:{loss}")


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
@pytest.mark.parametrize("dual", [None, 3.0])
def test_vanilla_is_grpo_up_to_its_guards(agg, dual):
    impl = adapted("grpo", "vanilla")
    logp, old, adv, mask = batch(0, drift=0.5, junk=False)
    kw = dict(clip_low=0.2, clip_high=0.28, dual_clip=dual, agg=agg)
    lerr, gerr, grad, met = compare(impl.grpo_loss, lambda *a: gref.loss_and_grad(*a, **kw), logp, old, adv, mask,
                                    **kw)
    # seq-mean-token-mean divides each row by (count + 1e-8): about 1e-9 relative, the only departure
    tol = 1e-8 if agg == "seq-mean-token-mean" else 1e-12
    assert lerr < tol and gerr < tol
    assert met["tokens"] == int(mask.sum())


def test_vanilla_kl_is_verls_actor_composition():
    impl = adapted("grpo", "vanilla")
    logp, old, adv, mask = batch(1, drift=0.3, junk=False)
    ref = old + 0.2
    kw = dict(clip_low=0.2, clip_high=0.2, beta=0.05)
    x = logp.clone().requires_grad_(True)
    loss, _ = impl.grpo_loss(x, old, adv, mask, ref_logp=ref, **kw)
    lp, op, a, m = ref_lists(logp, old, adv, mask)
    want, _, _, scale = gref.loss_and_grad(lp, op, a, m, ref=ref.tolist(), **kw)
    assert abs(float(loss.detach()) - want) <= 1e-12 * scale


def test_vanilla_nan_junk_in_sequence_modes():
    """verl's seq-mean modes sum loss_mat * mask: NaN in a masked slot of log_prob gives a NaN loss; token-mean
    filters it with torch.where first (verl_F.masked_sum)."""
    impl = adapted("grpo", "vanilla")
    logp, old, adv, mask = batch(2, drift=0.3)  # NaN in masked slots
    assert torch.isfinite(impl.grpo_loss(logp, old, adv, mask, agg="token-mean")[0])
    assert torch.isnan(impl.grpo_loss(logp, old, adv, mask, agg="seq-mean-token-mean")[0])


def test_vanilla_clamp_not_settable():
    impl = adapted("grpo", "vanilla")
    logp, old, adv, mask = batch(0, junk=False)
    with pytest.raises(registry.NotProvided):
        impl.grpo_loss(logp, old, adv, mask, log_ratio_clamp=10.0)
    with pytest.raises(registry.NotProvided):
        impl.group_advantages(adv, 2)


@pytest.mark.parametrize("form", ["sequence", "token"])
def test_verl_gspo_is_gspo_up_to_its_guards(form):
    impl = adapted("gspo", "gspo")
    logp, old, adv, mask = batch(3, drift=2e-3, junk=False)
    lerr, gerr, grad, met = compare(impl.gspo_loss, lambda *a: sref.loss_and_grad(*a), logp, old, adv, mask,
                                    form=form)
    assert lerr < 1e-8 and gerr < 1e-8 and bool((grad[~mask] == 0).all())
    logp, old, adv, mask = batch(3, drift=2e-3)  # NaN in masked slots: NaN * 0 in verl's sequence mean
    assert torch.isnan(impl.gspo_loss(logp, old, adv, mask)[0])


def test_benchmark_rows_run_beside_verl():
    _verl("vanilla")
    from benchmarks import family_loss

    rows = family_loss.run("cpu", repeats=1, batch=2, length=256, memory=False)
    assert [r.name for r in rows] == ["GRPO control loss fwd+bwd", "GSPO loss fwd+bwd"]
    for r in rows:
        assert r.value > 0 and r.ok in (True, False)
        assert r.details["loss_abs_diff"] < 1e-6  # the same loss as verl's on these inputs


def _trl():
    try:
        from trl.trainer.grpo_trainer import GRPOTrainer
    except Exception as exc:  # noqa: BLE001 - any failure to import is "no usable trl here"
        if os.environ.get("CI"):
            pytest.fail(f"CI must run the trl tests: trl does not import ({type(exc).__name__}: {exc})")
        pytest.skip(f"trl is not importable ({type(exc).__name__}); install it with pip install -e '.[trl]'")
    return GRPOTrainer


def trl_adapted(method):
    return registry.load().get_adapter("trl", method)(_trl()).implementation("trl:GRPOTrainer")


def test_trl_bnpo_is_the_token_mean_and_grpo_counts_empty_rows():
    impl = trl_adapted("grpo")
    logp, old, adv, mask = batch(0, drift=0.5, junk=False, empty=False)
    kw = dict(clip_low=0.2, clip_high=0.28)
    lerr, gerr, *_ = compare(impl.grpo_loss, lambda *a: gref.loss_and_grad(*a, **kw), logp, old, adv, mask, **kw)
    assert lerr < 1e-12 and gerr < 1e-12
    kw["agg"] = "seq-mean-token-mean"
    lerr, gerr, *_ = compare(impl.grpo_loss, lambda *a: gref.loss_and_grad(*a, **kw), logp, old, adv, mask, **kw)
    assert lerr < 1e-12 and gerr < 1e-12  # no empty row: TRL's grpo is the paper's mean
    logp, old, adv, mask = batch(0, drift=0.5, junk=False, empty=True)
    lerr, gerr, *_ = compare(impl.grpo_loss, lambda *a: gref.loss_and_grad(*a, **kw), logp, old, adv, mask, **kw)
    assert lerr > 1e-6  # its .mean() over responses counts the empty one
    with pytest.raises(registry.NotProvided):
        impl.grpo_loss(logp, old, adv, mask, dual_clip=2.0)


def test_trl_sequence_level_is_gspo():
    impl = trl_adapted("gspo")
    logp, old, adv, mask = batch(3, drift=2e-3, junk=False, empty=False)
    lerr, gerr, *_ = compare(impl.gspo_loss, lambda *a: sref.loss_and_grad(*a), logp, old, adv, mask)
    assert lerr < 1e-12 and gerr < 1e-12
