"""Independent float64 references for CISPO (MiniMax-M1, arXiv 2506.13585): plain Python loops over floats.

Written from the paper again (Eq. 4 with the token-level normaliser): each valid token contributes
-sg(clip(r, 1 - eps_low, 1 + eps_high)) A logp / N, whose gradient is -w A / N; no lower bound when eps_low is None.
"""

from __future__ import annotations

import math


def loss_and_grad(logp, old, adv, mask, *, clip_low=None, clip_high=0.2):
    lo, hi = (0.0 if clip_low is None else 1.0 - clip_low), 1.0 + clip_high
    n = sum(1 for row in mask for v in row if v)
    terms = []
    grad = [[0.0] * len(row) for row in mask]
    for b, (lrow, orow, arow, mrow) in enumerate(zip(logp, old, adv, mask)):
        for t, (l, o, a, v) in enumerate(zip(lrow, orow, arow, mrow)):
            if not v:
                continue
            r = math.exp(min(l - o, 700.0))  # past exp's float64 range the upper bound clips it anyway
            w = min(max(r, lo), hi)
            terms.append(-w * a * l)
            grad[b][t] = -w * a / n
    return math.fsum(terms) / n, grad, math.fsum(abs(x) for x in terms) / n


def _register() -> None:
    import torch

    from engine.spec import registry

    def run(logp, old_logp, advantages, mask, *, clip_low=None, clip_high=0.2):
        m = mask.to(torch.bool)
        a = advantages[:, None].expand_as(logp) if advantages.dim() == 1 else advantages
        return loss_and_grad(torch.where(m, logp, 0.0).tolist(), torch.where(m, old_logp, 0.0).tolist(),
                             torch.where(m, a, 0.0).tolist(), m.tolist(), clip_low=clip_low, clip_high=clip_high)

    @registry.reference("cispo.loss")
    def loss_tensor(*args, **kwargs):
        """The loss, and the mean |term| a rounding error is relative to (the terms' signs can cancel)."""
        value, _, scale = run(*args, **kwargs)
        return {"value": torch.tensor(value, dtype=torch.float64), "scale": scale}

    @registry.reference("cispo.loss_grad")
    def loss_grad_tensor(*args, **kwargs):
        return torch.tensor(run(*args, **kwargs)[1], dtype=torch.float64)


    @registry.reference("cispo.loss_f64")
    def loss_f64(logp, old_logp, advantages, mask, *, clip_low=None, clip_high=0.2, dtype=None):
        """`loss_and_grad` at training sizes: each term in float64 tensor arithmetic, every sum exact (fsum)."""
        from methods.common.exact import fsum

        f64, m = torch.float64, mask.to(torch.bool)
        zero = torch.zeros((), dtype=f64)
        a = advantages.to(f64)
        a = torch.where(m, a[:, None].expand(m.shape) if a.dim() == 1 else a, zero)
        lp = torch.where(m, logp.to(f64), zero)
        lo, hi = (0.0 if clip_low is None else 1.0 - float(clip_low)), 1.0 + float(clip_high)
        w = torch.where(m, lp - old_logp.to(f64), zero).clamp(max=700.0).exp().clamp(lo, hi)
        term = torch.where(m, -w * a * lp, zero)
        n = int(m.sum())
        return {"value": torch.tensor(fsum(term) / n, dtype=f64), "scale": fsum(term.abs()) / n,
                "grad": [torch.where(m, -w * a / n, zero)]}


_register()
