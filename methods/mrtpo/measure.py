"""Small measuring helpers shared by the MRTPO checks (max |x| and a NaN-keeping max)."""

from __future__ import annotations

import math

import torch

# Check code: helpers of the checks; nothing of the method runs them.
__mutate__ = False  # `contracts mutate` does not plant bugs here

NAN = float("nan")


def worst(*values: float) -> float:
    """Largest value, NaN if any is NaN (Python's max would silently skip a NaN); 0 for none."""
    vals = [float(v) for v in values]
    if any(math.isnan(v) for v in vals):
        return NAN
    return max(vals) if vals else 0.0


def maxabs(x: torch.Tensor) -> float:
    """max |x| over all entries; NaN if any entry is NaN; 0 for an empty tensor."""
    if x.numel() == 0:
        return 0.0
    x = x.detach().double().abs()
    if bool(torch.isnan(x).any()):
        return NAN
    return float(x.max())


# What mrtpo_advantages's metrics dict declares (the interface), each compared with the supervisor's figure.
REPORTED = ("s", "std", "tokens", "second_moment_U", "second_moment_D", "capped")


def advantage_figures(reward_adv: torch.Tensor, weights: torch.Tensor, mask: torch.Tensor, eps: float) -> dict:
    """The quantities mrtpo_advantages reports about itself, computed here from the tensors it was given: U, D
    and the second moments by math.fsum in float64, the cap s and the std by the per-scalar decimal reference.
    A check judges these, never the metrics dict the call returned."""
    from methods.mrtpo.reference import mrtpo_advantages_ref

    rl = reward_adv.detach().double().cpu().tolist()
    wl = weights.detach().double().cpu().tolist()
    m = mask.detach().bool().cpu().tolist()
    K, B = len(rl), len(rl[0]) if rl else 0
    valid = [[t for t, v in enumerate(m[b]) if v] for b in range(B)]
    U = [math.fsum(rl[k][b] for k in range(K)) if valid[b] else 0.0 for b in range(B)]
    D = [math.fsum(rl[k][b] * wl[k][b][t] for k in range(K)) - U[b] for b in range(B) for t in valid[b]]
    mom_u = math.fsum(len(valid[b]) * U[b] ** 2 for b in range(B))
    mom_d = math.fsum(d * d for d in D)
    _, s, std = mrtpo_advantages_ref(rl, wl, m, eps)
    return {"s": s, "std": std, "tokens": sum(len(v) for v in valid), "second_moment_U": mom_u,
            "second_moment_D": mom_d, "capped": s < 1.0,
            # float64 may put a barely binding cap on either side of s = 1
            "capped_ambiguous": mom_d > 0 and abs(mom_u / mom_d - 1.0) <= 1e-9}


def report_advantages(ctx, updates) -> None:
    """Each update's reported metrics beside the supervisor's figures (the reported_metrics contract)."""
    from engine.run import run_audit

    audit = run_audit.of(ctx)
    eps = float(ctx.params.get("eps", 1e-6))
    for u in updates:
        fig = advantage_figures(u.reward_adv, u.weights, u.mask, eps)
        met = u.metrics if isinstance(u.metrics, dict) else {}
        for key in REPORTED:
            audit.report(arm="mrtpo", function="mrtpo_advantages", key=key, reported=met.get(key),
                         measured=float(fig[key]), update=u.index + 1,
                         slack=1.0 if key == "capped" and fig["capped_ambiguous"] else 0.0)
