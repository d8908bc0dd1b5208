"""Dr. GRPO (arXiv 2503.20783, "Understanding R1-Zero-Like Training"): GRPO without its two biases.

    A_i   = R_i - mean_{j in g(i)} R_j                                               no division by the group std
    r_i,t = exp(clamp(logp_i,t - old_i,t, -C, C))
    f_i,t = -min(r A, clip(r, 1 - eps_low, 1 + eps_high) A)
    L     = (1 / (G C_L)) sum_i sum_t f_i,t                                          no 1/|o_i|: a constant C_L

G is the number of responses with a valid token; C_L is a constant length (the generation budget; `norm_length`,
default the padded length L), the same for every response, so no response's tokens weigh more for being short.
"""

from __future__ import annotations

import torch

from methods.common.masking import as_bool_mask
from methods.common.pg_inputs import check_clamp, check_length, check_logp, check_number, compute_dtype, log_ratio, \
    row_counts, token_advantages

CLIP_LOW, CLIP_HIGH = 0.2, 0.2
LOG_RATIO_CLAMP = 20.0

__all__ = ["build_dr_grpo", "dr_grpo_loss", "group_advantages", "clipped_surrogate", "clamp_log_ratio",
           "constant_normaliser"]


def group_advantages(rewards: torch.Tensor, group_size: int, *, mask: torch.Tensor | None = None) -> torch.Tensor:
    """R - group mean per group of `group_size` consecutive rows, in float64, returned in the rewards' dtype.
    `mask` ([B, L] response mask or [B] row flags) leaves fully masked responses out of their group's mean; they get
    0, and so does every row of a group with no counted row."""
    if rewards.dim() != 1:
        raise ValueError(f"rewards must be [B], got shape {tuple(rewards.shape)}")
    B = rewards.shape[0]
    check_length("group_size", group_size)
    if B % group_size:
        raise ValueError(f"group_size must divide the batch of {B}, got {group_size}")
    keep = torch.ones(B, dtype=torch.bool, device=rewards.device)
    if mask is not None:
        if mask.dim() not in (1, 2) or mask.shape[0] != B:
            raise ValueError(f"mask must be [B, L] or [B] with B = {B}, got shape {tuple(mask.shape)}")
        keep = as_bool_mask(mask)
        keep = keep.any(dim=-1) if keep.dim() == 2 else keep
    zero = torch.zeros((), dtype=torch.float64, device=rewards.device)
    r = torch.where(keep, rewards.detach().double(), zero)
    if not bool(torch.isfinite(r).all()):
        raise ValueError("rewards hold NaN or inf for a response that has valid tokens")
    r, k = r.reshape(-1, group_size), keep.reshape(-1, group_size)
    mean = r.sum(dim=1, keepdim=True) / k.sum(dim=1, keepdim=True).clamp_min(1)
    return torch.where(k, r - mean, zero).reshape(-1).to(rewards.dtype)


def clipped_surrogate(r: torch.Tensor, a: torch.Tensor, lo: float, hi: float) -> torch.Tensor:
    """-min(r A, clip(r, lo, hi) A) per token; 0 where A = 0 (masked slots)."""
    return torch.maximum(r * -a, r.clamp(lo, hi) * -a)


def constant_normaliser(per_token: torch.Tensor, n_row: torch.Tensor, rows: int, length: int) -> torch.Tensor:
    """The token sum over G responses times the constant length: every token of every response weighs 1/(G C_L)."""
    return per_token.sum() / (rows * length)


def clamp_log_ratio(lr: torch.Tensor, c: float) -> torch.Tensor:
    """The overflow guard: the log-ratio clamped to [-C, C] before exp (a binding clamp passes no gradient)."""
    return lr.clamp(-c, c)


def build_dr_grpo(ratio_fn=log_ratio, guard_fn=clamp_log_ratio, surrogate_fn=clipped_surrogate,
                  aggregate_fn=constant_normaliser):
    """`dr_grpo_loss` assembled from its parts; the method uses the defaults, a mutant swaps one."""

    def dr_grpo_loss(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor, *,
                     clip_low: float = CLIP_LOW, clip_high: float = CLIP_HIGH, norm_length: int | None = None,
                     log_ratio_clamp: float = LOG_RATIO_CLAMP):
        """The Dr. GRPO loss (module docstring). Returns (loss, metrics): tokens and rows (G)."""
        m = check_logp(logp, mask, ("old_logp", old_logp))
        lo = 1.0 - check_number("clip_low", clip_low, below=1.0)
        hi = 1.0 + check_number("clip_high", clip_high)
        length = m.shape[-1] if norm_length is None else check_length("norm_length", norm_length)
        c = check_clamp(log_ratio_clamp)
        n_row, n, rows = row_counts(m)
        cdt = compute_dtype(logp.dtype)
        a = token_advantages(advantages, m, cdt)
        r = guard_fn(ratio_fn(logp, old_logp, m, cdt), c).exp()
        loss = aggregate_fn(surrogate_fn(r, a, lo, hi), n_row, rows, length)
        return loss, {"tokens": n, "rows": rows}

    return dr_grpo_loss


dr_grpo_loss = build_dr_grpo()
