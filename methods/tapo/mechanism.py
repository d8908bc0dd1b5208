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
the run's own tensors (methods/tapo/audit.py): old log-probs against the behaviour
policy's re-scoring, R~_t, eps_t, loss and gradient against the float64 loops, and
whether later updates were off-policy with the clip binding.

A group whose rewards are all equal has all-zero advantages: the TAPO loss must
reject it (counted: `zero_adv_not_rejected` must stay 0) and the group is resampled
(up to `max_attempts` times, then skipped and counted). The control resamples on
the same rule.
"""

from __future__ import annotations

import math

import torch

from engine.spec import registry
from methods.common.grpo import group_advantages, grpo_token_loss
from methods.common.policy import make_policy, param_l2_change, snapshot, state_copy
from methods.common.rollout import sample, sequence_logprobs
from methods.common.tasks import TargetTokenTask
from methods.tapo.audit import ProximalAudit

ARMS = ("tapo", "grpo-control")


def _grad_norm(module: torch.nn.Module) -> float:
    total = torch.zeros((), dtype=torch.float64)
    for p in module.parameters():
        if p.grad is not None:
            total += p.grad.detach().double().pow(2).sum().cpu()
    return float(total.sqrt())


@torch.no_grad()
def _accuracy(policy, task, prompts, samples, max_new_tokens, generator, meter) -> float:
    rep = prompts.repeat_interleave(samples, dim=0)
    ro = sample(policy, rep, max_new_tokens, generator)
    meter.add_tokens(ro.n_tokens)
    return float(task.verify(ro.prompts, ro.responses, ro.mask).mean())


def _record_page_diagnostic(ctx, p: dict, acc: dict) -> None:
    """The page's own local-protocol figures beside this run's, as a diagnostic comparison.

    The page measured on an A100 (Qwen2.5-0.5B-Instruct with LoRA, 512-token responses):
    per seed TAPO vs the GRPO control. This run's protocol differs (spec assumption
    `page_protocol`), so the figures are recorded side by side and never judged.
    """
    seeds = [int(s) for s in p.get("page_seeds", [])]
    page_m = [float(v) for v in p.get("page_accuracy", [])]
    page_c = [float(v) for v in p.get("page_control_accuracy", [])]
    if not seeds or len(page_m) != len(seeds) or len(page_c) != len(seeds):
        return
    if ctx.seed in seeds:
        i = seeds.index(ctx.seed)
        mv, cv, which = [page_m[i]], [page_c[i]], f"the page's seed {ctx.seed}"
    else:
        mv, cv, which = page_m, page_c, f"the page's seeds {'/'.join(map(str, seeds))} (this seed is not one of them)"
    ctx.record_comparison(
        name="page_validation_accuracy",
        method="tapo (page, A100)",
        control="grpo-control (page, A100)",
        method_values=mv,
        control_values=cv,
        metric="accuracy",
        formal=False,
        note=(
            f"page-reported, {which}: TAPO mean {sum(page_m) / len(page_m):.4f} vs GRPO control "
            f"{sum(page_c) / len(page_c):.4f}; this run measured TAPO {acc['tapo']:.4f} vs control "
            f"{acc['grpo-control']:.4f} on seed {ctx.seed} under a different protocol (spec assumption page_protocol)"
        ),
    )


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
    n_val = int(p.get("validation_prompts", 8))
    val_samples = int(p.get("validation_samples", 4))
    max_attempts = int(p.get("max_attempts", 8))

    task = TargetTokenTask()
    train_prompts = task.prompts(groups, ctx.generator(101)).to(ctx.device)
    val_prompts = task.prompts(n_val, ctx.generator(102)).to(ctx.device)

    res = {arm: {"updates": 0, "grad": [], "change": [], "nonfinite": 0, "skipped": 0, "zero": 0} for arm in ARMS}
    zero_not_rejected = 0
    first_ratio_dev = 0.0
    no_ratio_metrics = False
    audit = ProximalAudit()
    acc = {}
    for arm in ARMS:
        r = res[arm]
        policy = make_policy(ctx)  # the tiny GRU, or the run's --policy (e.g. a checkpoint)
        opt = torch.optim.Adam(policy.parameters(), lr=lr)
        behaviour = snapshot(policy) if arm == "tapo" else None
        sampling = ctx.generator(103)  # the same sampling stream for both arms
        for gi in range(groups):
            prompt = train_prompts[gi : gi + 1].expand(group_size, -1)
            ro = adv = None
            for attempt in range(1, max_attempts + 1):
                ro = sample(policy, prompt, max_new, sampling)
                ctx.meter.add_tokens(ro.n_tokens)
                adv = group_advantages(task.verify(ro.prompts, ro.responses, ro.mask), group_size)
                if bool((adv != 0).any()):
                    break
                r["zero"] += 1
                if arm == "tapo":  # the loss itself must refuse a zero-advantage group
                    try:
                        impl.tapo_loss(ro.old_logp, ro.old_logp, adv, ro.mask, eps_min, eps_max, group_size=group_size)
                        zero_not_rejected += 1
                    except ValueError:
                        pass
            else:
                r["skipped"] += 1
                continue
            if arm == "tapo":  # the behaviour policy, kept to re-score what each update is measured against
                behaviour.load_state_dict(policy.state_dict())
            for k, logp, old_logp in impl.proximal_logprobs(policy, ro, inner):
                before = state_copy(policy)
                if arm == "tapo":
                    loss, met = impl.tapo_loss(logp, old_logp, adv, ro.mask, eps_min, eps_max, group_size=group_size)
                    rmin, rmax, clip = met.get("ratio_min"), met.get("ratio_max"), met.get("clip_fraction")
                    if rmin is None or rmax is None:  # a framework loss may report none: its R^ stays unseen
                        no_ratio_metrics = True
                    audit.update(impl, behaviour, ro, k, logp, old_logp, adv, loss, met, eps_min, eps_max)
                else:
                    loss, met = grpo_token_loss(logp, old_logp, adv, ro.mask, clip_eps=control_eps)
                    with torch.no_grad():
                        ratio = torch.exp(torch.where(ro.mask, logp - old_logp, torch.zeros_like(logp)))
                        rmin = float(torch.where(ro.mask, ratio, torch.full_like(ratio, math.inf)).min())
                        rmax = float(torch.where(ro.mask, ratio, torch.full_like(ratio, -math.inf)).max())
                    clip = met["clip_fraction"]
                if k == 0 and rmin is not None and rmax is not None:  # first update: on-policy, the ratio is 1
                    first_ratio_dev = max(first_ratio_dev, abs(rmin - 1.0), abs(rmax - 1.0))
                opt.zero_grad(set_to_none=True)
                if loss.requires_grad:
                    loss.backward()
                gnorm = _grad_norm(policy)
                ctx.meter.optimizer_step(opt)
                change = param_l2_change(before, policy)
                lval = float(loss.detach())
                r["nonfinite"] += int(not (math.isfinite(lval) and math.isfinite(gnorm)))
                r["updates"] += 1
                r["grad"].append(gnorm)
                r["change"].append(change)
                ctx.record_step(
                    arm=arm,
                    group=gi,
                    update=k,
                    attempts=attempt,
                    loss=lval,
                    ratio_min=rmin,
                    ratio_max=rmax,
                    clip_fraction=clip,
                    grad_norm=gnorm,
                    param_l2_change=change,
                    tokens=ro.n_tokens,
                    response_tokens_max=int(ro.mask.sum(dim=1).max()),
                )
        acc[arm] = _accuracy(policy, task, val_prompts, val_samples, max_new, ctx.generator(104), ctx.meter)

    ctx.record_comparison(
        name="validation_accuracy",
        method="tapo",
        control="grpo-control",
        method_values=[acc["tapo"]],
        control_values=[acc["grpo-control"]],
        metric="accuracy",
        formal=False,
        note=(
            f"diagnostic only: {n_val} fixed validation prompts x {val_samples} samples, tiny GRU, "
            f"{groups} groups x {inner} proximal updates; not evidence of capability"
        ),
    )
    _record_page_diagnostic(ctx, p, acc)
    t, c = res["tapo"], res["grpo-control"]
    for metric, why in audit.unmeasured.items():
        ctx.not_applicable(why, metric)
    if no_ratio_metrics:
        ctx.not_applicable("tapo_loss reported no ratio_min/ratio_max metrics, so its own ratio at the first "
                           "(on-policy) update is unseen", "first_update_ratio_max_dev")
    return {
        "updates_made": t["updates"],
        "control_updates": c["updates"],
        "min_grad_norm": min(t["grad"], default=0.0),
        "min_param_l2_change": min(t["change"], default=0.0),
        "control_min_grad_norm": min(c["grad"], default=0.0),
        "control_min_param_l2_change": min(c["change"], default=0.0),
        "nonfinite_steps": t["nonfinite"] + c["nonfinite"],
        **({} if no_ratio_metrics else {"first_update_ratio_max_dev": first_ratio_dev}),
        "zero_adv_groups": t["zero"],
        "zero_adv_not_rejected": zero_not_rejected,
        "skipped_groups": t["skipped"] + c["skipped"],
        "tapo_val_acc": acc["tapo"],
        "control_val_acc": acc["grpo-control"],
        "tokens": ctx.meter.tokens,
        **audit.measurements(),
    }
