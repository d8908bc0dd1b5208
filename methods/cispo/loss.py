"""CISPO (MiniMax-M1, arXiv 2506.13585): clipped importance-sampling-weight policy optimization.

For response tokens t of the G responses of a batch,

    r_i,t  = pi_theta / pi_old = exp(logp_i,t - old_i,t)
    w_i,t  = sg[ clip(r_i,t, 1 - eps_low, 1 + eps_high) ]                           a constant weight
    L      = -(1 / sum_i |o_i|) sum_i sum_t w_i,t A_i,t logp_i,t                    REINFORCE, token-level

The weight is clipped and detached, so every token keeps a gradient, -w A / N (PPO's clip drops the gradient of a
clipped token instead). The paper sets eps_low large, imposing no lower bound: clip_low None here.
"""

from __future__ import annotations

import torch

from methods.common.pg_inputs import check_logp, check_number, compute_dtype, log_ratio, masked, row_counts, \
    token_advantages

CLIP_HIGH = 0.2

__all__ = ["build_cispo", "cispo_loss", "clipped_weight", "token_mean"]


def clipped_weight(lr: torch.Tensor, lo: float | None, hi: float) -> torch.Tensor:
    """sg[clip(exp(lr), lo, hi)]: exp of a huge log-ratio is inf, which the upper bound clips, so no guard is needed;
    lo None imposes no lower bound."""
    return lr.exp().clamp(min=lo, max=hi).detach()


def token_mean(per_token: torch.Tensor, n: int) -> torch.Tensor:
    return per_token.sum() / n


def build_cispo(ratio_fn=log_ratio, weight_fn=clipped_weight, aggregate_fn=token_mean):
    """`cispo_loss` assembled from its parts; the method uses the defaults, a mutant swaps one."""

    def cispo_loss(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor, *,
                   clip_low: float | None = None, clip_high: float = CLIP_HIGH):
        """The CISPO loss (module docstring). Returns (loss, metrics): tokens (N) and rows."""
        m = check_logp(logp, mask, ("old_logp", old_logp))
        lo = None if clip_low is None else 1.0 - check_number("clip_low", clip_low, below=1.0)
        hi = 1.0 + check_number("clip_high", clip_high)
        _, n, rows = row_counts(m)
        cdt = compute_dtype(logp.dtype)
        a = token_advantages(advantages, m, cdt)
        w = weight_fn(ratio_fn(logp, old_logp, m, cdt), lo, hi)
        loss = aggregate_fn(-(w * a) * masked(logp, m, cdt), n)
        return loss, {"tokens": n, "rows": rows}

    return cispo_loss


cispo_loss = build_cispo()
