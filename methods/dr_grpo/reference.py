"""Independent float64 references for Dr. GRPO (arXiv 2503.20783): plain Python loops over floats.

Written from the paper again: advantages R - group mean (no std), and the clipped surrogate summed over every
valid token and divided by a constant, G x C_L (no 1/|o_i|); inputs arrive as nested lists, nothing here calls
the implementation or torch arithmetic.
"""

from __future__ import annotations

import math


def group_advantages(rewards, group_size, keep=None):
    """R - mean of the group's counted rewards; uncounted rows (and groups with none) get 0."""
    keep = [True] * len(rewards) if keep is None else keep
    out = [0.0] * len(rewards)
    for start in range(0, len(rewards), group_size):
        idx = [i for i in range(start, start + group_size) if keep[i]]
        if idx:
            mean = math.fsum(rewards[i] for i in idx) / len(idx)
            for i in idx:
                out[i] = rewards[i] - mean
    return out


def loss_and_grad(logp, old, adv, mask, *, clip_low=0.2, clip_high=0.2, norm_length=None, clamp=20.0, margin=1e-9):
    """(loss, grad rows, near rows): sum of -min(r A, clip(r) A) over valid tokens / (G x C_L), G the non-empty
    rows, C_L = norm_length or the padded length; `near` marks a ratio within `margin` of a bound or the clamp."""
    lo, hi = 1.0 - clip_low, 1.0 + clip_high
    rows = sum(1 for row in mask if any(row))
    denom = rows * (len(mask[0]) if norm_length is None else norm_length)
    terms = []
    grad = [[0.0] * len(row) for row in mask]
    near = [[False] * len(row) for row in mask]
    for b, (lrow, orow, arow, mrow) in enumerate(zip(logp, old, adv, mask)):
        for t, (l, o, a, v) in enumerate(zip(lrow, orow, arow, mrow)):
            if not v:
                continue
            x = l - o
            r = math.exp(max(-clamp, min(clamp, x)))
            c = min(max(r, lo), hi)
            terms.append(max(-r * a, -c * a))
            zero = abs(x) > clamp or (a > 0 and r > hi) or (a < 0 and r < lo)
            grad[b][t] = 0.0 if zero else -a * r / denom
            near[b][t] = abs(abs(x) - clamp) <= margin * clamp or abs(r - lo) <= margin or abs(r - hi) <= margin
    return math.fsum(terms) / denom, grad, near


# --- the same loops, registered for the generic kinds (engine/kinds) ------------------------------------------


def _register() -> None:
    import torch

    from engine.spec import registry

    def run(logp, old_logp, advantages, mask, *, clip_low=0.2, clip_high=0.2, norm_length=None, log_ratio_clamp=20.0):
        m = mask.to(torch.bool)
        a = advantages[:, None].expand_as(logp) if advantages.dim() == 1 else advantages
        return loss_and_grad(torch.where(m, logp, 0.0).tolist(), torch.where(m, old_logp, 0.0).tolist(),
                             torch.where(m, a, 0.0).tolist(), m.tolist(), clip_low=clip_low, clip_high=clip_high,
                             norm_length=norm_length, clamp=log_ratio_clamp)

    @registry.reference("dr_grpo.loss")
    def loss_tensor(*args, **kwargs):
        return torch.tensor(run(*args, **kwargs)[0], dtype=torch.float64)

    @registry.reference("dr_grpo.loss_grad")
    def loss_grad_tensor(*args, **kwargs):
        """d loss / d logp; NaN where the branch is ambiguous (a ratio within 1e-9 of a bound, the clamp)."""
        _, grad, near = run(*args, **kwargs)
        g = torch.tensor(grad, dtype=torch.float64)
        return torch.where(torch.tensor(near), torch.full_like(g, math.nan), g)

    @registry.reference("dr_grpo.group_advantages")
    def advantages_tensor(rewards, group_size, *, mask=None):
        keep = None if mask is None else (mask.to(torch.bool).any(-1) if mask.dim() == 2 else mask.to(torch.bool))
        return torch.tensor(group_advantages(rewards.tolist(), group_size, None if keep is None else keep.tolist()),
                            dtype=torch.float64)


    @registry.reference("dr_grpo.loss_f64")
    def loss_f64(logp, old_logp, advantages, mask, *, clip_low=0.2, clip_high=0.2, norm_length=None,
                 log_ratio_clamp=20.0, dtype=None):
        """`loss_and_grad` at training sizes: each term in float64 tensor arithmetic, every sum exact (fsum); the
        loss, its scale (the sum of |term| over G C_L) and d loss / d logp, NaN where the branch is ambiguous."""
        from methods.common.exact import fsum

        f64, m = torch.float64, mask.to(torch.bool)
        zero = torch.zeros((), dtype=f64)
        a = advantages.to(f64)
        a = torch.where(m, a[:, None].expand(m.shape) if a.dim() == 1 else a, zero)
        x = torch.where(m, logp.to(f64) - old_logp.to(f64), zero)
        C, lo, hi = float(log_ratio_clamp), 1.0 - float(clip_low), 1.0 + float(clip_high)
        r = x.clamp(-C, C).exp()
        term = torch.where(m, torch.maximum(-r * a, -r.clamp(lo, hi) * a), zero)
        rows = int(m.any(dim=-1).sum())
        denom = rows * (m.shape[-1] if norm_length is None else int(norm_length))
        g = torch.where(((a > 0) & (r > hi)) | ((a < 0) & (r < lo)) | (x.abs() > C), zero, -a * r / denom)
        margin = 1e-9 if dtype in (None, torch.float64) else 1e-5  # float32 puts a ratio ~1e-7 off its float64 value
        near = m & (((x.abs() - C).abs() <= margin * C) | ((r - lo).abs() <= margin) | ((r - hi).abs() <= margin))
        return {"value": torch.tensor(fsum(term) / denom, dtype=f64), "scale": fsum(term.abs()) / denom,
                "grad": [torch.where(near, torch.full_like(g, math.nan), torch.where(m, g, zero))]}


_register()
