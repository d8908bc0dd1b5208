"""The GRPO control every method is run beside: a thin front to methods/grpo, the implementation specs/grpo.yaml
checks, so there is no second copy of the control's loss or its group advantages."""

from __future__ import annotations

from typing import Any, Callable

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


def grpo_control_update(ctx: Any, policy: torch.nn.Module, opt: torch.optim.Optimizer, prompts: torch.Tensor,
                        max_new_tokens: int, generator: torch.Generator, group_size: int,
                        rewards: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor],
                        arm: str = "grpo-control") -> None:
    """One update of a paired run's GRPO control arm: sample a response per prompt row (groups of `group_size`
    consecutive rows), score it with `rewards(prompts, responses, mask)` -> [B], and take one optimizer step on
    grpo_token_loss of the group advantages, the sampled tokens and the step counted by ctx.meter; its backward
    under the supervisor's gradient audit, as every arm's (methods/common/audited.py)."""
    from methods.common import audited, paired
    from methods.common.rollout import sample, sequence_logprobs

    planted = paired.planted()  # the arm audit's mutants plant a slip in the control's configuration here
    roll = sample(policy, prompts, max_new_tokens, generator)
    ctx.meter.add_tokens(roll.n_tokens)
    r = rewards(roll.prompts, roll.responses, roll.mask)
    adv = group_advantages(r, r.shape[0] if planted.control_adv_whole_batch else group_size)
    logp, _ = sequence_logprobs(policy, roll.prompts, roll.responses)
    clip = 0.2 if planted.control_clip_eps is None else planted.control_clip_eps
    loss, _ = grpo_token_loss(logp, roll.old_logp, adv.to(logp.dtype), roll.mask, clip_eps=clip)
    # what the loss was computed from, for the arm audit to recompute with the grpo spec's reference
    paired.record_update(loss, {"logp": logp, "old_logp": roll.old_logp, "advantages": adv, "mask": roll.mask,
                                "rewards": r, "prompts": roll.prompts, "responses": roll.responses})
    opt.zero_grad(set_to_none=True)
    audited.backward(ctx, loss, policy, arm=arm,
                     scored=[audited.responses("logp", logp, roll.prompts, roll.responses, roll.mask)])
    if planted.control_zero_grad:
        opt.zero_grad(set_to_none=True)
    ctx.meter.optimizer_step(opt)
