"""Independent float64 references for DAPO (arXiv 2503.14476): plain Python loops over floats.

Inputs arrive as nested lists (tensor.tolist() after a cast to float64); nothing here calls the implementation or
torch arithmetic. The formulas are written out from the paper again (Eq. 8 with clip-higher, Eq. 13 for the soft
overlong punishment, Eq. 11's constraint for dynamic sampling), with the choices specs/dapo.yaml declares (a
log-ratio clamp whose binding tokens pass no gradient, a token mean over every valid token of the call).
"""

from __future__ import annotations

import math


def loss_and_grad(logp, old, adv, mask, *, clip_low=0.2, clip_high=0.28, clamp=20.0, margin=1e-9):
    """(loss, grad rows [B][L], near rows [B][L]) of the token-mean clipped surrogate; `adv` is [B][L]. `near` marks
    a token whose ratio lies within `margin` (relative) of a bound or whose log-ratio is at the clamp: there the
    active branch is ambiguous in finite precision and the gradient is left undefined."""
    lo, hi = 1.0 - clip_low, 1.0 + clip_high
    n = sum(1 for row in mask for v in row if v)
    terms = []
    grad = [[0.0] * len(row) for row in mask]
    near = [[False] * len(row) for row in mask]
    for b, (lrow, orow, arow, mrow) in enumerate(zip(logp, old, adv, mask)):
        for t, (l, o, a, v) in enumerate(zip(lrow, orow, arow, mrow)):
            if not v:
                continue
            x = l - o
            binds = abs(x) > clamp
            r = math.exp(max(-clamp, min(clamp, x)))
            c = min(max(r, lo), hi)
            terms.append(max(-r * a, -c * a))
            clipped = (a > 0 and r > hi) or (a < 0 and r < lo)
            grad[b][t] = 0.0 if (binds or clipped) else -a * r / n
            near[b][t] = abs(abs(x) - clamp) <= margin * clamp or abs(r - lo) <= margin or abs(r - hi) <= margin
    return math.fsum(terms) / n, grad, near


def overlong_penalty(lengths, max_length, cache_length):
    """Eq. 13, one response at a time."""
    expected = max_length - cache_length
    out = []
    for y in lengths:
        if y <= expected:
            out.append(0.0)
        elif y <= max_length:
            out.append((expected - y) / cache_length)
        else:
            out.append(-1.0)
    return out


def dynamic_sampling_mask(correct, group_size):
    """Eq. 11's constraint 0 < |{o_i : correct}| < G, group by group, repeated over the group's rows."""
    out = []
    for start in range(0, len(correct), group_size):
        hits = sum(1 for c in correct[start:start + group_size] if c)
        out += [0 < hits < group_size] * group_size
    return out


# --- the same loops, registered for the generic kinds (engine/kinds) ------------------------------------------


def _register() -> None:
    import torch

    from engine.spec import registry

    def lists(logp, old, advantages, mask):
        m = mask.to(torch.bool)
        a = advantages[:, None].expand_as(logp) if advantages.dim() == 1 else advantages
        return (torch.where(m, logp, 0.0).tolist(), torch.where(m, old, 0.0).tolist(), torch.where(m, a, 0.0).tolist(),
                m.tolist())

    def run(logp, old_logp, advantages, mask, *, clip_low=0.2, clip_high=0.28, log_ratio_clamp=20.0):
        return loss_and_grad(*lists(logp, old_logp, advantages, mask), clip_low=clip_low, clip_high=clip_high,
                             clamp=log_ratio_clamp)

    @registry.reference("dapo.loss")
    def loss_tensor(*args, **kwargs):
        """The DAPO loss as a float64 scalar."""
        return torch.tensor(run(*args, **kwargs)[0], dtype=torch.float64)

    @registry.reference("dapo.loss_grad")
    def loss_grad_tensor(*args, **kwargs):
        """d loss / d logp [B, L]; NaN where the branch is ambiguous (a ratio within 1e-9 of a bound, the clamp)."""
        _, grad, near = run(*args, **kwargs)
        g = torch.tensor(grad, dtype=torch.float64)
        return torch.where(torch.tensor(near), torch.full_like(g, math.nan), g)

    @registry.reference("dapo.overlong_penalty")
    def overlong_tensor(lengths, max_length, cache_length):
        return torch.tensor(overlong_penalty(lengths.tolist(), max_length, cache_length), dtype=torch.float64)

    @registry.reference("dapo.dynamic_sampling_mask")
    def dynamic_tensor(correct, group_size):
        return torch.tensor(dynamic_sampling_mask((correct != 0).tolist(), group_size), dtype=torch.float64)


    @registry.reference("dapo.loss_f64")
    def loss_f64(logp, old_logp, advantages, mask, *, clip_low=0.2, clip_high=0.28, log_ratio_clamp=20.0, dtype=None):
        """`loss_and_grad` at training sizes: each term in float64 tensor arithmetic, every sum exact (fsum); the
        loss, its scale (the mean |term|) and d loss / d logp, NaN where the branch is ambiguous."""
        from methods.common.exact import fsum

        f64, m = torch.float64, mask.to(torch.bool)
        zero = torch.zeros((), dtype=f64)
        a = advantages.to(f64)
        a = torch.where(m, a[:, None].expand(m.shape) if a.dim() == 1 else a, zero)
        x = torch.where(m, logp.to(f64) - old_logp.to(f64), zero)
        C, lo, hi = float(log_ratio_clamp), 1.0 - float(clip_low), 1.0 + float(clip_high)
        r = x.clamp(-C, C).exp()
        term = torch.where(m, torch.maximum(-r * a, -r.clamp(lo, hi) * a), zero)
        n = int(m.sum())
        g = torch.where(((a > 0) & (r > hi)) | ((a < 0) & (r < lo)) | (x.abs() > C), zero, -a * r / n)
        margin = 1e-9 if dtype in (None, torch.float64) else 1e-5  # float32 puts a ratio ~1e-7 off its float64 value
        near = m & (((x.abs() - C).abs() <= margin * C) | ((r - lo).abs() <= margin) | ((r - hi).abs() <= margin))
        return {"value": torch.tensor(fsum(term) / n, dtype=f64), "scale": fsum(term.abs()) / n,
                "grad": [torch.where(near, torch.full_like(g, math.nan), torch.where(m, g, zero))]}


_register()
