"""Known-bad TAPO variants, one deliberate defect each; every one must be killed.

Where a defect lives in a part the loss is built from (ratio, clip schedule, guard,
surrogate), the mutant rebuilds the loss from the broken part with
`build_tapo_loss`, so `trajectory_ratio` / `length_aware_clip` and `tapo_loss` carry
the same single defect consistently.
"""

from __future__ import annotations

import torch

from engine.spec import registry
from methods.common.rollout import sequence_logprobs
from methods.common.source_edit import recompile
from methods.tapo import objective
from methods.tapo.impl import IMPL
from methods.tapo.objective import (
    as_bool_mask,
    build_tapo_loss,
    clip_schedule,
    compute_dtype,
    prefix_log_ratio,
    reject_zero_advantage_groups,
    trajectory_ratio,
)


def _clip_from(schedule):
    def length_aware_clip(T, eps_min, eps_max, *, dtype=torch.float64, device=None):
        pos = torch.arange(1, T + 1, dtype=torch.float64, device=device)
        return schedule(pos, torch.tensor(float(T), dtype=torch.float64, device=device), eps_min, eps_max).to(dtype)

    return length_aware_clip


def _with_ratio(name, ratio_fn):
    return IMPL.replace(name, trajectory_ratio=ratio_fn, tapo_loss=build_tapo_loss(ratio_fn=ratio_fn))


# --- ratio defects ---------------------------------------------------------


def _ratio_prefix_grad_leak(logp, old_logp, mask):
    """Stop-gradient dropped: R~_t with its full gradient (1/t into every earlier position)."""
    m = as_bool_mask(mask, logp.shape)
    cdt = compute_dtype(logp.dtype)
    zero = torch.zeros((), dtype=cdt, device=logp.device)
    delta = torch.where(m, logp.to(cdt) - old_logp.detach().to(cdt), zero)
    count = m.cumsum(-1).clamp_min(1).to(cdt)
    return torch.exp(torch.where(m, delta.cumsum(-1) / count, zero))


@registry.mutant("tapo.prefix_grad_leak", base="tapo")
def prefix_grad_leak():
    return _with_ratio("tapo.prefix_grad_leak", _ratio_prefix_grad_leak)


def _ratio_from_prefix_mean(logp, old_logp, mask, prefix_mean):
    """The ratio's own form, R~_t (no gradient) times exp(logp_t - sg(logp_t)), with the running mean of
    delta = logp - old_logp (zero at masked slots) computed by `prefix_mean(delta, m, cdt)`: the one part the
    mutants below change."""
    m = as_bool_mask(mask, logp.shape)
    cdt = compute_dtype(logp.dtype)
    zero = torch.zeros((), dtype=cdt, device=logp.device)
    with torch.no_grad():
        delta = torch.where(m, logp.detach().to(cdt) - old_logp.detach().to(cdt), zero)
        r_tilde = torch.exp(torch.where(m, prefix_mean(delta, m, cdt), zero))
    lv = torch.where(m, logp.to(cdt), zero)
    return r_tilde * torch.exp(lv - lv.detach())


def _ratio_count_padding(logp, old_logp, mask):
    """t is the position in the row (prompt, padding and holes counted), not the valid-token count."""
    def over_position(delta, m, cdt):
        return delta.cumsum(-1) / torch.arange(1, delta.shape[-1] + 1, dtype=cdt, device=delta.device)

    return _ratio_from_prefix_mean(logp, old_logp, mask, over_position)


@registry.mutant("tapo.prefix_count_padding", base="tapo")
def prefix_count_padding():
    return _with_ratio("tapo.prefix_count_padding", _ratio_count_padding)


def _ratio_one_over_t(logp, old_logp, mask):
    """Value right, gradient R~_t / t * d logp_t (the 1/t dilution Eq15 removes)."""
    m = as_bool_mask(mask, logp.shape)
    cdt = compute_dtype(logp.dtype)
    zero = torch.zeros((), dtype=cdt, device=logp.device)
    r_tilde = torch.exp(prefix_log_ratio(logp, old_logp, m))
    count = m.cumsum(-1).clamp_min(1).to(cdt)
    lv = torch.where(m, logp.to(cdt), zero)
    return r_tilde * torch.exp((lv - lv.detach()) / count)


@registry.mutant("tapo.grad_one_over_t", base="tapo")
def grad_one_over_t():
    return _with_ratio("tapo.grad_one_over_t", _ratio_one_over_t)


def _ratio_mask_multiply(logp, old_logp, mask):
    """Masks applied by multiplication: NaN * 0 = NaN leaks from prompt/padding slots."""
    m = as_bool_mask(mask, logp.shape)
    cdt = compute_dtype(logp.dtype)
    mf = m.to(cdt)
    with torch.no_grad():
        delta = (logp.detach().to(cdt) - old_logp.detach().to(cdt)) * mf
        count = m.cumsum(-1).clamp_min(1).to(cdt)
        r_tilde = torch.exp(delta.cumsum(-1) / count * mf)
    lv = logp.to(cdt) * mf
    return r_tilde * torch.exp(lv - lv.detach())


@registry.mutant("tapo.mask_by_multiply", base="tapo")
def mask_by_multiply():
    return _with_ratio("tapo.mask_by_multiply", _ratio_mask_multiply)


def _ratio_lowp_cumsum(logp, old_logp, mask):
    """The prefix sum accumulated in bfloat16 (as under autocast), not float32 or wider."""
    def bf16_sum(delta, m, cdt):
        return delta.to(torch.bfloat16).cumsum(-1).to(cdt) / m.cumsum(-1).clamp_min(1).to(cdt)

    return _ratio_from_prefix_mean(logp, old_logp, mask, bf16_sum)


@registry.mutant("tapo.lowp_cumsum", base="tapo")
def lowp_cumsum():
    return _with_ratio("tapo.lowp_cumsum", _ratio_lowp_cumsum)


def _ratio_detached(logp, old_logp, mask):
    """The whole ratio under stop-gradient: the loss moves, its gradient is gone (cf. TRL PR #6140)."""
    return trajectory_ratio(logp, old_logp, mask).detach()


@registry.mutant("tapo.ratio_detached", base="tapo")
def ratio_detached():
    return _with_ratio("tapo.ratio_detached", _ratio_detached)


# --- clip schedule defects -------------------------------------------------


def _schedule_reversed(pos, T, eps_min, eps_max):
    """eps_1 = eps_min and eps_T = eps_max: the bound widens along the trajectory."""
    return eps_min + eps_max - clip_schedule(pos, T, eps_min, eps_max)


@registry.mutant("tapo.clip_reversed", base="tapo")
def clip_reversed():
    return IMPL.replace(
        "tapo.clip_reversed",
        length_aware_clip=_clip_from(_schedule_reversed),
        tapo_loss=build_tapo_loss(schedule_fn=_schedule_reversed),
    )


def _schedule_batch_max(pos, T, eps_min, eps_max):
    """T is the longest response of the batch for every row, not each response's own length."""
    return clip_schedule(pos, T.max().expand_as(T), eps_min, eps_max)


@registry.mutant("tapo.clip_t_batch_max", base="tapo")
def clip_t_batch_max():
    return IMPL.replace("tapo.clip_t_batch_max", tapo_loss=build_tapo_loss(schedule_fn=_schedule_batch_max))


# --- guard defects ---------------------------------------------------------


def _guard_none(adv, mask, group_size):
    """No zero-advantage check at all."""


@registry.mutant("tapo.zero_adv_accepted", base="tapo")
def zero_adv_accepted():
    return IMPL.replace("tapo.zero_adv_accepted", tapo_loss=build_tapo_loss(guard_fn=_guard_none))


def zero_adv_counts_masked_loss():
    """The zero-advantage test reads the raw advantages, masked slots included."""
    unguarded = build_tapo_loss(guard_fn=_guard_none)

    def tapo_loss(logp, old_logp, advantages, mask, eps_min, eps_max, horizon=None, *, group_size=None):
        raw = advantages[:, None].expand_as(logp) if advantages.dim() == 1 else advantages
        everywhere = torch.ones_like(as_bool_mask(mask, logp.shape))
        reject_zero_advantage_groups(raw, everywhere, group_size)
        return unguarded(logp, old_logp, advantages, mask, eps_min, eps_max, horizon, group_size=group_size)

    return tapo_loss


@registry.mutant("tapo.zero_adv_counts_masked", base="tapo")
def zero_adv_counts_masked():
    return IMPL.replace("tapo.zero_adv_counts_masked", tapo_loss=zero_adv_counts_masked_loss())


# --- surrogate defects -----------------------------------------------------


def _surrogate_optimistic(ratio, adv, eps):
    """max instead of PPO's pessimistic min: the clip never binds where it should."""
    clipped = torch.clamp(ratio, 1.0 - eps, 1.0 + eps)
    return -torch.maximum(ratio * adv, clipped * adv)


@registry.mutant("tapo.surrogate_optimistic", base="tapo")
def surrogate_optimistic():
    return IMPL.replace("tapo.surrogate_optimistic", tapo_loss=build_tapo_loss(surrogate_fn=_surrogate_optimistic))


def _surrogate_zero_adv_nan(ratio, adv, eps):
    """The surrogate multiplies an overflowed ratio by A = 0: inf * 0 = NaN in the value (no torch.where)."""
    clipped = torch.clamp(ratio, 1.0 - eps, 1.0 + eps)
    return -torch.minimum(ratio * adv, clipped * adv)


@registry.mutant("tapo.zero_adv_nan", base="tapo")
def zero_adv_nan():
    return IMPL.replace("tapo.zero_adv_nan", tapo_loss=build_tapo_loss(surrogate_fn=_surrogate_zero_adv_nan))


def _ratio_autograd_product(logp, old_logp, mask):
    """R^ written literally as sg[R~] * exp(logp - sg[logp]): autograd's product rule multiplies the clip's 0 by an
    overflowed R~, 0 * inf = NaN, at a token the clip removes."""
    return _ratio_from_prefix_mean(
        logp, old_logp, mask, lambda delta, m, cdt: delta.cumsum(-1) / m.cumsum(-1).clamp_min(1).to(cdt))


@registry.mutant("tapo.clipped_grad_nan", base="tapo")
def clipped_grad_nan():
    return _with_ratio("tapo.clipped_grad_nan", _ratio_autograd_product)


# --- proximal-update defects ---------------------------------------------------


def _proximal_recomputed(policy, rollout, inner_updates):
    """The old log-probs re-scored from the current policy before each proximal update."""
    for k in range(inner_updates):
        logp, _ = sequence_logprobs(policy, rollout.prompts, rollout.responses)
        with torch.no_grad():
            old, _ = sequence_logprobs(policy, rollout.prompts, rollout.responses)
        yield k, logp, torch.where(rollout.mask, old, torch.zeros_like(old))


@registry.mutant("tapo.old_logp_recomputed", base="tapo")
def old_logp_recomputed():
    return IMPL.replace("tapo.old_logp_recomputed", proximal_logprobs=_proximal_recomputed)


def _proximal_unchecked(policy, rollout, inner_updates):
    """No check of inner_updates: 0 (or a negative count) silently takes no update, True takes one."""
    for k in range(inner_updates):
        logp, _ = sequence_logprobs(policy, rollout.prompts, rollout.responses)
        yield k, logp, rollout.old_logp


@registry.mutant("tapo.inner_updates_unchecked", base="tapo")
def inner_updates_unchecked():
    return IMPL.replace("tapo.inner_updates_unchecked", proximal_logprobs=_proximal_unchecked)


# --- what crosses into the supervisor's policy, and what the loss reports about itself -------------------------
# The mechanism run's policy lives in the supervisor: proximal_logprobs scores it through a handle, and what reaches
# its parameters in backward is proximal_logprobs's own vector-Jacobian product. The gradient audit compares that
# gradient, and the values, with the supervisor's autograd of the declared scoring; the run takes every figure it
# judges from the tensors that crossed, and reported_metrics_agree compares the loss's metrics dict with them.


def _checked_inner(inner_updates) -> None:
    if isinstance(inner_updates, bool) or not isinstance(inner_updates, int) or inner_updates < 1:
        raise ValueError(f"inner_updates must be an integer >= 1, got {inner_updates!r}")


def _negated(logp: torch.Tensor) -> torch.Tensor:
    """logp's value with the gradient into the policy negated: sg[l] - (l - sg[l])."""
    return logp.detach() - (logp - logp.detach())


def _proximal_negated_later(policy, rollout, inner_updates):
    """Exact log-probs; from the second proximal update on, their gradient into the policy negated (cosine -1 with
    the honest one), so the later updates step away from the surrogate they report."""
    _checked_inner(inner_updates)
    for k in range(inner_updates):
        logp, _ = sequence_logprobs(policy, rollout.prompts, rollout.responses)
        yield k, (logp if k == 0 else _negated(logp)), rollout.old_logp


@registry.mutant("tapo.proximal_negated_later", base="tapo")
def proximal_negated_later():
    return IMPL.replace("tapo.proximal_negated_later", proximal_logprobs=_proximal_negated_later)


def _loss_reporting_on_policy(*args, **kwargs):
    """The loss as it is, its metrics saying every update was on-policy: R^ = 1 everywhere, nothing clipped."""
    loss, metrics = IMPL.tapo_loss(*args, **kwargs)
    return loss, {**metrics, "ratio_min": 1.0, "ratio_max": 1.0, "clip_fraction": 0.0, "clip_active_fraction": 0.0}


def _proximal_temperature_two(policy, rollout, inner_updates):
    """The policy scored at temperature 2, not at the sampling temperature 1 (TRL #4159's shape of bug)."""
    _checked_inner(inner_updates)
    for k in range(inner_updates):
        logp, _ = sequence_logprobs(policy, rollout.prompts, rollout.responses, temperature=2.0)
        yield k, logp, rollout.old_logp


@registry.mutant("tapo.reports_on_policy", base="tapo")
def reports_on_policy():
    return IMPL.replace("tapo.reports_on_policy", tapo_loss=_loss_reporting_on_policy)


@registry.mutant("tapo.temperature_two_reports_on_policy", base="tapo")
def temperature_two_reports_on_policy():
    return IMPL.replace("tapo.temperature_two_reports_on_policy", proximal_logprobs=_proximal_temperature_two,
                        tapo_loss=_loss_reporting_on_policy)


# --- fused-path defects ----------------------------------------------------------
# The default loss runs `_fused_tapo_loss` (and its autograd node `_FusedLoss`). These mutants
# are that very source with one edit, compiled beside the module, so each is a defect of the code
# the default run executes, not of a copy. An edit whose text is no longer found raises: a
# refactor of the fused path must restate its mutants, never silently drop one.


def _fused_variant(name: str, edits: list[tuple[str, str, str]]):
    """A tapo_loss whose fused path has `edits` applied: (function or class name, old text, new text).

    The fused node and the fused function are both recompiled into one namespace, so the
    function calls the (possibly edited) node beside it, never the module's original.
    """
    namespace = recompile(objective, ("_FusedLoss", "_fused_tapo_loss"), edits, name)
    return build_tapo_loss(fused_fn=namespace["_fused_tapo_loss"])


def _fused_mutant(mutant_name: str, edits: list[tuple[str, str, str]]):
    return IMPL.replace(mutant_name, tapo_loss=_fused_variant(mutant_name, edits))


@registry.mutant("tapo.fused_no_overflow_fallback", base="tapo")
def fused_no_overflow_fallback():
    """The fused loss keeps its result when a ratio overflowed (inf * 0 = NaN at masked slots)."""
    return _fused_mutant("tapo.fused_no_overflow_fallback", [(
        "_fused_tapo_loss",
        "if not math.isfinite(stats[2]):\n        return None",
        "pass",
    )])


@registry.mutant("tapo.fused_ignores_horizon", base="tapo")
def fused_ignores_horizon():
    """The fused loss checks `horizon` but schedules the clip with each response's own length."""
    return _fused_mutant("tapo.fused_ignores_horizon", [(
        "_fused_tapo_loss", "T = torch.full_like(count[:, :1], horizon)", "T = count[:, -1:]",
    )])


@registry.mutant("tapo.fused_grad_no_ratio", base="tapo")
def fused_grad_no_ratio():
    """The fused backward drops the R~_t factor: the gradient of an unclipped token is -A_t / N."""
    return _fused_mutant("tapo.fused_grad_no_ratio", [
        ("_FusedLoss", "g = torch.mul(coef, -(grad / n_valid)).mul_(r_tilde)", "g = torch.mul(coef, -(grad / n_valid))"),
    ])


@registry.mutant("tapo.fused_clip_side_flipped", base="tapo")
def fused_clip_side_flipped():
    """The fused loss zeroes the gradient on the wrong side of the clip (where A and the overshoot disagree)."""
    return _fused_mutant("tapo.fused_clip_side_flipped", [(
        "_fused_tapo_loss", "active = (side * adv_sign).relu_()", "active = (side * adv_sign).neg_().relu_()",
    )])


@registry.mutant("tapo.fused_side_unmasked", base="tapo")
def fused_side_unmasked():
    """The fused loss counts clip sides at masked slots too: clip_fraction reads prompt and padding."""
    return _fused_mutant("tapo.fused_side_unmasked", [(
        "_fused_tapo_loss", "side = torch.sub(r, c, out=c).sign_().mul_(mf)", "side = torch.sub(r, c, out=c).sign_()",
    )])


@registry.mutant("tapo.fused_empty_rows_count", base="tapo")
def fused_empty_rows_count():
    """[B] advantages: the fused zero-advantage guard counts a row with no valid token as signal."""
    return _fused_mutant("tapo.fused_empty_rows_count", [(
        "_fused_tapo_loss", "a = torch.where(has_tok, advantages.detach().to(cdt), zero)", "a = advantages.detach().to(cdt)",
    )])


# --- pairing defects of the mechanism run (methods/common/paired.py) -------------------------------------

from methods.common.paired import defect  # noqa: E402

registry.mutant("tapo.control_trained_weights", base="tapo")(defect(IMPL, "tapo.control_trained_weights"))
registry.mutant("tapo.control_other_stream", base="tapo")(defect(IMPL, "tapo.control_other_stream"))
registry.mutant("tapo.same_stream_every_seed", base="tapo")(defect(IMPL, "tapo.same_stream_every_seed"))
registry.mutant("tapo.control_clip_narrow", base="tapo")(defect(IMPL, "tapo.control_clip_narrow"))
registry.mutant("tapo.method_grad_negated", base="tapo")(defect(IMPL, "tapo.method_grad_negated"))
registry.mutant("tapo.method_grad_frozen", base="tapo")(defect(IMPL, "tapo.method_grad_frozen"))
registry.mutant("tapo.control_grad_negated", base="tapo")(defect(IMPL, "tapo.control_grad_negated"))
registry.mutant("tapo.arms_swapped", base="tapo")(defect(IMPL, "tapo.arms_swapped"))


# --- a count in a narrow dtype (seen only past 32,767 valid tokens in a row: the scale tier) ------------------------


def _ratio_count_int16(logp, old_logp, mask):
    """t, the valid-token count of the prefix, kept in int16: past 32,767 tokens it wraps negative."""
    def over_int16_count(delta, m, cdt):
        count = m.to(torch.int16).cumsum(-1, dtype=torch.int16)  # DEFECT: an int16 running count
        return delta.cumsum(-1) / count.clamp_min(1).to(cdt)

    return _ratio_from_prefix_mean(logp, old_logp, mask, over_int16_count)


@registry.mutant("tapo.count_int16", base="tapo")
def count_int16():
    return _with_ratio("tapo.count_int16", _ratio_count_int16)


# --- promises the interface declares that no case tried before ------------------------------------------------


@registry.mutant("tapo.adv_checked_on_empty_rows", base="tapo")
def adv_checked_on_empty_rows():
    """tapo_loss validates [B] advantages before masking: the NaN advantage of an empty response is refused."""
    def tapo_loss(logp, old_logp, advantages, mask, *args, **kwargs):
        if advantages.dim() == 1 and not bool(torch.isfinite(advantages).all()):
            raise ValueError("advantages hold NaN or inf")
        return IMPL.tapo_loss(logp, old_logp, advantages, mask, *args, **kwargs)

    return IMPL.replace("tapo.adv_checked_on_empty_rows", tapo_loss=tapo_loss)


@registry.mutant("tapo.ratio_mask_bool_only", base="tapo")
def ratio_mask_bool_only():
    """trajectory_ratio takes only a bool mask: a 0/1 float or integer mask, which the interface accepts, is refused."""
    def ratio(logp, old_logp, mask):
        if mask.dtype != torch.bool:
            raise ValueError("mask must be a bool tensor")
        return trajectory_ratio(logp, old_logp, mask)

    return IMPL.replace("tapo.ratio_mask_bool_only", trajectory_ratio=ratio)


@registry.mutant("tapo.clip_default_float32", base="tapo")
def clip_default_float32():
    """length_aware_clip returns float32 when no dtype is given, where the interface's default is float64."""
    def length_aware_clip(T, eps_min, eps_max, *, dtype=torch.float32, device=None):
        return IMPL.length_aware_clip(T, eps_min, eps_max, dtype=dtype, device=device)

    return IMPL.replace("tapo.clip_default_float32", length_aware_clip=length_aware_clip)
