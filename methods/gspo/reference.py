"""Independent float64 references for GSPO (arXiv 2507.18071): plain Python loops over floats.

Inputs are nested lists (tensor.tolist() after a cast to float64); nothing here calls the implementation or torch
arithmetic. The declared choices of specs/gspo.yaml: empty rows have s = 1 and count in no mean; log s is clamped
above (a binding clamp passes no gradient); the loss is the mean over non-empty responses.
"""

from __future__ import annotations

import math


def sequence_ratio(logp, old, mask, clamp: float = 10.0) -> list[float]:
    """s_i = exp(mean of logp - old over the row's valid tokens), clamped above; 1.0 for an empty row."""
    out = []
    for lrow, orow, mrow in zip(logp, old, mask):
        d = [l - o for l, o, v in zip(lrow, orow, mrow) if v]
        out.append(math.exp(min(clamp, math.fsum(d) / len(d))) if d else 1.0)
    return out


def loss_and_grad(logp, old, adv, mask, *, clip_low=3e-4, clip_high=4e-4, clamp=10.0, margin=1e-9):
    """(loss, grad rows, near rows, scale). `adv` is [B][L] (a per-response advantage repeated along the row is the
    sequence form; per-token values are the GSPO-token form). Per response: mean over its tokens of
    -min(s A_t, clip(s) A_t), whose gradient at token t is -A_t s / |y| when unclipped (the token form's
    sg[s] pi/sg[pi] has gradient s d logp_t, weighted 1/|y| by the mean); then the mean over non-empty rows."""
    lo, hi = 1.0 - clip_low, 1.0 + clip_high
    rows = sum(1 for mrow in mask if any(mrow))
    loss_terms, abs_terms = [], []
    grad = [[0.0] * len(mrow) for mrow in mask]
    near = [[False] * len(mrow) for mrow in mask]
    for b, (lrow, orow, arow, mrow) in enumerate(zip(logp, old, adv, mask)):
        idx = [t for t, v in enumerate(mrow) if v]
        if not idx:
            continue
        n = len(idx)
        x = math.fsum(lrow[t] - orow[t] for t in idx) / n
        binds = x > clamp
        s = math.exp(min(x, clamp))
        c = min(max(s, lo), hi)
        close = abs(x - clamp) <= margin * clamp or abs(s - lo) <= margin or abs(s - hi) <= margin
        for t in idx:
            a = arow[t]
            term = max(-s * a, -c * a)
            loss_terms.append(term / (n * rows))
            abs_terms.append(abs(term) / (n * rows))
            clipped = (a > 0 and s > hi) or (a < 0 and s < lo)
            grad[b][t] = 0.0 if (binds or clipped) else -a * s / (n * rows)
            near[b][t] = close
    return math.fsum(loss_terms), grad, near, math.fsum(abs_terms)
