"""TAPO's proximal updates: which behaviour log-probs each update is measured against.

The page's training loop samples a rollout group once, scores the sampled tokens with the
behaviour policy at sampling time (`Rollout.old_logp`), then takes several proximal updates
against those same log-probs. That pairing is the method's decision, not bookkeeping: if
the old log-probs were re-scored from the current policy before each update, every ratio
would be 1, the prefix ratio and the length-aware clip would never act, and TAPO would
collapse to an on-policy policy gradient. It lives here, in the implementation the
contracts receive, so a defect in it is one the contracts must catch.
"""

from __future__ import annotations

from typing import Iterator

import torch

from methods.common.rollout import Rollout, sequence_logprobs


def proximal_logprobs(policy, rollout: Rollout, inner_updates: int) -> Iterator[tuple[int, torch.Tensor, torch.Tensor]]:
    """Yield (k, logp, old_logp) for the k-th of `inner_updates` proximal updates on one rollout.

    `logp` is the current policy's log-prob of each sampled token (with grad), scored when
    the update is about to be taken (the caller steps its optimiser between yields);
    `old_logp` is always the rollout's behaviour log-probs, never re-scored.
    """
    if isinstance(inner_updates, bool) or not isinstance(inner_updates, int) or inner_updates < 1:
        raise ValueError(f"inner_updates must be an integer >= 1, got {inner_updates!r}")
    for k in range(inner_updates):
        logp, _ = sequence_logprobs(policy, rollout.prompts, rollout.responses)
        yield k, logp, rollout.old_logp
