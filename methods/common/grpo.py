"""The GRPO control every method is run beside: a thin front to methods/grpo, the implementation specs/grpo.yaml
checks, so there is no second copy of the control's loss or its group advantages."""

from __future__ import annotations

import torch

from methods.grpo.loss import group_advantages as _group_advantages
from methods.grpo.loss import grpo_loss


def group_advantages(rewards: torch.Tensor, group_size: int, eps: float = 1e-6) -> torch.Tensor:
    """(r - group mean) / (group std + eps) per group of `group_size` consecutive rows (methods.grpo)."""
    return _group_advantages(rewards, group_size, eps)


def grpo_token_loss(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor,
                    clip_eps: float = 0.2):
    """The control's loss: GRPO with the per-token ratio clipped to [1 - clip_eps, 1 + clip_eps], token mean over
    the call's valid tokens (methods.grpo.grpo_loss's defaults)."""
    return grpo_loss(logp, old_logp, advantages, mask, clip_low=clip_eps, clip_high=clip_eps)
