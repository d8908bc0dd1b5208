"""GPG (arXiv 2504.02546): group policy gradient, the plain REINFORCE objective with a group baseline.

    A_i = alpha (R_i - mean_{j in g(i)} R_j) / F_norm,     alpha = B / (B - M)              accurate gradient estimation
    L   = -(1 / sum_i |o_i|) sum_i sum_t A_i,t logp_i,t                                      no ratio, no clip, no KL

M counts the responses of groups whose rewards are all equal: their advantages are 0 and they carry no gradient,
so alpha rescales the batch mean to the B - M responses that do. F_norm = 1 is the paper's choice (its ablation
also tries the group std).
"""

from __future__ import annotations

import math

import torch

from methods.common.pg_inputs import check_length, check_logp, compute_dtype, masked, row_counts, token_advantages

__all__ = ["build_gpg", "gpg_loss", "gpg_advantages", "token_mean"]


def gpg_advantages(rewards: torch.Tensor, group_size: int, *, f_norm: float = 1.0) -> torch.Tensor:
    """alpha (R - group mean) / F_norm per group of `group_size` consecutive rows, in float64, returned in the
    rewards' dtype; alpha = B / (B - M), M the rows of flat groups (alpha 1 when every group is flat)."""
    if rewards.dim() != 1:
        raise ValueError(f"rewards must be [B], got shape {tuple(rewards.shape)}")
    B = rewards.shape[0]
    check_length("group_size", group_size)
    if B % group_size:
        raise ValueError(f"group_size must divide the batch of {B}, got {group_size}")
    if isinstance(f_norm, bool) or not isinstance(f_norm, (int, float)) or not math.isfinite(float(f_norm)) \
            or float(f_norm) <= 0.0:
        raise ValueError(f"f_norm must be a finite number > 0, got {f_norm!r}")
    r = rewards.detach().double()
    if not bool(torch.isfinite(r).all()):
        raise ValueError("rewards hold NaN or inf")
    g = r.reshape(-1, group_size)
    flat = g.amin(dim=1) == g.amax(dim=1)
    m_rows = int(flat.sum()) * group_size
    alpha = B / (B - m_rows) if m_rows < B else 1.0
    centred = torch.where(flat[:, None], torch.zeros_like(g), g - g.mean(dim=1, keepdim=True))
    return (alpha * centred / float(f_norm)).reshape(-1).to(rewards.dtype)


def token_mean(per_token: torch.Tensor, n: int) -> torch.Tensor:
    return per_token.sum() / n


def build_gpg(logp_fn=masked, aggregate_fn=token_mean):
    """`gpg_loss` assembled from its parts; the method uses the defaults, a mutant swaps one."""

    def gpg_loss(logp: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor):
        """-(1/N) sum over the N valid tokens of A logp. Returns (loss, metrics): tokens (N) and rows."""
        m = check_logp(logp, mask)
        _, n, rows = row_counts(m)
        cdt = compute_dtype(logp.dtype)
        a = token_advantages(advantages, m, cdt)
        return aggregate_fn(-a * logp_fn(logp, m, cdt), n), {"tokens": n, "rows": rows}

    return gpg_loss


gpg_loss = build_gpg()
