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


_register()
