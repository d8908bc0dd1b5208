"""Independent float64 references for GMPO (arXiv 2507.20673): plain Python loops over floats.

Written from the paper again: per token the ratio rho^sgn(A) is clipped to (e^-eps_low, e^eps_high) pessimistically,
the response's geometric mean is taken over its valid tokens, and the loss is -(1/G) sum_i A_i s_i.
"""

from __future__ import annotations

import math


def _sign(a):
    return (a > 0) - (a < 0)


def ratios(logp, old, adv, mask, *, clip_low=0.4, clip_high=0.4, clamp=20.0, margin=1e-9):
    """Per response: (s_i, [(t, token passes gradient)], near) with `near` True when some token's log-ratio lies
    within `margin` of a clip bound or of the clamp (its branch is ambiguous in finite precision)."""
    out = []
    for lrow, orow, a, mrow in zip(logp, old, adv, mask):
        idx = [t for t, v in enumerate(mrow) if v]
        if not idx:
            out.append((1.0, [], False))
            continue
        sg = _sign(a)
        ks, live, near = [], [], False
        for t in idx:
            x = lrow[t] - orow[t]
            near = near or abs(abs(x) - clamp) <= margin * clamp or abs(x + clip_low) <= margin \
                or abs(x - clip_high) <= margin
            binds = abs(x) > clamp
            x = max(-clamp, min(clamp, x))
            c = max(-clip_low, min(clip_high, x))
            k = sg * min(sg * x, sg * c)
            ks.append(k)
            # the token's term moves with logp only where the unclipped branch is the one kept
            live.append((t, not binds and sg != 0 and sg * x <= sg * c))
        out.append((math.exp(math.fsum(ks) / len(idx)), live, near))
    return out


def loss_and_grad(logp, old, adv, mask, **kw):
    rs = ratios(logp, old, adv, mask, **kw)
    rows = sum(1 for row in mask if any(row))
    grad = [[0.0] * len(row) for row in mask]
    near = [[False] * len(row) for row in mask]
    terms = []
    for b, ((s, live, close), a, mrow) in enumerate(zip(rs, adv, mask)):
        if not live:
            continue
        n = len(live)
        terms.append(-a * s / rows)
        for t, ok in live:
            grad[b][t] = -a * s / (n * rows) if ok else 0.0
            near[b][t] = close
    return math.fsum(terms), grad, near


def _register() -> None:
    import torch

    from engine.spec import registry

    def lists(logp, old_logp, advantages, mask):
        m = mask.to(torch.bool)
        has = m.any(-1)
        return (torch.where(m, logp, 0.0).tolist(), torch.where(m, old_logp, 0.0).tolist(),
                torch.where(has, advantages, 0.0).tolist(), m.tolist())

    def kw(clip_low=0.4, clip_high=0.4, log_ratio_clamp=20.0):
        return {"clip_low": clip_low, "clip_high": clip_high, "clamp": log_ratio_clamp}

    @registry.reference("gmpo.loss")
    def loss_tensor(logp, old_logp, advantages, mask, **kwargs):
        return torch.tensor(loss_and_grad(*lists(logp, old_logp, advantages, mask), **kw(**kwargs))[0],
                            dtype=torch.float64)

    @registry.reference("gmpo.loss_grad")
    def loss_grad_tensor(logp, old_logp, advantages, mask, **kwargs):
        """d loss / d logp; NaN for a response with a token at a clip bound or the clamp (ambiguous branch)."""
        _, grad, near = loss_and_grad(*lists(logp, old_logp, advantages, mask), **kw(**kwargs))
        g = torch.tensor(grad, dtype=torch.float64)
        return torch.where(torch.tensor(near), torch.full_like(g, math.nan), g)

    @registry.reference("gmpo.geometric_ratio")
    def ratio_tensor(logp, old_logp, advantages, mask, **kwargs):
        rs = ratios(*lists(logp, old_logp, advantages, mask), **kw(**kwargs))
        return torch.tensor([s for s, _, _ in rs], dtype=torch.float64)


    @registry.reference("gmpo.loss_f64")
    def loss_f64(logp, old_logp, advantages, mask, *, clip_low=0.4, clip_high=0.4, log_ratio_clamp=20.0, dtype=None):
        """`loss_and_grad` at training sizes: each token in float64 tensor arithmetic, each response's mean log-ratio
        and the loss summed exactly (fsum); the loss, its scale (the mean |A_i s_i|) and d loss / d logp, NaN for a
        response with a token within the margin of a clip bound or the clamp."""
        from methods.common.exact import fsum, fsum_rows

        f64, m = torch.float64, mask.to(torch.bool)
        zero = torch.zeros((), dtype=f64)
        n_row = m.sum(dim=-1)
        has = n_row > 0
        a = torch.where(has, advantages.to(f64), zero)
        sg = torch.sign(a)[:, None]
        x = torch.where(m, logp.to(f64) - old_logp.to(f64), zero)
        C, low, high = float(log_ratio_clamp), float(clip_low), float(clip_high)
        xc = x.clamp(-C, C)
        k = torch.where(m, sg * torch.minimum(sg * xc, sg * xc.clamp(-low, high)), zero)
        s = (fsum_rows(k) / n_row.clamp_min(1).to(f64)).exp()
        rows = int(has.sum())
        live = m & (x.abs() <= C) & (sg != 0) & (sg * xc <= sg * xc.clamp(-low, high))
        g = torch.where(live, (-a * s / (n_row.clamp_min(1).to(f64) * rows))[:, None].expand(m.shape), zero)
        margin = 1e-9 if dtype in (None, torch.float64) else 1e-5  # float32 puts a log-ratio ~1e-7 off
        near = m & (((x.abs() - C).abs() <= margin * C) | ((x + low).abs() <= margin) | ((x - high).abs() <= margin))
        near = m & near.any(dim=-1, keepdim=True)
        terms = torch.where(has, -a * s / rows, zero)
        return {"value": torch.tensor(fsum(terms), dtype=f64), "scale": fsum(terms.abs()),
                "grad": [torch.where(near, torch.full_like(g, math.nan), g)]}


_register()
