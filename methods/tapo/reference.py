"""Independent float64 references for the TAPO checks: plain Python loops over floats.

Nothing here calls the implementation or torch arithmetic; inputs arrive as nested
lists (tensor.tolist() after a cast to float64) and every formula is written out
from the page again.
"""

from __future__ import annotations

import math
from decimal import Decimal, localcontext
from fractions import Fraction


def prefix_ratio(logp: list[list[float]], old: list[list[float]], mask: list[list[bool]]) -> list[list[float | None]]:
    """R~_t per row; None at masked positions. t counts valid tokens only.

    The prefix sum is exact (rationals: every float is one) and the mean's rounding is carried into the
    exponential, so R~_t is within a few ulp of exp(mean) even where the log-ratios are large: a float64 sum of
    terms near 800 is 6e-14 off, which exp turns into a relative error of R~ that a 1e-12 tolerance could not
    certify (tests/test_reference_certification.py)."""
    out = []
    for lrow, orow, mrow in zip(logp, old, mask):
        acc, t, row = Fraction(0), 0, []
        for l, o, v in zip(lrow, orow, mrow):
            if not v:
                row.append(None)
                continue
            t += 1
            acc += Fraction(l) - Fraction(o)
            row.append(_exp_exact(acc / t))
        out.append(row)
    return out


def _exp_exact(x: Fraction) -> float:
    """exp(x) of an exact rational: exp of its nearest float times exp of the rest (below half an ulp), inf where
    it exceeds the largest float64."""
    hi = float(x)
    try:
        return math.exp(hi) * (1.0 + float(x - Fraction(hi)))
    except OverflowError:
        return math.inf


def clip_eps(T: int, eps_min: float, eps_max: float) -> list[float]:
    """eps_t for t = 1..T; T = 1 gives [eps_max] (the declared choice).

    In 40-digit decimals, rounded once: the contracts hold eps_lo / eps_hi to a few ulp, so the schedule a
    float64 evaluation would round five times must be the correctly rounded one here."""
    if T == 1:
        return [eps_max]
    with localcontext(prec=40):
        lo, hi = Decimal(eps_min), Decimal(eps_max)
        rT = 1 / Decimal(T).sqrt()
        return [float(lo + (hi - lo) * (1 / Decimal(t).sqrt() - rT) / (1 - rT)) for t in range(1, T + 1)]


def loss_and_grad(
    logp: list[list[float]],
    old: list[list[float]],
    adv: list[list[float]],
    mask: list[list[bool]],
    eps_min: float,
    eps_max: float,
    horizon: int | None = None,
    margin: float = 0.0,
    removed: list | None = None,
):
    """Token-mean PPO surrogate with R^_t and per-position bounds, and its gradient w.r.t. logp.

    Returns (loss, grad rows, near rows, scale): near[b][t] is True where R~_t is within a
    relative `margin` of a clip bound (the active set is ambiguous there in finite
    precision, so a caller may leave those positions out of a gradient comparison);
    scale = mean |per-token term|, the size a rounding error of the loss is relative
    to (the loss itself can cancel to near zero, so |loss| is not). A `removed` list is
    filled with rows of flags: True where the paper's gradient is exactly 0 at a valid
    token (the clip removes it, or A = 0).
    """
    ratios = prefix_ratio(logp, old, mask)
    n = sum(1 for mrow in mask for v in mrow if v)
    total = abs_total = 0.0
    grads, near = [], []
    for rrow, arow, mrow, lrow, orow in zip(ratios, adv, mask, logp, old):
        T = horizon if horizon is not None else sum(1 for v in mrow if v)
        eps_row = clip_eps(T, eps_min, eps_max) if T >= 1 else []
        t = 0
        on_policy = True  # every log-ratio so far exactly 0: R~_t = 1 exactly in any precision
        grow, nrow, zrow = [], [], []
        for r, a, v, lv, ov in zip(rrow, arow, mrow, lrow, orow):
            if not v:
                grow.append(0.0)
                nrow.append(False)
                zrow.append(False)
                continue
            e = eps_row[t]
            t += 1
            on_policy = on_policy and lv == ov
            lo, hi = 1.0 - e, 1.0 + e
            clipped = min(max(r, lo), hi)
            # A = 0: the term and its gradient are exactly 0 whatever R~_t (an overflowed R~ is no exception)
            term = -min(r * a, clipped * a) if a != 0 else 0.0
            total += term
            abs_total += abs(term)
            # d/dl_t of -min(R A, clip(R) A) with dR/dl_t = R~_t (Eq15):
            # the clipped branch is constant when it is the smaller one and R is outside.
            gone = a == 0 or (a > 0 and r > hi) or (a < 0 and r < lo)
            g = 0.0 if gone else -a * r
            zrow.append(gone)
            grow.append(g / n)
            # Not ambiguous: A = 0 (no gradient either way), or R~_t = 1 exactly on a bound of exactly 1 (eps_t = 0,
            # logp = old_logp so far), where every precision computes the same tie: the clip removes the gradient
            # only strictly outside its bounds, so the token keeps it.
            exact = a == 0 or (on_policy and e == 0.0)
            nrow.append(not exact and (abs(r - hi) <= margin * hi or abs(r - lo) <= margin * max(lo, 1e-300)))
        grads.append(grow)
        near.append(nrow)
        if removed is not None:
            removed.append(zrow)
    return total / n, grads, near, abs_total / n


def loss_metrics(logp, old, adv, mask, eps_min: float, eps_max: float, horizon: int | None = None,
                 margin: float = 0.0) -> dict:
    """The numbers tapo_loss reports beside the loss, by the same loops: tokens N; ratio_min / ratio_max of R~ over
    valid tokens; clip_fraction (valid tokens whose R~ lies strictly outside its bounds) and clip_active_fraction
    (those outside on the side A's sign selects, whose gradient the clip removes), each NaN (undefined) when some
    token lies within a relative `margin` of a bound; eps_lo / eps_hi, the smallest and largest eps_t of a valid
    token (T each response's own length, or the horizon)."""
    ratios = prefix_ratio(logp, old, mask)
    n = outside = active = 0
    tie = False
    r_lo = e_lo = math.inf
    r_hi = e_hi = -math.inf
    for rrow, arow, mrow in zip(ratios, adv, mask):
        T = horizon if horizon is not None else sum(1 for v in mrow if v)
        eps_row = clip_eps(T, eps_min, eps_max) if T >= 1 else []
        t = 0
        for r, a, v in zip(rrow, arow, mrow):
            if not v:
                continue
            e = eps_row[t]
            t += 1
            n += 1
            lo, hi = 1.0 - e, 1.0 + e
            r_lo, r_hi, e_lo, e_hi = min(r_lo, r), max(r_hi, r), min(e_lo, e), max(e_hi, e)
            # on a bound exactly (R~ = 1 = 1 + eps with eps = 0) every precision agrees: inside, not clipped
            if r != lo and r != hi and (abs(r - hi) <= margin * hi or abs(r - lo) <= margin * max(lo, 1e-300)):
                tie = True
            outside += r < lo or r > hi
            active += (a > 0 and r > hi) or (a < 0 and r < lo)
    nan = math.nan
    return {"tokens": n, "ratio_min": r_lo, "ratio_max": r_hi, "clip_fraction": nan if tie else outside / n,
            "clip_active_fraction": nan if tie else active / n, "eps_lo": e_lo, "eps_hi": e_hi}


# --- the same loops, registered for the generic kinds (engine/kinds) ------------------------------------------


def _register() -> None:
    import torch

    from engine.spec import registry

    @registry.reference("tapo.prefix_ratio")
    def prefix_ratio_tensor(logp, old, mask):
        """R~_t as a float64 tensor; NaN (undefined) at masked positions."""
        rows = prefix_ratio(logp.tolist(), old.tolist(), mask.to(torch.bool).tolist())
        return torch.tensor([[math.nan if v is None else v for v in row] for row in rows], dtype=torch.float64)

    @registry.reference("tapo.loss")
    def loss_tensor(logp, old, adv, mask, eps_min, eps_max, horizon=None, group_size=None, dtype=torch.float64):
        """The token-mean loss, mean |term| as its scale, the gradient w.r.t. logp (NaN where the ratio sits within
        a dtype-sized margin of a clip bound: the active set is ambiguous there) and the clipped-token count."""
        mask = mask.to(torch.bool)
        adv_rows = adv[:, None].expand(mask.shape) if adv.dim() == 1 else adv
        margin = 1e-10 if dtype == torch.float64 else 1e-4
        removed: list = []
        value, grad, near, scale = loss_and_grad(logp.tolist(), old.tolist(), adv_rows.tolist(), mask.tolist(),
                                                 float(eps_min), float(eps_max), horizon, margin, removed)
        g = torch.tensor(grad, dtype=torch.float64).reshape(mask.shape)
        n = torch.tensor(near, dtype=torch.bool).reshape(mask.shape)
        clipped = int((mask & ~n & (g == 0)).sum())
        gone = torch.tensor(removed, dtype=torch.bool).reshape(mask.shape)
        return {"value": torch.tensor(value, dtype=torch.float64), "scale": scale,
                "grad": [torch.where(n, torch.full_like(g, math.nan), g)],
                # where the paper's gradient is exactly 0: masked slots, tokens the clip removes (away from a
                # bound), tokens with A = 0
                "zero_grad": [~mask | (gone & ~n)],
                "counts": {"clipped_tokens": clipped, "grad_excluded": int(n.sum())}}

    @registry.reference("tapo.loss_metrics")
    def metrics_dict(logp, old, adv, mask, eps_min, eps_max, horizon=None, group_size=None, dtype=torch.float64):
        """The metrics dict tapo_loss returns, by the float64 loops; the clip counts NaN where a ratio sits within a
        dtype-sized margin of a bound."""
        mask = mask.to(torch.bool)
        adv_rows = adv[:, None].expand(mask.shape) if adv.dim() == 1 else adv
        margin = 1e-10 if dtype == torch.float64 else 1e-4
        return loss_metrics(logp.tolist(), old.tolist(), adv_rows.tolist(), mask.tolist(), float(eps_min),
                            float(eps_max), horizon, margin)

    @registry.reference("tapo.on_policy_loss")
    def on_policy_loss(logp, old, adv, mask, eps_min, eps_max, horizon=None, group_size=None):
        """At logp = old_logp every ratio is 1 and no clip binds: the loss is -mean(A) over the valid tokens (its
        scale mean |A|) and its gradient the vanilla policy gradient -A_t / N (0 at masked slots), by plain loops."""
        m = mask.to(torch.bool).tolist()
        B, L = len(m), len(m[0]) if m else 0
        a = adv.tolist()
        at = [[(a[b][t] if adv.dim() == 2 else a[b]) for t in range(L)] for b in range(B)]
        valid = [(b, t) for b in range(B) for t in range(L) if m[b][t]]
        n = len(valid)
        value = -math.fsum(at[b][t] for b, t in valid) / n
        scale = math.fsum(abs(at[b][t]) for b, t in valid) / n
        grad = [[(-at[b][t] / n if m[b][t] else 0.0) for t in range(L)] for b in range(B)]
        return {"value": torch.tensor(value, dtype=torch.float64), "scale": scale,
                "grad": [torch.tensor(grad, dtype=torch.float64).reshape(mask.shape)]}


_register()


# --- the scale tier: the same formulas at training sizes (methods/common/exact.py says why) ------------------------


def _scale_register() -> None:
    import torch

    from engine.spec import registry
    from methods.common.exact import fsum

    f64 = torch.float64

    def prefix_f64(logp, old, mask):
        """(R~ [B, L] float64, 0 at masked slots; valid-token position t [B, L] int64; bool mask). The prefix sums
        are float64 running sums of float64 differences: against the float32 implementation their error (at most
        about t * 1.1e-16 * sum |delta| before the division by t, 1e-12 at 45,000 tokens) is nothing."""
        m = mask.to(torch.bool)
        delta = torch.where(m, logp.to(f64) - old.to(f64), torch.zeros((), dtype=f64))
        t = m.to(torch.int64).cumsum(-1)
        r = torch.exp(delta.cumsum(-1) / t.clamp_min(1).to(f64))
        return torch.where(m, r, torch.zeros((), dtype=f64)), t, m

    @registry.reference("tapo.prefix_ratio_f64")
    def prefix_ratio_f64(logp, old, mask):
        """R~_t as a float64 tensor, NaN (undefined) at masked positions: `prefix_ratio` at training sizes."""
        r, _, m = prefix_f64(logp, old, mask)
        return torch.where(m, r, torch.full_like(r, math.nan))

    @registry.reference("tapo.loss_f64")
    def loss_f64(logp, old, adv, mask, eps_min, eps_max, horizon=None, group_size=None, dtype=torch.float64):
        """`loss_and_grad` at training sizes: per token in float64, the token mean summed exactly; NaN gradient
        where the ratio is within a dtype-sized margin of a clip bound, and the clipped-token count."""
        r, t, m = prefix_f64(logp, old, mask)
        zero = torch.zeros((), dtype=f64)
        a = adv.to(f64)
        a = torch.where(m, a[:, None].expand(m.shape) if a.dim() == 1 else a, zero)
        n_row = m.sum(-1, keepdim=True)
        T = (n_row if horizon is None else torch.full_like(n_row, int(horizon))).to(f64)
        rT = T.rsqrt()
        frac = torch.where(T > 1, (t.clamp_min(1).to(f64).rsqrt() - rT) / (1.0 - rT).clamp_min(1e-300), zero)
        eps = torch.where(T > 1, eps_min + (eps_max - eps_min) * frac, torch.full_like(frac, float(eps_max)))
        lo, hi = 1.0 - eps, 1.0 + eps
        term = torch.where(m, -torch.minimum(r * a, torch.minimum(torch.maximum(r, lo), hi) * a), zero)
        active = ((a > 0) & (r > hi)) | ((a < 0) & (r < lo))
        n = int(m.sum())
        g = torch.where(m & ~active, -a * r, zero) / n
        margin = 1e-10 if dtype == torch.float64 else 1e-4
        near = m & (((r - hi).abs() <= margin * hi) | ((r - lo).abs() <= margin * lo.clamp_min(1e-300)))
        clipped = int((m & ~near & (g == 0)).sum())
        return {"value": torch.tensor(fsum(term) / n, dtype=f64), "scale": fsum(term.abs()) / n,
                "grad": [torch.where(near, torch.full_like(g, math.nan), g)],
                "counts": {"clipped_tokens": clipped, "grad_excluded": int(near.sum())}}

    @registry.reference("tapo.loss_counts")
    def loss_counts(logp, old, adv, mask, *args, **kwargs):
        """The count tapo_loss reports (metrics['tokens']): the valid tokens, exactly."""
        return {"tokens": int(mask.to(torch.bool).sum())}


_scale_register()
