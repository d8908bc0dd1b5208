"""Fast-path contract: the fused TAPO loss (what the method runs) against the composed loss.

`tapo_loss` runs `_fused_tapo_loss`, a few-pass rewrite of the composed loss
(ratio -> clip schedule -> surrogate -> token mean), and falls back to the composed loss
when a ratio overflows. Both paths are driven on the same inputs, chosen so that every
branch of the fused path is taken: [B] and [B, T] advantages, per-response T and a
`horizon` (one equal to the longest response), a response longer than the horizon (both
must refuse it), one-, two- and three-token and empty rows, a zero-advantage group whose
only non-zero advantage sits on an empty row (both must refuse it), groups of a
`group_size` (all with signal, or one without), per-token advantages with exact zeros,
ratios exactly on a zero-width clip bound, an empty row beside 10-token rows (whose eps_1
rounds below eps_max in float32), and a ratio that overflows on a row of either advantage
sign (the fallback). Loss, gradient and every metric must agree, with the fused loss asked
for explicitly too (eps_lo / eps_hi bit for bit); advantages that require grad get no
gradient; the metrics' names are the same on every call; and every case without an overflow
runs the fused path itself (no silent fallback). `*_cases` counts prove each branch was
reached.
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
_FUSED = objective.build_tapo_loss(fused=True)  # the fused path asked for explicitly: the same as the default
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
    """(loss, grad, metrics, refused?, the advantages' gradient is not zero?)"""
    x = lp.clone().requires_grad_(True)
    a = adv.clone().requires_grad_(True)  # advantages are constants of the loss: any gradient to them is a leak
    try:
        loss, met = loss_fn(x, op, a, m, eps_min, eps_max, horizon, group_size=group_size)
    except ValueError:  # the interface asks for a ValueError (the project's ZeroAdvantageError is one), not a class
        return None, None, None, "refused", False
    grad, g_adv = torch.autograd.grad(loss, [x, a], allow_unused=True)
    leak = g_adv is not None and bool((g_adv != 0).any())
    return loss.detach(), grad, met, None, leak


KINDS = 15


def _case(g: torch.Generator, kind: int, rep: int, max_len: int, max_batch: int):
    """(logp, old, adv, mask, horizon, group_size, overflow?, eps override) in float64 on the CPU, kind 0..14;
    `rep` counts the cases of this kind so far."""
    B, L = _dims(g, max_len, max_batch)
    B = max(B, 2)
    if kind in (7, 8, 9):  # groups of 2 rows; an odd L for kind 7, an even one for kind 9
        B = 2 * max(2, B // 2)
        L = max(3, L) | 1 if kind == 7 else 2 * max(2, L // 2)
    logp, old, mask = _draw(g, B, L, delta_scale=0.6)
    lengths = mask.sum(dim=1)
    adv = torch.randn(B, generator=g, dtype=torch.float64)
    horizon, group_size, eps = None, None, None
    if kind == 1:  # per-token advantages
        adv = torch.randn(B, L, generator=g, dtype=torch.float64)
    elif kind == 2:  # a horizon exactly the longest response (every other case of this kind: above it)
        horizon = int(lengths.max()) + (int(torch.randint(1, 4, (1,), generator=g)) if rep % 2 else 0)
    elif kind == 3:  # a response longer than the horizon: both paths refuse it
        horizon = max(1, int(lengths.max()) - 1)
        if int(lengths.max()) == 1:
            mask[0, :2] = True
            horizon = 1
    elif kind in (4, 12):  # a ratio that overflows the compute dtype on a row with A > 0 (kind 4) or A < 0 (12)
        b = int(torch.randint(0, B, (1,), generator=g))
        first = int(mask[b].nonzero()[0])
        old[b, first] = logp[b, first] - 1.0e4
        adv[b] = adv[b].abs() + 0.1 if kind == 4 else -adv[b].abs() - 0.1
    elif kind == 5:  # one-token rows and a row with no valid token (its advantage must not count)
        mask[0] = False
        mask[1] = False
        mask[1, int(torch.randint(0, L, (1,), generator=g))] = True
    elif kind == 6:  # the only non-zero advantage of a group sits on its empty row: refused
        mask[0] = False
        adv = torch.zeros(B, dtype=torch.float64)
        adv[0] = 1.0
    elif kind == 7:  # groups of 2, every group with signal, per-token |A| < 1 and an odd L: accepted
        group_size = 2
        adv = 0.9 * torch.tanh(torch.randn(B, L, generator=g, dtype=torch.float64))
    elif kind == 8:  # groups of 2, [B] advantages, the second group all zero: refused
        group_size = 2
        adv[2:4] = 0.0
    elif kind == 9:  # groups of 2, per-token advantages, the second group all zero, an even L: refused
        group_size = 2
        adv = torch.randn(B, L, generator=g, dtype=torch.float64)
        adv[2:4] = 0.0
    elif kind == 10:  # rows of exactly 1, 2 and 3 valid tokens (the T = 1 / T = 2 edges of the schedule)
        L = max(L, 4)
        logp, old, _ = _draw(g, B, L, delta_scale=0.6)
        mask = torch.zeros(B, L, dtype=torch.bool)
        for b in range(B):
            mask[b, L - 1 - b % 3:] = True
    elif kind == 11:  # per-token advantages with exact zeros, ratios wide enough to clip
        logp, old, mask = _draw(g, B, L, delta_scale=1.2)
        adv = torch.randn(B, L, generator=g, dtype=torch.float64)
        adv = torch.where(torch.rand(B, L, generator=g) < 0.4, torch.zeros_like(adv), adv)
        b, t = mask.nonzero()[0].tolist()
        adv[b, t] = 1.0  # the group keeps a signal
    elif kind == 13:  # on-policy with eps_min = eps_max = 0: every ratio lies exactly on its (zero-width) bounds
        old = logp.clone()
        eps = (0.0, 0.0)
    elif kind == 14:  # an empty row beside rows of 10 tokens, whose eps_1 rounds below eps_max in float32: the
        L = max(L, 12)  # empty row must not enter eps_lo / eps_hi
        logp, old, _ = _draw(g, B, L, delta_scale=0.6)
        mask = torch.zeros(B, L, dtype=torch.bool)
        mask[1:, L - 10:] = True
    return logp, old, adv, mask, horizon, group_size, kind in (4, 12), eps


@registry.check("tapo.fused_matches_composed")
def fused_matches_composed(impl, ctx) -> dict:
    """impl.tapo_loss against the composed loss on inputs that select every branch of the fused path."""
    max_len = int(ctx.params.get("max_len", 24))
    max_batch = int(ctx.params.get("max_batch", 5))
    eps_min = float(ctx.params.get("eps_min", 0.1))
    eps_max = float(ctx.params.get("eps_max", 0.2))
    g = ctx.generator(10)
    loss_err = grad_err = metric_err = eps_err = 0.0
    outcome_mismatch = adv_grad_leaks = unexpected_fallbacks = 0
    keys = None
    key_mismatch = 0
    counts = {"fallback_cases": 0, "horizon_cases": 0, "horizon_refused_cases": 0, "empty_row_refused_cases": 0,
              "group_refused_cases": 0, "group_cases": 0, "token_adv_cases": 0, "fused_cases": 0, "cases": 0}
    for case in range(ctx.cases * KINDS):
        kind = case % KINDS
        logp, old, adv, mask, horizon, group_size, overflow, eps = _case(g, kind, case // KINDS, max_len, max_batch)
        lo, hi = eps or (eps_min, eps_max)
        lp, op, a, m = _dev(ctx, logp), _dev(ctx, old), _dev(ctx, adv), _dev(ctx, mask)
        fast = _run(impl.tapo_loss, lp, op, a, m, lo, hi, horizon, group_size)
        plain = _run(_COMPOSED, lp, op, a, m, lo, hi, horizon, group_size)
        forced = _run(_FUSED, lp, op, a, m, lo, hi, horizon, group_size)
        counts["cases"] += 1
        if not fast[3] == plain[3] == forced[3]:
            outcome_mismatch += 1
            continue
        if plain[3] is not None:
            counts["horizon_refused_cases"] += int(kind == 3)
            counts["empty_row_refused_cases"] += int(kind == 6)
            counts["group_refused_cases"] += int(kind in (8, 9))
            continue
        adv_grad_leaks += int(fast[4]) + int(plain[4]) + int(forced[4])
        # the project's fused path itself: it must take the fallback on an overflow, and only then
        fused = objective._fused_tapo_loss(lp, op, a, m, lo, hi, horizon, group_size)
        if overflow:  # the inputs must really take the fallback, or this case proves nothing about it
            counts["fallback_cases"] += int(fused is None)
        else:
            unexpected_fallbacks += int(fused is None)
            counts["fused_cases"] += int(fused is not None)
        counts["horizon_cases"] += int(horizon is not None)
        counts["token_adv_cases"] += int(a.dim() == 2)
        counts["group_cases"] += int(group_size is not None)
        l_p, g_p, met_p, *_ = plain
        if keys is None:
            keys = set(fast[2])
        key_mismatch += int(set(fast[2]) != keys)  # one implementation, one set of metric names, on every path
        scale = max(float(g_p.detach().double().abs().nan_to_num(nan=0.0, posinf=0.0).max()), 1e-300)
        worst = (0.0, None)  # this case's largest metric gap and the metric it is in: a failure names it
        for path, (l_f, g_f, met_f, *_) in (("tapo_loss", fast), ("forced fused path", forced)):
            loss_err = max(loss_err, _diff(l_f, l_p) / max(abs(float(l_p)) if math.isfinite(float(l_p)) else 1.0, 1e-3))
            grad_err = max(grad_err, _diff(g_f, g_p) / scale)
            for key in METRICS:
                if key not in met_f:
                    metric_err = math.inf if key in REQUIRED_METRICS else metric_err
                    if key in REQUIRED_METRICS:
                        worst = (math.inf, f"{key} missing from {path}'s metrics")
                    continue
                gap = _diff(torch.tensor(float(met_f[key])), torch.tensor(float(met_p[key])))
                metric_err = max(metric_err, gap)
                if gap > worst[0]:
                    worst = (gap, f"metrics[{key!r}] of {path} vs the composed loss")
                if key in ("eps_lo", "eps_hi"):  # the same float operations on both paths: bit for bit
                    eps_err = max(eps_err, gap)
        if worst[1] is not None:
            ctx.case_log.append({"seed": ctx.seed, "case": case, "metrics": {"metric_max_abs_diff": worst[0]},
                                 "where": {"metric_max_abs_diff": worst[1]}, "argument": f"input kind {kind}"})
    return {"loss_max_rel_diff": loss_err, "grad_max_rel_diff": grad_err, "metric_max_abs_diff": metric_err,
            "eps_metric_max_abs_diff": eps_err, "outcome_mismatches": outcome_mismatch, "adv_grad_leaks": adv_grad_leaks,
            "unexpected_fallbacks": unexpected_fallbacks, "metric_name_mismatches": key_mismatch, **counts}
