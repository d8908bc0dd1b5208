"""TAPO mechanism run beside a GRPO control: real sampling, real behaviour log-probs, real updates.

Per seed and per arm (TAPO, GRPO control), from the same seeded initial policy:
`groups` rollout groups, each one prompt sampled `group_size` times, GRPO group
advantages from a programmatic verifier, then `inner_updates` proximal updates
against the same behaviour log-probs. Both arms use the same training prompts,
the same sampling stream, the same optimiser and the same number of updates;
validation accuracy is measured on the same fixed prompts with the same
sampling stream. The comparison is recorded as a diagnostic (formal=False):
three seeds of a 16-token toy model are not evidence of capability.

Which behaviour log-probs each proximal update is measured against is the
implementation's decision (`impl.proximal_logprobs`); every TAPO update is audited on
the run's own tensors (methods/tapo/audit.py: old log-probs, R~_t, eps_t, loss and its
gradient against the float64 loops, later updates off-policy with the clip binding), and
every update of both arms has its policy gradient audited (methods/common/audited.py).

This module is the harness only: each line here is a step the run depends on. What the
run measures about itself (gradient norms, counters, the audit, step records, validation
accuracy, comparisons) is methods/tapo/record.py, fed at each step.

A group whose rewards are all equal has all-zero advantages: the TAPO loss must
reject it (counted: `zero_adv_not_rejected` must stay 0) and the group is resampled
(up to `max_attempts` times, then skipped and counted). The control resamples on
the same rule.
"""

from __future__ import annotations

import torch

from engine.spec import registry
from methods.common.grpo import group_advantages, grpo_token_loss
from methods.common import audited, make_policy, paired
from methods.common.rollout import sample
from methods.common.tasks import TargetTokenTask
from methods.tapo.proximal import proximal_logprobs as project_proximal_logprobs
from methods.tapo.record import ARMS, RunRecord


@registry.check("tapo.mechanism")
def mechanism(impl, ctx) -> dict:
    p = ctx.params
    groups = int(p.get("groups", 3))
    group_size = int(p.get("group_size", 4))
    inner = int(p.get("inner_updates", 2))
    max_new = int(p.get("max_new_tokens", 6))
    lr = float(p.get("lr", 0.02))
    eps_min = float(p.get("eps_min", 0.1))
    eps_max = float(p.get("eps_max", 0.2))
    control_eps = float(p.get("control_clip_eps", 0.2))
    if paired.pairing(impl).control_clip_eps is not None:  # a planted slip in the control's clip (a mutant)
        control_eps = paired.pairing(impl).control_clip_eps
    n_val = int(p.get("validation_prompts", 8))
    val_samples = int(p.get("validation_samples", 4))
    max_attempts = int(p.get("max_attempts", 8))

    task = TargetTokenTask()
    train_prompts = task.prompts(groups, ctx.generator(101)).to(ctx.device)
    val_prompts = task.prompts(n_val, ctx.generator(102)).to(ctx.device)

    rec = RunRecord(ctx, impl, eps_min, eps_max, group_size)
    for arm in paired.arms(ctx, ARMS, method="tapo"):  # each arm's draws and updates logged (paired_control)
        policy = paired.arm_policy(impl, lambda: make_policy(ctx))  # the tiny GRU (or --policy), alike per arm
        opt = torch.optim.Adam(policy.parameters(), lr=lr)
        rec.start_arm(arm, policy)
        sampling = paired.stream(ctx, impl, 103)  # the same sampling stream for both arms
        for gi in range(groups):
            prompt = train_prompts[gi : gi + 1].expand(group_size, -1)
            rec.start_group()
            for _ in range(max_attempts):  # a zero-advantage group is resampled, up to max_attempts draws
                ro = sample(policy, prompt, max_new, sampling)
                ctx.meter.add_tokens(ro.n_tokens)
                rec.drawn()
                rewards = task.verify(ro.prompts, ro.responses, ro.mask)
                adv = group_advantages(rewards, group_size)
                if bool((adv != 0).any()):
                    break
                rec.zero_group(arm, ro, adv)
            else:
                rec.skipped(arm)
                continue
            rec.sampled(arm, policy)
            # the control is GRPO as the project writes it, its proximal updates included: the candidate's
            # proximal_logprobs is TAPO's (a defect there must not reach the arm it is compared with)
            proximal = impl.proximal_logprobs if arm == "tapo" else project_proximal_logprobs
            for k, logp, old_logp in proximal(policy, ro, inner):
                rec.before_update(policy)
                if arm == "tapo":
                    loss, met = impl.tapo_loss(logp, old_logp, adv, ro.mask, eps_min, eps_max, group_size=group_size)
                else:
                    loss, met = grpo_token_loss(logp, old_logp, adv, ro.mask, clip_eps=control_eps)
                rec.loss(arm, k, ro, logp, old_logp, adv, loss, met)
                paired.record_update(loss, {"logp": logp, "old_logp": old_logp, "advantages": adv, "mask": ro.mask,
                                            "rewards": rewards, "prompts": ro.prompts, "responses": ro.responses})
                opt.zero_grad(set_to_none=True)
                # the supervisor audits the gradient the backward leaves in its policy (the candidate's
                # vector-Jacobian product, where its proximal_logprobs scored the policy through a handle)
                up = audited.backward(ctx, loss, policy, arm=arm, where=f"group {gi}, k {k}",
                                      scored=[audited.responses("logp", logp, ro.prompts, ro.responses, ro.mask)])
                rec.backward_done(arm, up)
                ctx.meter.optimizer_step(opt)
                rec.stepped(arm, gi, k, ro, loss, policy)
        rec.validate(arm, policy, task, val_prompts, val_samples, max_new)
    rec.comparisons(groups, inner, n_val, val_samples)
    return rec.measurements()


from engine.kinds.paired_control import paired_run  # noqa: E402  (below: the lines above keep their numbers)

paired_run("tapo.mechanism")(mechanism)
