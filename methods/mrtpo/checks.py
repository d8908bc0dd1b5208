"""MRTPO checks: each returns named measurements; the spec's `expect:` decides pass/fail.

Every check calls the method only through `impl`, so the engine can hand it a
mutant. Inputs are drawn on a seeded CPU generator in float64, cast to the
dtype under test and moved to the device; references are computed from the
cast values (so they measure the implementation's arithmetic, not input
rounding) with the per-scalar decimal code in reference.py.
"""

from __future__ import annotations

import math

import torch

from engine.spec import registry
from methods.mrtpo.cases import PAIR_KINDS, conserved_weights, credit_batch, logp_pair, response_mask, to_lists
from methods.mrtpo.mechanism_checks import PAGE_STUDENT_L2, measured_run
from methods.mrtpo.reference import gdpo_uniform_ref, mrtpo_advantages_ref
from methods.mrtpo.measure import NAN, maxabs as _maxabs, worst as _worst


def _scaled(x: torch.Tensor, ref: torch.Tensor) -> float:
    """max |x - ref| / max(1, max |ref|): absolute for O(1) advantages, relative for large ones
    (A = S~ / (std + eps) grows without bound as the batch std shrinks)."""
    x, ref = x.detach().double().cpu(), ref.detach().double().cpu()
    d = _maxabs(x - ref)
    return d / max(1.0, _maxabs(ref)) if not math.isnan(d) else NAN


def _on(ctx, t: torch.Tensor, dtype=None) -> torch.Tensor:
    return t.to(ctx.device, dtype or ctx.dtype)


def _randint(g, lo: int, hi: int) -> int:
    """Uniform integer in [lo, hi]."""
    return int(torch.randint(lo, hi + 1, (), generator=g))


def _rand(g) -> float:
    return float(torch.rand((), generator=g, dtype=torch.float64))


def _eps(ctx) -> float:
    return float(ctx.params.get("eps", 1e-6))


def _random_case(ctx, g, max_k=3, min_b=2, max_b=4, max_t=6, max_v=24):
    """A batch for credit_weights: float64 CPU tensors plus the draws that shaped it.

    At least two responses have valid tokens (min_b >= 2), so the batch std of
    the advantages is not the degenerate 0 of a single constant value, where
    A = S~ / eps magnifies any rounding of the std by 1/eps."""
    K, B, T, V = _randint(g, 1, max_k), _randint(g, min_b, max_b), _randint(g, 1, max_t), _randint(g, 2, max_v)
    logp_all, logp_loo = credit_batch(g, K, B, T, V)
    mask = response_mask(g, B, T)
    empty = torch.rand(K, B, generator=g) < 0.2
    if K > 1 and _rand(g) < 0.3:  # a reward whose block changes nothing: identical distributions
        k = _randint(g, 0, K - 1)
        logp_loo[k] = logp_all.clone()
    u = _rand(g)
    beta = 0.0 if u < 0.1 else (1.0 if u < 0.2 else _rand(g))
    return logp_all, logp_loo, mask, empty, beta


# --------------------------------------------------------------------------- JS distance


@registry.check("mrtpo.js_properties")
def js_properties(impl, ctx):
    """Symmetry, bounds [0, 1], 0 on identical inputs, 1 on disjoint supports, finite at near-zero probabilities."""
    g = ctx.generator(102)
    rows = int(ctx.params.get("rows", 4))
    sym = ident = disjoint_err = 0.0
    lo, hi = math.inf, -math.inf
    different_min = math.inf
    nonfinite = 0
    for i in range(max(ctx.cases, len(PAIR_KINDS))):
        kind = PAIR_KINDS[i % len(PAIR_KINDS)]
        a, b = logp_pair(g, rows, _randint(g, 2, 40), kind)
        a, b = _on(ctx, a), _on(ctx, b)
        qab, qba = impl.js_distance(a, b).double(), impl.js_distance(b, a).double()
        qaa = impl.js_distance(a, a.clone()).double()
        nonfinite += int((~torch.isfinite(qab)).sum() + (~torch.isfinite(qba)).sum() + (~torch.isfinite(qaa)).sum())
        sym = _worst(sym, _maxabs(qab - qba))
        ident = _worst(ident, _maxabs(qaa))
        both = torch.cat([qab, qba, qaa])
        if bool(torch.isfinite(both).all()):
            lo, hi = min(lo, float(both.min())), max(hi, float(both.max()))
        if kind == "disjoint":
            disjoint_err = _worst(disjoint_err, _maxabs(qab - 1.0))
        if kind == "random":
            different_min = min(different_min, float(qab.min()))
    # one-hot rows: identical -> 0, different -> 1, with -inf and -1e4 elsewhere
    V = 8
    for fill in (-math.inf, -1.0e4):
        a = torch.full((V, V), fill, dtype=torch.float64)
        a.fill_diagonal_(0.0)
        b = a.roll(1, dims=1)
        a, b = _on(ctx, a), _on(ctx, b)
        q_same, q_diff = impl.js_distance(a, a).double(), impl.js_distance(a, b).double()
        nonfinite += int((~torch.isfinite(q_same)).sum() + (~torch.isfinite(q_diff)).sum())
        ident = _worst(ident, _maxabs(q_same))
        disjoint_err = _worst(disjoint_err, _maxabs(q_diff - 1.0))
    return {
        "symmetry_max_abs": sym,
        "identical_max_q": ident,
        "disjoint_max_err": disjoint_err,
        "min_q": lo if math.isfinite(lo) else NAN,
        "max_q": hi if math.isfinite(hi) else NAN,
        "different_min_q": different_min if math.isfinite(different_min) else NAN,
        "nonfinite": nonfinite,
    }


# --------------------------------------------------------------------------- weights


@registry.check("mrtpo.credit_conservation")
def credit_conservation(impl, ctx):
    """Mean weight 1 per response and reward, so mean_t S_t = U; also after the cap, in the advantages."""
    g = ctx.generator(202)
    eps = _eps(ctx)
    w_err = s_err = a_err = 0.0
    pairs = 0
    for _ in range(ctx.cases):
        logp_all, logp_loo, mask, empty, beta = _random_case(ctx, g, max_b=6, max_t=8)
        if _rand(g) < 0.5:
            beta = 0.5 + 0.5 * _rand(g)  # make redistribution matter
        K, B = logp_loo.shape[:2]
        m = mask.to(ctx.device)
        w = impl.credit_weights(_on(ctx, logp_all), _on(ctx, logp_loo), m, beta, empty_block=empty.to(ctx.device))
        radv = torch.randn(K, B, generator=g, dtype=torch.float64)
        A, metrics = impl.mrtpo_advantages(_on(ctx, radv), w, m, eps)
        wl, Al = w.double().cpu().tolist(), A.double().cpu().tolist()
        ra = _on(ctx, radv).double().cpu().tolist()  # the advantages as the implementation saw them
        scale = metrics["std"] + eps
        for b in range(B):
            valid = [t for t in range(mask.shape[1]) if mask[b, t]]
            if not valid:
                continue
            U = math.fsum(ra[k][b] for k in range(K))
            for k in range(K):
                mean_w = math.fsum(wl[k][b][t] for t in valid) / len(valid)
                w_err = _worst(w_err, abs(mean_w - 1.0))
                pairs += 1
            mean_S = math.fsum(math.fsum(ra[k][b] * wl[k][b][t] for k in range(K)) for t in valid) / len(valid)
            s_err = _worst(s_err, abs(mean_S - U))
            mean_St = math.fsum(Al[b][t] * scale for t in valid) / len(valid)
            a_err = _worst(a_err, abs(mean_St - U))
    return {"max_mean_weight_err": w_err, "max_credit_err": s_err, "max_advantage_credit_err": a_err, "pairs": pairs}


@registry.check("mrtpo.uniform_fallback")
def uniform_fallback(impl, ctx):
    """Empty blocks (flagged or None) and identical distributions give w = 1; MRTPO then equals GDPO's uniform allocation."""
    g = ctx.generator(203)
    eps = _eps(ctx)
    dev_empty = dev_none = dev_ident = adv_err = s_dev = 0.0
    for _ in range(ctx.cases):
        logp_all, logp_loo, mask, _, beta = _random_case(ctx, g)
        beta = 0.3 + 0.7 * _rand(g)
        K, B, T = logp_loo.shape[:3]
        m = mask.to(ctx.device)
        a, l = _on(ctx, logp_all), _on(ctx, logp_loo)
        ident = _on(ctx, logp_all.expand(K, B, T, -1).clone())
        w_empty = impl.credit_weights(a, l, m, beta, empty_block=torch.ones(K, dtype=torch.bool, device=ctx.device))
        w_none = impl.credit_weights(a, [None] * K, m, beta)
        w_ident = impl.credit_weights(a, ident, m, beta)
        dev_empty = _worst(dev_empty, _maxabs((w_empty.double() - 1.0)[:, m]))
        dev_none = _worst(dev_none, _maxabs((w_none.double() - 1.0)[:, m]))
        dev_ident = _worst(dev_ident, _maxabs((w_ident.double() - 1.0)[:, m]))
        radv = _on(ctx, torch.randn(K, B, generator=g, dtype=torch.float64))
        ref = torch.tensor(gdpo_uniform_ref(radv.double().cpu().tolist(), mask.tolist(), eps), dtype=torch.float64)
        for w in (w_empty, w_ident):
            A, metrics = impl.mrtpo_advantages(radv, w, m, eps)
            adv_err = _worst(adv_err, _scaled(A, ref))
            s_dev = _worst(s_dev, abs(metrics["s"] - 1.0))
    return {
        "empty_max_dev": dev_empty,
        "none_max_dev": dev_none,
        "identical_max_dev": dev_ident,
        "gdpo_max_scaled_err": adv_err,
        "s_max_dev": s_dev,
    }


@registry.check("mrtpo.beta_zero")
def beta_zero(impl, ctx):
    """beta = 0 (the start of the warm-up) gives uniform weights and the GDPO allocation."""
    g = ctx.generator(204)
    eps = _eps(ctx)
    dev = adv_err = 0.0
    for _ in range(ctx.cases):
        logp_all, logp_loo, mask, empty, _ = _random_case(ctx, g)
        K, B = logp_loo.shape[:2]
        m = mask.to(ctx.device)
        w = impl.credit_weights(_on(ctx, logp_all), _on(ctx, logp_loo), m, 0.0, empty_block=empty.to(ctx.device))
        dev = _worst(dev, _maxabs((w.double() - 1.0)[:, m]))
        radv = _on(ctx, torch.randn(K, B, generator=g, dtype=torch.float64))
        ref = torch.tensor(gdpo_uniform_ref(radv.double().cpu().tolist(), mask.tolist(), eps), dtype=torch.float64)
        A, _ = impl.mrtpo_advantages(radv, w, m, eps)
        adv_err = _worst(adv_err, _scaled(A, ref))
    W, bmax = float(ctx.params.get("warmup_steps", 10)), float(ctx.params.get("beta_max", 0.7))
    return {"weights_max_dev": dev, "gdpo_max_scaled_err": adv_err, "schedule_start": impl.beta_schedule(0, W, bmax)}


# --------------------------------------------------------------------------- advantages


@registry.check("mrtpo.second_moment_cap")
def second_moment_cap(impl, ctx):
    """Appendix D: sum (s D)^2 <= sum T U^2; s = 1 when that already holds; equality when the cap binds."""
    g = ctx.generator(302)
    eps = _eps(ctx)
    excess = gap = nb_dev = out_excess = 0.0
    n_bind = n_free = flag_bad = 0
    for i in range(ctx.cases):
        K, B, T = _randint(g, 2, 3), _randint(g, 2, 6), _randint(g, 2, 8)
        mask = response_mask(g, B, T, allow_empty=False)
        bind = i % 2 == 0
        w = conserved_weights(g, K, B, T, mask, spread=3.0 if bind else 0.02)
        radv = torch.randn(K, B, generator=g, dtype=torch.float64)
        if bind:  # rewards that mostly cancel: small U, large redistribution
            radv[-1] = -radv[:-1].sum(0) + 0.05 * torch.randn(B, generator=g, dtype=torch.float64)
            if i % 4 == 0:  # the cap is scale-free: a tiny batch (sum D^2 far below 1) binds as well
                radv = radv * 1.0e-3
        else:  # rewards that agree: U dominates
            radv = radv.abs() + 1.0
        w_d, r_d = _on(ctx, w), _on(ctx, radv)
        A, metrics = impl.mrtpo_advantages(r_d, w_d, mask.to(ctx.device), eps)
        wl, rl = to_lists(w_d, r_d)
        # second moments from the inputs, independently, in float64 with fsum
        U = [math.fsum(rl[k][b] for k in range(K)) for b in range(B)]
        valid = [[t for t in range(T) if mask[b, t]] for b in range(B)]
        Dm = {(b, t): math.fsum(rl[k][b] * wl[k][b][t] for k in range(K)) - U[b] for b in range(B) for t in valid[b]}
        mom_u = math.fsum(len(valid[b]) * U[b] ** 2 for b in range(B))
        mom_d = math.fsum(d * d for d in Dm.values())
        s = metrics["s"]
        flag_bad += int(bool(metrics["capped"]) != (mom_d > mom_u))
        ratio = s * s * mom_d / mom_u  # capped second moment over the bound
        excess = _worst(excess, max(0.0, ratio - 1.0))
        if mom_d > mom_u:
            n_bind += 1
            gap = _worst(gap, abs(ratio - 1.0))
        else:
            n_free += 1
            nb_dev = _worst(nb_dev, abs(s - 1.0))
        # the same bound read off the output: S~ = A (std + eps), std from the reference
        _, _, ref_std = mrtpo_advantages_ref(rl, wl, mask.tolist(), eps)
        Al = A.double().cpu().tolist()
        out_mom = math.fsum((Al[b][t] * (ref_std + eps) - U[b]) ** 2 for (b, t) in Dm)
        out_excess = _worst(out_excess, max(0.0, out_mom / mom_u - 1.0))
    return {
        "cap_excess": excess,
        "output_cap_excess": out_excess,
        "binding_gap": gap,
        "nonbinding_s_dev": nb_dev,
        "binding_cases": n_bind,
        "nonbinding_cases": n_free,
        "capped_flag_mismatches": flag_bad,
    }


@registry.check("mrtpo.sign_symmetry")
def sign_symmetry(impl, ctx):
    """The same weights serve positive and negative advantages: A(-a) = -A(a); flipping one reward matches the reference."""
    g = ctx.generator(303)
    eps = _eps(ctx)
    odd = flip_err = 0.0
    for i in range(ctx.cases):
        K, B, T = _randint(g, 2, 3), _randint(g, 2, 6), _randint(g, 1, 8)
        mask = response_mask(g, B, T)
        w = _on(ctx, conserved_weights(g, K, B, T, mask, spread=1.0 + 2.0 * _rand(g)))
        radv = _on(ctx, torch.randn(K, B, generator=g, dtype=torch.float64))
        m = mask.to(ctx.device)
        A_pos, _ = impl.mrtpo_advantages(radv, w, m, eps)
        A_neg, _ = impl.mrtpo_advantages(-radv, w, m, eps)
        odd = _worst(odd, _maxabs(A_pos.double() + A_neg.double()))
        k = i % K
        flipped = radv.clone()
        flipped[k] = -flipped[k]
        A_f, _ = impl.mrtpo_advantages(flipped, w, m, eps)
        refA, _, _ = mrtpo_advantages_ref(*to_lists(flipped, w), mask.tolist(), eps)
        flip_err = _worst(flip_err, _scaled(A_f, torch.tensor(refA, dtype=torch.float64)))
    return {"odd_max_abs": odd, "flip_max_scaled_err": flip_err}


# --------------------------------------------------------------------------- padding, dtypes


def _junk_like(x: torch.Tensor, keep: torch.Tensor, g, values=(math.nan, 1.0e4, -1.0e4, math.inf, -math.inf)):
    """x with every slot where `keep` is False replaced by junk drawn from `values`."""
    pick = torch.randint(0, len(values), x.shape, generator=g)
    junk = torch.tensor(values, dtype=torch.float64)[pick]
    return torch.where(keep, x, junk)


@registry.check("mrtpo.padding_junk")
def padding_junk(impl, ctx):
    """NaN, +/-1e4 and +/-inf in padding slots (distributions, weights, advantages of empty responses) change nothing."""
    g = ctx.generator(401)
    eps = _eps(ctx)
    w_diff = a_diff = s_diff = pad_w = pad_a = 0.0
    for _ in range(ctx.cases):
        logp_all, logp_loo, mask, empty, beta = _random_case(ctx, g)
        beta = 0.3 + 0.7 * _rand(g)
        K, B, T, V = logp_loo.shape
        if B > 1:
            mask[-1] = False  # an all-padding response
        keep = mask[:, :, None].expand(B, T, V)
        j_all = _junk_like(logp_all, keep, g)
        j_loo = torch.stack([_junk_like(logp_loo[k], keep, g) for k in range(K)])
        m = mask.to(ctx.device)
        e = empty.to(ctx.device)
        radv = torch.randn(K, B, generator=g, dtype=torch.float64)
        j_radv = torch.where(mask.any(1)[None], radv, math.nan)  # a response without tokens has junk advantages
        w_clean = impl.credit_weights(_on(ctx, logp_all), _on(ctx, logp_loo), m, beta, empty_block=e)
        w_junk = impl.credit_weights(_on(ctx, j_all), _on(ctx, j_loo), m, beta, empty_block=e)
        w_diff = _worst(w_diff, _maxabs(w_clean.double() - w_junk.double()))
        pad_w = _worst(pad_w, _maxabs(w_junk.double()[:, ~m]))
        A_clean, mc = impl.mrtpo_advantages(_on(ctx, radv), w_clean, m, eps)
        w_pad_junk = _junk_like(w_clean.double().cpu(), mask[None].expand(K, B, T), g).to(ctx.device, w_clean.dtype)
        A_junk, mj = impl.mrtpo_advantages(_on(ctx, j_radv), w_pad_junk, m, eps)
        a_diff = _worst(a_diff, _maxabs(A_clean.double() - A_junk.double()))
        s_diff = _worst(s_diff, abs(mc["s"] - mj["s"]), abs(mc["std"] - mj["std"]))
        pad_a = _worst(pad_a, _maxabs(A_junk.double()[~m]))
    return {
        "weights_max_diff": w_diff,
        "advantages_max_diff": a_diff,
        "s_std_max_diff": s_diff,
        "padding_weight_max": pad_w,
        "padding_advantage_max": pad_a,
    }


@registry.check("mrtpo.dtype_agreement")
def dtype_agreement(impl, ctx):
    """The whole credit path in the dtype under test vs float64 on the same (rounded) inputs."""
    g = ctx.generator(501)
    eps = _eps(ctx)
    w_err = a_err = 0.0
    for _ in range(ctx.cases):
        logp_all, logp_loo, mask, empty, beta = _random_case(ctx, g, max_t=8, max_v=32)
        K, B = logp_loo.shape[:2]
        m, e = mask.to(ctx.device), empty.to(ctx.device)
        a, l = _on(ctx, logp_all), _on(ctx, logp_loo)
        radv = _on(ctx, torch.randn(K, B, generator=g, dtype=torch.float64))
        w_lo = impl.credit_weights(a, l, m, beta, empty_block=e)
        A_lo, _ = impl.mrtpo_advantages(radv, w_lo, m, eps)
        w_hi = impl.credit_weights(a.double(), l.double(), m, beta, empty_block=e)
        A_hi, _ = impl.mrtpo_advantages(radv.double(), w_hi, m, eps)
        w_err = _worst(w_err, _maxabs(w_lo.double() - w_hi))
        a_err = _worst(a_err, _scaled(A_lo, A_hi))
    return {"weights_max_abs_diff": w_err, "advantages_max_scaled_diff": a_err}


# --------------------------------------------------------------------------- mechanism


@registry.check("mrtpo.mechanism")
def mechanism_run(impl, ctx):
    """Real sampling, frozen replay with verifier blocks, real MRTPO updates of the student.

    The page's mean student L2 change is recorded beside this seed's, as a diagnostic comparison."""
    _, out = measured_run(impl, ctx)
    ctx.record_comparison(
        "page_student_l2_change", "mrtpo (this run)", "page 003 (A100 run)", [out["student_l2_change"]],
        [PAGE_STUDENT_L2], "student parameter L2 change over the seed's updates", formal=False,
        note="page: its own toy policy, optimiser and learning rate (not stated); here: TinyGRU hidden 16, "
             "Adam lr 1e-2 (spec assumption page_diagnostics)")
    return out
