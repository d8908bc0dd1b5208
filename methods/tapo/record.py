"""What the TAPO mechanism run measures and records about itself.

mechanism.py is the harness: it samples, scores, resamples zero-advantage groups and takes
the proximal updates, and each of those steps is a decision the run depends on. Everything
it *measures* about that run lives here: gradient norms, parameter changes, the counters,
the first update's ratio, the probe that the loss refuses a zero-advantage group, the
per-update audit against the float64 loops (audit.py), the step records, the validation
accuracy and the comparisons (the page's figures beside this run's, never judged).
"""

from __future__ import annotations

import math

import torch

from engine.run import run_audit
from methods.common.policy import param_l2_change, snapshot, state_copy
from methods.common.rollout import sample
from methods.tapo.audit import ProximalAudit

# Check code, not a mutation target: it measures the harness's run and decides nothing in it (a bug here weakens a
# contract, which the spec's mutants show; it cannot make the method wrong).
__mutate__ = False

ARMS = ("tapo", "grpo-control")
# What tapo_loss's metrics dict declares (the interface), each compared with the supervisor's own figure.
REPORTED = ("ratio_min", "ratio_max", "clip_fraction", "clip_active_fraction", "tokens", "eps_lo", "eps_hi")


def _dev(r: float) -> float:
    return math.inf if math.isnan(r) else abs(r - 1.0)


def grad_norm(module: torch.nn.Module) -> float:
    total = torch.zeros((), dtype=torch.float64)
    for p in module.parameters():
        if p.grad is not None:
            total += p.grad.detach().double().pow(2).sum().cpu()
    return float(total.sqrt())


@torch.no_grad()
def accuracy(policy, task, prompts, samples, max_new_tokens, generator, meter) -> float:
    rep = prompts.repeat_interleave(samples, dim=0)
    ro = sample(policy, rep, max_new_tokens, generator)
    meter.add_tokens(ro.n_tokens)
    return float(task.verify(ro.prompts, ro.responses, ro.mask).mean())


class RunRecord:
    """The mechanism run's measurements, fed by the harness at each step it takes."""

    def __init__(self, ctx, impl, eps_min: float, eps_max: float, group_size: int) -> None:
        self.ctx, self.impl = ctx, impl
        self.eps_min, self.eps_max, self.group_size = eps_min, eps_max, group_size
        self.res = {arm: {"updates": 0, "grad": [], "change": [], "nonfinite": 0, "skipped": 0, "zero": 0}
                    for arm in ARMS}
        self.zero_not_rejected = 0
        self.first_ratio_dev = 0.0
        self.first_updates = 0
        self.audit = ProximalAudit()
        self.acc: dict[str, float] = {}
        self.behaviour = None
        self._draws = 0
        self._group = -1  # the arm's group being updated (the run's gi)
        self._before = None
        self._ratios = (math.nan, math.nan, math.nan)

    def start_arm(self, arm: str, policy) -> None:
        # A copy of the behaviour policy, refreshed at each group's sampling: what the audit re-scores with.
        self.behaviour = snapshot(policy) if arm == "tapo" else None
        self._group = -1

    def start_group(self) -> None:
        self._draws = 0
        self._group += 1

    def drawn(self) -> None:
        self._draws += 1

    def zero_group(self, arm: str, ro, adv) -> None:
        """A draw whose advantages are all zero: counted, and the TAPO loss must refuse it."""
        self.res[arm]["zero"] += 1
        if arm == "tapo":
            try:
                self.impl.tapo_loss(ro.old_logp, ro.old_logp, adv, ro.mask, self.eps_min, self.eps_max,
                                    group_size=self.group_size)
                self.zero_not_rejected += 1
            except ValueError:
                pass

    def skipped(self, arm: str) -> None:
        self.res[arm]["skipped"] += 1

    def sampled(self, arm: str, policy) -> None:
        """The group the updates will use was sampled by `policy` as it is now: keep it as the behaviour policy."""
        if arm == "tapo":
            self.behaviour.load_state_dict(policy.state_dict())

    def before_update(self, policy) -> None:
        self._before = state_copy(policy)

    def loss(self, arm: str, k: int, ro, logp, old_logp, adv, loss, met) -> None:
        """The update's loss, before its backward: the audit (TAPO) and the ratio extremes (both arms), computed
        here from the tensors the update used; the loss's own metrics dict is only compared with them."""
        if arm == "tapo":
            fig = self.audit.update(self.impl, self.behaviour, ro, k, logp, old_logp, adv, loss, self.eps_min,
                                    self.eps_max)
            self._report(fig, met, f"group {self._group}, k {k}")
            rmin, rmax, clip = fig["ratio_min"], fig["ratio_max"], fig["clip_fraction"]
        else:
            with torch.no_grad():
                ratio = torch.exp(torch.where(ro.mask, logp.double() - old_logp.double(),
                                              torch.zeros((), dtype=torch.float64, device=logp.device)))
                rmin = float(torch.where(ro.mask, ratio, torch.full_like(ratio, math.inf)).min())
                rmax = float(torch.where(ro.mask, ratio, torch.full_like(ratio, -math.inf)).max())
                eps = float(self.ctx.params.get("control_clip_eps", 0.2))
                clip = float(((ratio > 1.0 + eps) | (ratio < 1.0 - eps))[ro.mask].double().mean())
        if k == 0:  # first update: the policy is the behaviour policy, the ratio must be 1
            self.first_ratio_dev = max(self.first_ratio_dev, _dev(rmin), _dev(rmax))
            self.first_updates += 1
        self._ratios = (rmin, rmax, clip)

    def _report(self, fig: dict, met, where: str) -> None:
        """The candidate's metrics beside the supervisor's figures (the reported_metrics contract compares them);
        a token within rounding of a clip bound may be counted on either side."""
        met = met if isinstance(met, dict) else {}
        audit = run_audit.of(self.ctx)
        slack = {"clip_fraction": fig["ambiguous_fraction"], "clip_active_fraction": fig["ambiguous_fraction"]}
        for key in REPORTED:
            audit.report(arm="tapo", function="tapo_loss", key=key, reported=met.get(key), measured=fig[key],
                         slack=slack.get(key, 0.0), where=where)

    def backward_done(self, arm: str, upstream: dict) -> None:
        """After the update's backward: the loss's gradient as it reached the log-probs, against the loop's."""
        if arm == "tapo":
            self.audit.gradient(upstream.get("logp"))

    def stepped(self, arm: str, group: int, k: int, ro, loss, policy) -> None:
        """After the optimiser step: gradient norm, parameter change, the step record."""
        r = self.res[arm]
        gnorm = grad_norm(policy)
        change = param_l2_change(self._before, policy)
        lval = float(loss.detach())
        r["nonfinite"] += int(not (math.isfinite(lval) and math.isfinite(gnorm)))
        r["updates"] += 1
        r["grad"].append(gnorm)
        r["change"].append(change)
        rmin, rmax, clip = self._ratios
        self.ctx.record_step(arm=arm, group=group, update=k, attempts=self._draws, loss=lval, ratio_min=rmin,
                             ratio_max=rmax, clip_fraction=clip, grad_norm=gnorm, param_l2_change=change,
                             tokens=ro.n_tokens, response_tokens_max=int(ro.mask.sum(dim=1).max()))

    def validate(self, arm: str, policy, task, prompts, samples, max_new_tokens) -> None:
        self.acc[arm] = accuracy(policy, task, prompts, samples, max_new_tokens, self.ctx.generator(104),
                                 self.ctx.meter)

    def comparisons(self, groups: int, inner: int, n_val: int, val_samples: int) -> None:
        acc = self.acc
        self.ctx.record_comparison(
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
        self._page_diagnostic()

    def _page_diagnostic(self) -> None:
        """The page's own local-protocol figures beside this run's, as a diagnostic comparison.

        The page measured on an A100 (Qwen2.5-0.5B-Instruct with LoRA, 512-token responses):
        per seed TAPO vs the GRPO control. This run's protocol differs (spec assumption
        `page_protocol`), so the figures are recorded side by side and never judged.
        """
        ctx, p, acc = self.ctx, self.ctx.params, self.acc
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

    def measurements(self) -> dict:
        t, c = self.res["tapo"], self.res["grpo-control"]
        for metric, why in self.audit.unmeasured.items():
            self.ctx.not_applicable(why, metric)
        return {
            "updates_made": t["updates"],
            "control_updates": c["updates"],
            "min_grad_norm": min(t["grad"], default=0.0),
            "min_param_l2_change": min(t["change"], default=0.0),
            "control_min_grad_norm": min(c["grad"], default=0.0),
            "control_min_param_l2_change": min(c["change"], default=0.0),
            "nonfinite_steps": t["nonfinite"] + c["nonfinite"],
            "first_update_ratio_max_dev": self.first_ratio_dev,
            "first_updates": self.first_updates,
            "zero_adv_groups": t["zero"],
            "zero_adv_not_rejected": self.zero_not_rejected,
            "skipped_groups": t["skipped"] + c["skipped"],
            "tapo_val_acc": self.acc["tapo"],
            "control_val_acc": self.acc["grpo-control"],
            "tokens": self.ctx.meter.tokens,
            **self.audit.measurements(),
        }
