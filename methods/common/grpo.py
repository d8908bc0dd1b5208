"""GRPO group advantages and the token-level clipped loss: the control every method is run beside."""

from __future__ import annotations

import torch

from methods.common.masking import masked_mean, valid_where


def group_advantages(rewards: torch.Tensor, group_size: int, eps: float = 1e-6) -> torch.Tensor:
    """(r - group mean) / (group std + eps), per group of `group_size` consecutive rows.

    Two-pass variance in float64: the one-pass E[x^2] - E[x]^2 form shrinks
    advantages in low-variance groups (verl PR #6348).
    """
    r = rewards.double().reshape(-1, group_size)
    mean = r.mean(dim=1, keepdim=True)
    std = (r - mean).pow(2).mean(dim=1, keepdim=True).sqrt()
    return ((r - mean) / (std + eps)).reshape(-1).to(rewards.dtype)


def grpo_token_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_eps: float = 0.2,
):
    """PPO/GRPO clipped surrogate with the per-token ratio, token-mean over valid tokens."""
    m = mask.bool()
    adv = advantages[:, None].expand_as(logp) if advantages.dim() == 1 else advantages
    log_ratio = valid_where(logp - old_logp, m)
    ratio = torch.exp(log_ratio)
    unclipped = ratio * adv
    clipped = ratio.clamp(1 - clip_eps, 1 + clip_eps) * adv
    per_token = -torch.minimum(unclipped, clipped)
    loss = masked_mean(per_token, m)
    with torch.no_grad():
        clip_frac = masked_mean(((ratio - 1).abs() > clip_eps).to(logp.dtype), m)
    return loss, {"clip_fraction": float(clip_frac)}
