"""GRPO and GSPO implementations against their float64 loop references, the family identities, and every
registered mutant told apart from the reference on a named input (verl's loss-test style: closed forms, junk in
masked slots, empty rows, each aggregation mode, gradients against the analytic ones)."""

from __future__ import annotations

import math

import pytest
import torch

from engine.spec import registry
from methods.grpo import reference as gref
from methods.grpo.loss import AGG_MODES, group_advantages, grpo_loss
from methods.gspo import reference as sref
from methods.gspo.loss import gspo_loss, sequence_ratio

REG = registry.load()


def batch(seed=0, B=6, L=12, drift=0.3, empty=True, holes=True, junk=True, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(B, L, generator=g, dtype=torch.float64) * 3
    logp = old + drift * torch.randn(B, L, generator=g, dtype=torch.float64)
    lengths = torch.randint(1, L + 1, (B,), generator=g)
    mask = torch.arange(L)[None] < lengths[:, None]
    if holes:
        mask[0, 1] = False
    if empty:
        mask[-1] = False
    if junk:
        for t in (logp, old):
            t[~mask] = float("nan")
            t[0, -1] = 1e4 if not mask[0, -1] else t[0, -1]
    adv = torch.randn(B, generator=g, dtype=torch.float64)
    return logp.to(dtype), old.to(dtype), adv.to(dtype), mask


def ref_lists(logp, old, adv, mask):
    lp = torch.nan_to_num(logp.double()).tolist()
    op = torch.nan_to_num(old.double()).tolist()
    a = (adv[:, None].expand_as(logp) if adv.dim() == 1 else adv).double().tolist()
    return lp, op, a, mask.tolist()


def compare(fn, ref, logp, old, adv, mask, **kw):
    x = logp.clone().requires_grad_(True)
    loss, met = fn(x, old, adv, mask, **kw)
    (grad,) = torch.autograd.grad(loss, x)
    want, wgrad, near, scale = ref(*ref_lists(logp, old, adv, mask))
    keep = ~torch.tensor(near)
    gerr = ((grad.double() - torch.tensor(wgrad, dtype=torch.float64)).abs() * keep).max().item()
    gscale = max(abs(v) for row in wgrad for v in row) or 1.0
    return abs(float(loss.detach()) - want) / max(scale, 1e-300), gerr / gscale, grad, met


@pytest.mark.parametrize("agg", AGG_MODES)
@pytest.mark.parametrize("dual", [None, 3.0])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_grpo_loss_matches_reference(agg, dual, seed):
    logp, old, adv, mask = batch(seed, drift=0.5)
    kw = dict(clip_low=0.2, clip_high=0.28, dual_clip=dual, agg=agg)
    lerr, gerr, grad, met = compare(grpo_loss, lambda *a: gref.loss_and_grad(*a, **kw), logp, old, adv, mask, **kw)
    assert lerr < 1e-12 and gerr < 1e-12
    assert bool((grad[~mask] == 0).all()) and bool(torch.isfinite(grad).all())
    assert met["tokens"] == int(mask.sum()) and met["clip_fraction"] > 0


def test_grpo_kl_and_clamp_match_reference():
    logp, old, adv, mask = batch(3, drift=0.5)
    ref = old + 0.2
    logp[0, 2] = old[0, 2] + 30.0  # the clamp binds
    kw = dict(clip_low=0.1, clip_high=0.3, beta=0.04, agg="token-mean")
    x = logp.clone().requires_grad_(True)
    loss, met = grpo_loss(x, old, adv, mask, ref_logp=ref, **kw)
    (grad,) = torch.autograd.grad(loss, x)
    lp, op, a, m = ref_lists(logp, old, adv, mask)
    want, wgrad, _, scale = gref.loss_and_grad(lp, op, a, m, ref=torch.nan_to_num(ref).tolist(), **kw)
    assert abs(float(loss.detach()) - want) <= 1e-12 * scale
    assert (grad - torch.tensor(wgrad, dtype=torch.float64)).abs().max().item() <= 1e-12 * max(map(abs, sum(wgrad, [])))
    assert met["clamped_tokens"] == 1 and met["kl"] > 0


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_grpo_low_precision_agrees(dtype):
    logp, old, adv, mask = batch(4, junk=False)
    lo = [t.to(dtype) for t in (logp, old, adv)]
    x = lo[0].clone().requires_grad_(True)
    loss, _ = grpo_loss(x, lo[1], lo[2], mask)
    (grad,) = torch.autograd.grad(loss, x)
    assert loss.dtype == torch.promote_types(dtype, torch.float32) and grad.dtype == dtype
    want, *_ = gref.loss_and_grad(*ref_lists(*[t.double() for t in lo], mask))
    assert abs(float(loss.detach()) - want) < 1e-5


def test_group_advantages_reference_and_edges():
    g = torch.Generator().manual_seed(0)
    r = torch.rand(12, generator=g, dtype=torch.float64)
    r[8:] = 0.7  # a flat group: exactly 0
    keep = torch.ones(12, dtype=torch.bool)
    keep[1] = False  # a fully masked response: out of its group's statistics
    got = group_advantages(r, 4, mask=keep)
    want = gref.group_advantages(r.tolist(), 4, 1e-6, keep.tolist())
    assert torch.allclose(got, torch.tensor(want, dtype=torch.float64), rtol=0, atol=1e-13)
    assert float(got[1]) == 0.0 and bool((got[8:] == 0).all())
    assert bool((group_advantages(torch.tensor([0.3]), 1) == 0).all())  # a group of one
    low = 1.0 + 1e-7 * torch.randn(8, generator=g, dtype=torch.float64)  # low variance (verl PR #6348)
    want = gref.group_advantages(low.float().double().tolist(), 8, 1e-6)
    assert max(abs(a - b) for a, b in zip(group_advantages(low.float(), 8).tolist(), want)) < 1e-5 * max(map(abs, want))
    for bad in (dict(group_size=5), dict(group_size=0), dict(group_size=True), dict(eps=-1.0)):
        with pytest.raises(ValueError):
            group_advantages(r, **{"group_size": 4, **bad})


@pytest.mark.parametrize("form", ["sequence", "token"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_gspo_loss_matches_reference(form, seed):
    logp, old, adv, mask = batch(seed, drift=2e-3)
    lerr, gerr, grad, met = compare(gspo_loss, lambda *a: sref.loss_and_grad(*a), logp, old, adv, mask, form=form)
    assert lerr < 1e-12 and gerr < 1e-12 and bool((grad[~mask] == 0).all())
    assert 0 < met["clip_fraction"] < 1 and met["rows"] == int(mask.any(-1).sum())
    s = sequence_ratio(logp, old, mask)
    want = sref.sequence_ratio(*[torch.nan_to_num(t).tolist() for t in (logp, old)], mask.tolist())
    assert (s - torch.tensor(want, dtype=torch.float64)).abs().max() < 1e-12 and float(s[-1]) == 1.0


def test_gspo_token_form_per_token_advantages():
    logp, old, _, mask = batch(5, drift=2e-3)
    adv = torch.randn(logp.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    lerr, gerr, *_ = compare(gspo_loss, lambda *a: sref.loss_and_grad(*a), logp, old, adv, mask, form="token")
    assert lerr < 1e-12 and gerr < 1e-12
    with pytest.raises(ValueError, match="form='token'"):
        gspo_loss(logp, old, adv, mask)


def test_family_identities():
    from methods.tapo.objective import trajectory_ratio

    logp, old, adv, mask = batch(6, drift=2e-3, junk=False, empty=False, holes=False)
    # GSPO's sequence ratio is TAPO's prefix ratio at each response's last valid token
    last = mask.sum(-1) - 1
    assert torch.equal(sequence_ratio(logp, old, mask), trajectory_ratio(logp, old, mask)[torch.arange(6), last])
    # GSPO equals GRPO (token mean) on one-token responses, value and gradient
    one = torch.zeros_like(mask)
    one[:, 0] = True
    x = logp.clone().requires_grad_(True)
    y = logp.clone().requires_grad_(True)
    a, _ = gspo_loss(x, old, adv, one)
    b, _ = grpo_loss(y, old, adv, one, clip_low=3e-4, clip_high=4e-4)
    (ga,), (gb,) = torch.autograd.grad(a, x), torch.autograd.grad(b, y)
    assert abs(float(a - b)) < 1e-15 and (ga - gb).abs().max() < 1e-15


def test_refusals():
    logp, old, adv, mask = batch(0)
    for kw in (dict(clip_low=1.0), dict(clip_high=-0.1), dict(dual_clip=1.0), dict(beta=0.1), dict(agg="mean"),
               dict(norm_length=0), dict(log_ratio_clamp=0.0)):
        with pytest.raises(ValueError):
            grpo_loss(logp, old, adv, mask, **kw)
    with pytest.raises(ValueError, match="mask"):
        grpo_loss(logp, old, adv, torch.zeros_like(mask))
    bad = adv.clone()
    bad[0] = math.nan
    with pytest.raises(ValueError, match="advantages"):
        grpo_loss(logp, old, bad, mask)
    with pytest.raises(ValueError, match="mask"):
        gspo_loss(logp, old, adv, torch.zeros_like(mask))
    with pytest.raises(ValueError):
        gspo_loss(logp, old, adv, mask, form="tokens")


# --- every mutant is told apart from the reference on an input that names its bug ----------------------------


def _grpo_case(name):
    """(kwargs, inputs) on which the mutant's loss or gradient departs from the reference."""
    logp, old, adv, mask = batch(1, drift=0.5)
    kw = dict(clip_low=0.1, clip_high=0.3, agg="token-mean")
    if name in ("grpo.dual_clip_positive",):
        kw["dual_clip"] = 1.5
    if name in ("grpo.empty_row_nan", "grpo.empty_rows_counted", "grpo.ignores_agg"):
        kw["agg"] = "seq-mean-token-mean"
    if name == "grpo.no_ratio_guard":
        logp[1, 0] = old[1, 0] + 200.0
        adv[1] = -1.0
    return kw, (logp, old, adv, mask)


# Mutants of argument checks and result dtypes: told apart by what they accept or return, not by a value.
GUARDS = {"grpo.clip_unchecked", "grpo.loss_in_input_dtype", "grpo.group_size_unchecked", "gspo.clip_unchecked",
          "gspo.loss_in_input_dtype"}


@pytest.mark.parametrize("name", sorted(GUARDS))
def test_guard_mutants_are_told_apart(name):
    impl = REG.get_mutant(name).factory()
    logp, old, adv, mask = batch(0, junk=False)
    fn = impl.grpo_loss if name.startswith("grpo.") else impl.gspo_loss
    if name.endswith("clip_unchecked"):
        fn(logp, old, adv, mask, clip_low=1.0)  # the method refuses it
    elif name.endswith("loss_in_input_dtype"):
        assert fn(logp.bfloat16(), old.bfloat16(), adv.bfloat16(), mask)[0].dtype == torch.bfloat16
    else:
        impl.group_advantages(adv, True)  # the method refuses a bool group size
        with pytest.raises(ValueError):
            group_advantages(adv, True)


# Mutants this file's small float64 batch cannot see: a count that wraps past 2^15 / 2^16 tokens (the scale tier), a
# refusal or a dtype the batch does not exercise, junk in masked rows, the shared sampler, the control arm's own
# loss and advantages. Each is judged by the engine itself: its spec's declared killers run on the registered
# implementation with only that mutant swapped in, and must kill it.
ENGINE_JUDGED = {
    "grpo.token_count_int16", "grpo.token_count_float16", "grpo.adv_row_index_uint16", "grpo.adv_validates_masked_rewards",
    "grpo.adv_mask_bool_only", "grpo.adv_checked_on_empty_rows", "grpo.kl_token_mean", "grpo.kl_in_input_dtype",
    "grpo.kl_mask_by_multiply", "grpo.ratio_max_over_padding", "grpo.clamp_fixed", "grpo.mask_fixed_eos",
    "grpo.behaviour_logprobs_in_input_dtype", "grpo.control_seq_mean", "grpo.control_clip_low_only",
    "grpo.control_adv_batch", "gspo.row_length_int16", "gspo.seq_adv_checked_on_empty_rows", "gspo.ratio_no_clamp",
    "gspo.clamp_fixed", "gspo.ratio_unchecked", "gspo.mask_bool_only", "gspo.ties_counted_outside",
}


@pytest.mark.parametrize("name", sorted(ENGINE_JUDGED))
def test_the_engine_kills_each_mutant_with_its_declared_killers(name):
    from pathlib import Path

    from engine.run.executors import execute
    from engine.run.runner import plan_run
    from engine.spec.loader import load_spec

    root = Path(__file__).resolve().parent.parent
    spec = load_spec(root / "specs" / f"{name.split('.')[0]}.yaml", root)
    (entry,) = [m for m in spec.data["mutants"] if m["mutant"] == name]
    plan = plan_run(spec, [int(spec.data["budget"]["seeds"][0])], list(entry["killed_by"]))
    plan.mutants = [m for m in plan.mutants if m["id"] == entry["id"]]
    (stmt,) = execute([plan], "cpu")
    (record,) = stmt["predicate"]["mutants"]
    assert record["killed"] and set(record["killed_by"]) <= set(entry["killed_by"]), record


@pytest.mark.parametrize("name", sorted(n for n, e in REG.mutants.items()
                                        if e.base == "grpo" and n not in GUARDS | ENGINE_JUDGED))
def test_grpo_mutants_are_told_apart(name):
    impl = REG.get_mutant(name).factory()
    if name == "grpo.mask_drops_eos":
        responses = torch.tensor([[5, 1, 0, 0], [3, 4, 6, 2]])
        assert impl.response_mask(responses, 1).tolist() != [[True, True, False, False], [True] * 4]
        return
    if name == "grpo.old_logp_not_detached":
        logp, old, adv, mask = batch(0, junk=False)
        old = old.clone().requires_grad_(True)
        (g,) = torch.autograd.grad(impl.grpo_loss(logp, old, adv, mask)[0], old)
        assert g.abs().max() > 0  # the method passes old_logp no gradient
        return
    if name == "grpo.sampler_unchecked":
        impl.response_mask(torch.tensor([[5.0, 1.0]]), 1)  # the method refuses float ids (TypeError)
        with pytest.raises(TypeError):
            REG.implementations["grpo"].response_mask(torch.tensor([[5.0, 1.0]]), 1)
        return
    if name == "grpo.behaviour_logprobs_at_t1":
        logits, tokens = torch.randn(2, 3, 5, generator=torch.Generator().manual_seed(0)), torch.tensor([[0, 1, 2]] * 2)
        want = torch.tensor(gref.behaviour_logprobs(logits.tolist(), tokens.tolist(), 0.7))
        assert (impl.behaviour_logprobs(logits, tokens, 0.7) - want).abs().max() > 1e-3
        return
    if "adv_" in name:
        g = torch.Generator().manual_seed(0)
        r = torch.rand(8, generator=g, dtype=torch.float64)
        r[4:] = 0.5 + 1e-4 * torch.rand(4, generator=g, dtype=torch.float64)
        keep = torch.ones(8, dtype=torch.bool)
        keep[0] = False
        got = impl.group_advantages(r.float(), 4, mask=keep).double()
        want = torch.tensor(gref.group_advantages(r.float().double().tolist(), 4, 1e-6, keep.tolist()))
        assert (got - want).abs().max() > 1e-3
        return
    kw, (logp, old, adv, mask) = _grpo_case(name)
    if name.startswith("grpo.kl_"):
        kw["beta"] = 0.0 if name == "grpo.kl_default_beta" else 0.1  # that mutant differs only at beta 0
        ref = old + 0.3
        x = logp.clone().requires_grad_(True)
        loss, _ = impl.grpo_loss(x, old, adv, mask, ref_logp=ref, **kw)
        lp, op, a, m = ref_lists(logp, old, adv, mask)
        want, *_ = gref.loss_and_grad(lp, op, a, m, ref=torch.nan_to_num(ref).tolist(), **kw)
        assert abs(float(loss.detach()) - want) > 1e-6
        return
    try:
        lerr, gerr, grad, _ = compare(impl.grpo_loss, lambda *a: gref.loss_and_grad(*a, **kw), logp, old, adv, mask,
                                      **kw)
    except RuntimeError:
        return  # the gradient does not exist at all (ratio_detached)
    assert not (lerr < 1e-9 and gerr < 1e-9 and bool(torch.isfinite(grad).all()))


@pytest.mark.parametrize("name", sorted(n for n, e in REG.mutants.items()
                                        if e.base == "gspo" and n not in GUARDS | ENGINE_JUDGED))
def test_gspo_mutants_are_told_apart(name):
    impl = REG.get_mutant(name).factory()
    logp, old, adv, mask = batch(2, drift=2e-3)
    form = "token" if name.startswith("gspo.token_") else "sequence"
    if name == "gspo.old_logp_not_detached":
        old = old.clone().requires_grad_(True)
        (g,) = torch.autograd.grad(impl.gspo_loss(logp, old, adv, mask)[0], old)
        assert g.abs().max() > 0  # the method passes old_logp no gradient
        return
    if name == "gspo.no_ratio_guard":
        logp[0, mask[0]] = old[0, mask[0]] + 100.0
        adv[0] = -1.0
    lerr, gerr, grad, _ = compare(impl.gspo_loss, lambda *a: sref.loss_and_grad(*a), logp, old, adv, mask, form=form)
    assert not (lerr < 1e-9 and gerr < 1e-9 and bool(torch.isfinite(grad).all()))


def test_sampler_mask_and_behaviour_logprobs_at_the_sampling_temperature():
    """The shared sampler's rollout: the mask ends at the first EOS inclusive; the behaviour log-probs equal a
    re-scoring of the sampled tokens by the sampling policy at the sampling temperature (not at 1)."""
    from methods.common import TinyGRUPolicy, sample, sequence_logprobs
    from methods.common.tasks import EOS

    policy = TinyGRUPolicy.seeded(3)
    ro = sample(policy, torch.full((16, 3), 4), 10, torch.Generator().manual_seed(5), temperature=0.7)
    for row, mrow in zip(ro.responses.tolist(), ro.mask.tolist()):
        end = row.index(EOS) + 1 if EOS in row else len(row)
        assert mrow == [True] * end + [False] * (len(row) - end)
    assert (ro.responses == EOS).any() and ro.mask.all(dim=1).any()  # both kinds of rows occur
    at = {t: sequence_logprobs(policy, ro.prompts, ro.responses, temperature=t)[0] for t in (0.7, 1.0)}
    assert torch.where(ro.mask, at[0.7] - ro.old_logp, 0.0).abs().max() < 1e-5
    assert torch.where(ro.mask, at[1.0] - ro.old_logp, 0.0).abs().max() > 1e-2

