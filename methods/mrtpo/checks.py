"""MRTPO's bespoke checks: each returns named measurements; the spec's `expect:` decides pass/fail.

The contracts a generic kind states (conservation, the JS properties, the uniform fallback and beta = 0 as
identities, sign symmetry, padding junk, precision) are measured by engine/kinds from the spec; what stays here
has a `why:` in the spec.

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
from methods.mrtpo.cases import conserved_weights, response_mask, to_lists
from methods.mrtpo.mechanism_checks import PAGE_STUDENT_L2, measured_run
from methods.mrtpo.reference import mrtpo_advantages_ref
from methods.mrtpo.measure import worst as _worst


def _on(ctx, t: torch.Tensor, dtype=None) -> torch.Tensor:
    return t.to(ctx.device, dtype or ctx.dtype)


def _randint(g, lo: int, hi: int) -> int:
    """Uniform integer in [lo, hi]."""
    return int(torch.randint(lo, hi + 1, (), generator=g))


def _eps(ctx) -> float:
    return float(ctx.params.get("eps", 1e-6))


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
