"""TAPO's sample inputs that YAML cannot say: a policy and a rollout it sampled, for proximal_logprobs."""

from __future__ import annotations

import torch

from engine.kinds.inputs import generator

# Input generation, not a mutation target of `contracts mutate`: it only draws what the contracts feed the method.
__mutate__ = False


@generator("tapo.rollout")
def rollout(g, case, ctx, inputs) -> dict:
    """A seeded tiny GRU policy on the run's device (float32 whatever the dtype under test) and a rollout of it:
    options: prompts (rows, default 2), prompt_len (default 3), new_tokens (default 4). `old_logp` is the
    rollout's behaviour log-probs, for contracts that compare against them."""
    from methods.common.policy import TinyGRUPolicy
    from methods.common.rollout import sample

    opt = inputs.get("options") or {}
    device = ctx.device if ctx is not None else torch.device("cpu")
    seed = ctx.seed if ctx is not None else 0
    policy = TinyGRUPolicy.seeded(seed, device)
    prompts = torch.randint(2, 16, (int(opt.get("prompts", 2)), int(opt.get("prompt_len", 3))), generator=g)
    ro = sample(policy, prompts.to(device), int(opt.get("new_tokens", 4)), g)
    return {"policy": policy, "rollout": ro, "behaviour_logp": ro.old_logp}
