"""Fast-path contract: the fused TAPO loss (what the method runs) against the composed loss.

`tapo_loss` runs `_fused_tapo_loss`, a few-pass rewrite of the composed loss
(ratio -> clip schedule -> surrogate -> token mean), and falls back to the composed loss
when a ratio overflows. Both paths are driven on the same inputs, chosen so that every
branch of the fused path is taken: [B] and [B, T] advantages, per-response T and a
`horizon`, a response longer than the horizon (both must refuse it), one-token and
empty rows, a zero-advantage group whose only non-zero advantage sits on an empty row
(both must refuse it), and a ratio that overflows (the fallback). Loss, gradient and every
metric must agree; `*_cases` counts prove each branch was reached.
"""

from __future__ import annotations

import math

import torch

from engine.spec import registry
from methods.tapo import objective
from methods.tapo.checks import _dev, _dims, _draw

# Check code, not a mutation target: a contract driving the fused and the composed loss on the same
# inputs; both paths live in objective.py, which is mutated.
__mutate__ = False

_COMPOSED = objective.build_tapo_loss(fused=False)
METRICS = ("ratio_min", "ratio_max", "clip_fraction", "clip_active_fraction", "tokens", "eps_lo", "eps_hi")
# The metrics the spec's interface requires of any implementation; the others are compared when present.
REQUIRED_METRICS = ("tokens", "ratio_min", "ratio_max", "clip_fraction")


def _diff(a: torch.Tensor, b: torch.Tensor) -> float:
    """Largest |a - b| where NaN agrees only with NaN and inf only with the same inf."""
    a, b = a.detach().to("cpu", torch.float64), b.detach().to("cpu", torch.float64)
    same = (a == b) | (torch.isnan(a) & torch.isnan(b))
    gap = torch.where(same, torch.zeros_like(a), (a - b).abs())
    return float(torch.nan_to_num(gap, nan=math.inf).max()) if gap.numel() else 0.0


def _run(loss_fn, lp, op, adv, m, eps_min, eps_max, horizon, group_size):
    x = lp.clone().requires_grad_(True)
    try:
        loss, met = loss_fn(x, op, adv, m, eps_min, eps_max, horizon, group_size=group_size)
    except ValueError:  # the interface asks for a ValueError (the project's ZeroAdvantageError is one), not a class
        return None, None, None, "refused"
    (grad,) = torch.autograd.grad(loss, x)
    return loss.detach(), grad, met, None


def _case(g: torch.Generator, kind: int, max_len: int, max_batch: int):
    """(logp, old, adv, mask, horizon, group_size, overflow?) in float64 on the CPU for case kind 0..6."""
    B, L = _dims(g, max_len, max_batch)
    B = max(B, 2)
    logp, old, mask = _draw(g, B, L, delta_scale=0.6)
    lengths = mask.sum(dim=1)
    adv = torch.randn(B, generator=g, dtype=torch.float64)
    horizon, group_size = None, None
    if kind == 1:  # per-token advantages
        adv = torch.randn(B, L, generator=g, dtype=torch.float64)
    elif kind == 2:  # a horizon at or above the longest response
        horizon = int(lengths.max()) + int(torch.randint(0, 4, (1,), generator=g))
    elif kind == 3:  # a response longer than the horizon: both paths refuse it
        horizon = max(1, int(lengths.max()) - 1)
        if int(lengths.max()) == 1:
            mask[0, :2] = True
            horizon = 1
    elif kind == 4:  # a ratio that overflows the compute dtype: the fused path falls back
        b = int(torch.randint(0, B, (1,), generator=g))
        first = int(mask[b].nonzero()[0])
        old[b, first] = logp[b, first] - 1.0e4
    elif kind == 5:  # one-token rows and a row with no valid token (its advantage must not count)
        mask[0] = False
        mask[1] = False
        mask[1, int(torch.randint(0, L, (1,), generator=g))] = True
    elif kind == 6:  # the only non-zero advantage of a group sits on its empty row: refused
        mask[0] = False
        adv = torch.zeros(B, dtype=torch.float64)
        adv[0] = 1.0
    return logp, old, adv, mask, horizon, group_size, kind == 4


@registry.check("tapo.fused_matches_composed")
def fused_matches_composed(impl, ctx) -> dict:
    """impl.tapo_loss against the composed loss on inputs that select every branch of the fused path."""
    max_len = int(ctx.params.get("max_len", 24))
    max_batch = int(ctx.params.get("max_batch", 5))
    eps_min = float(ctx.params.get("eps_min", 0.1))
    eps_max = float(ctx.params.get("eps_max", 0.2))
    g = ctx.generator(10)
    loss_err = grad_err = metric_err = 0.0
    outcome_mismatch = 0
    counts = {"fallback_cases": 0, "horizon_cases": 0, "horizon_refused_cases": 0, "empty_row_refused_cases": 0,
              "token_adv_cases": 0, "cases": 0}
    kinds = 7
    for case in range(ctx.cases * kinds):
        kind = case % kinds
        logp, old, adv, mask, horizon, group_size, overflow = _case(g, kind, max_len, max_batch)
        lp, op, a, m = _dev(ctx, logp), _dev(ctx, old), _dev(ctx, adv), _dev(ctx, mask)
        fast = _run(impl.tapo_loss, lp, op, a, m, eps_min, eps_max, horizon, group_size)
        plain = _run(_COMPOSED, lp, op, a, m, eps_min, eps_max, horizon, group_size)
        counts["cases"] += 1
        if fast[3] != plain[3]:
            outcome_mismatch += 1
            continue
        if plain[3] is not None:
            counts["horizon_refused_cases" if kind == 3 else "empty_row_refused_cases"] += int(kind in (3, 6))
            continue
        if overflow:
            # the inputs must really take the fallback, or this case proves nothing about it
            fused = objective._fused_tapo_loss(lp, op, a, m, eps_min, eps_max, horizon, group_size)
            counts["fallback_cases"] += int(fused is None)
        counts["horizon_cases"] += int(kind == 2)
        counts["token_adv_cases"] += int(kind == 1)
        (l_f, g_f, met_f, _), (l_p, g_p, met_p, _) = fast, plain
        scale = max(float(g_p.detach().double().abs().nan_to_num(nan=0.0, posinf=0.0).max()), 1e-300)
        loss_err = max(loss_err, _diff(l_f, l_p) / max(abs(float(l_p)) if math.isfinite(float(l_p)) else 1.0, 1e-3))
        grad_err = max(grad_err, _diff(g_f, g_p) / scale)
        for key in METRICS:
            if key not in met_f:
                metric_err = math.inf if key in REQUIRED_METRICS else metric_err
                continue
            metric_err = max(metric_err, _diff(torch.tensor(float(met_f[key])), torch.tensor(float(met_p[key]))))
    return {"loss_max_rel_diff": loss_err, "grad_max_rel_diff": grad_err, "metric_max_abs_diff": metric_err,
            "outcome_mismatches": outcome_mismatch, **counts}
