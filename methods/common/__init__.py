"""Shared pieces of the mechanism runs: tiny policies, tasks, rollout, GRPO."""

from methods.common import paired
from methods.common.masking import masked_mean, masked_sum, valid_where
from methods.common.policy import TinyGRUPolicy, make_policy, param_l2_change, snapshot, state_copy
from methods.common.rollout import Rollout, sample, sequence_logprobs
from methods.common.grpo import group_advantages, grpo_control_update, grpo_token_loss
from methods.common.tasks import TargetTokenTask
from methods.common import validation  # noqa: F401  (registers the learning kind's validation tasks)

__all__ = [
    "paired",
    "masked_mean",
    "masked_sum",
    "valid_where",
    "TinyGRUPolicy",
    "make_policy",
    "param_l2_change",
    "snapshot",
    "state_copy",
    "Rollout",
    "sample",
    "sequence_logprobs",
    "group_advantages",
    "grpo_control_update",
    "grpo_token_loss",
    "TargetTokenTask",
]
