"""TAPO's learning run: the mechanism's two arms on a budget where the toy task is clearly learnable.

The page-matched mechanism run (mechanism.py) takes one prompt per update and a handful of updates; nobody learns
anything there. This run keeps its harness (the seeded policy, the shared sampler and stream, GRPO group
advantages, the implementation's proximal updates and tapo_loss, the audited backward) and changes the budget:
each update samples `prompts_per_update` prompts x `group_size` responses, drops the groups whose rewards are all
equal (their advantages are all 0 and TAPO's loss refuses them, so the update trains on the rest, as dynamic
sampling does), and takes `inner_updates` proximal updates. The GRPO control takes the same prompts, stream and
updates. What each arm learned is measured by the learning kind (engine/kinds/learning.py), never here.
"""

from __future__ import annotations

import torch

from engine.kinds.paired_control import paired_run
from methods.common import audited, make_policy, paired
from methods.common.grpo import group_advantages, grpo_token_loss
from methods.common.rollout import Rollout, sample
from methods.common.tasks import TargetTokenTask
from methods.tapo.proximal import proximal_logprobs as project_proximal_logprobs
from methods.tapo.record import ARMS

SETTINGS = ("updates", "prompts_per_update", "group_size", "inner_updates", "max_new_tokens", "hidden_size", "lr",
            "eps_min", "eps_max", "control_clip_eps")


def settings(params) -> dict:
    """The run's settings from the contract's params; a missing one is a spec error, never a silent default."""
    missing = [k for k in SETTINGS if k not in params]
    if missing:
        raise ValueError(f"the TAPO learning run's params must set {', '.join(missing)}")
    return {k: params[k] for k in SETTINGS}


def informative(ro: Rollout, adv: torch.Tensor, rewards: torch.Tensor, group_size: int):
    """The rollout's groups whose advantages are not all 0 (None when there is none)."""
    rows = (adv.view(-1, group_size) != 0).any(1).repeat_interleave(group_size)
    if not bool(rows.any()):
        return None
    keep = Rollout(prompts=ro.prompts[rows], responses=ro.responses[rows], mask=ro.mask[rows],
                   old_logp=ro.old_logp[rows])
    return keep, adv[rows], rewards[rows]


@paired_run("tapo.learning")
def learning(impl, ctx) -> None:
    cfg = settings(ctx.params)
    G, inner = int(cfg["group_size"]), int(cfg["inner_updates"])
    task = TargetTokenTask()
    for arm in paired.arms(ctx, ARMS, method="tapo"):
        policy = paired.arm_policy(impl, lambda: make_policy(ctx, hidden_size=int(cfg["hidden_size"])))
        opt = torch.optim.Adam(policy.parameters(), lr=float(cfg["lr"]))
        sampling = paired.stream(ctx, impl, 201)  # prompts and responses: the same stream for both arms
        proximal = impl.proximal_logprobs if arm == "tapo" else project_proximal_logprobs
        for u in range(int(cfg["updates"])):
            prompts = task.prompts(int(cfg["prompts_per_update"]), sampling).repeat_interleave(G, 0).to(ctx.device)
            ro = sample(policy, prompts, int(cfg["max_new_tokens"]), sampling)
            ctx.meter.add_tokens(ro.n_tokens)
            rewards = task.verify(ro.prompts, ro.responses, ro.mask)
            kept = informative(ro, group_advantages(rewards, G), rewards, G)
            if kept is None:
                continue
            ro, adv, rewards = kept
            for k, logp, old_logp in proximal(policy, ro, inner):
                if (arm == "tapo") != paired.pairing(impl).arms_swapped:  # a planted swap (a mutant) only
                    loss, _ = impl.tapo_loss(logp, old_logp, adv, ro.mask, float(cfg["eps_min"]),
                                             float(cfg["eps_max"]), group_size=G)
                else:
                    loss, _ = grpo_token_loss(logp, old_logp, adv, ro.mask, clip_eps=float(cfg["control_clip_eps"]))
                paired.record_update(loss, {"logp": logp, "old_logp": old_logp, "advantages": adv, "mask": ro.mask,
                                            "rewards": rewards, "prompts": ro.prompts, "responses": ro.responses})
                opt.zero_grad(set_to_none=True)
                audited.backward(ctx, loss, policy, arm=arm, where=f"update {u}, k {k}",
                                 scored=[audited.responses("logp", logp, ro.prompts, ro.responses, ro.mask)])
                ctx.meter.optimizer_step(opt)
