"""Known-bad GMPO variants, one deliberate defect each; every one must be killed by the contracts specs/gmpo.yaml
names. Each rebuilds both functions from one broken part, so the ratio and the loss carry the same defect."""

from __future__ import annotations

import torch

from engine.spec import registry
from methods.gmpo import loss as L
from methods.gmpo.impl import IMPL


def _built(name, **parts):
    ratio, loss = L.build_gmpo(**parts)
    return IMPL.replace(name, geometric_ratio=ratio, gmpo_loss=loss)


@registry.mutant("gmpo.arithmetic_mean", base="gmpo")
def arithmetic_mean():
    """The arithmetic mean of the clipped token ratios (GRPO's) instead of their geometric mean."""
    def mean(k, n_row):
        # masked slots hold k = 0, a ratio of 1 each: take them back out of the sum
        pad = (k.shape[-1] - n_row).to(k.dtype)
        return ((k.exp().sum(dim=-1) - pad) / n_row.clamp_min(1).to(k.dtype)).log()

    return _built("gmpo.arithmetic_mean", mean_fn=mean)


@registry.mutant("gmpo.clip_in_ratio_space", base="gmpo")
def clip_in_ratio_space():
    """The bounds read in ratio space, (1 - eps_low, 1 + eps_high), instead of the log space the paper clips in."""
    def clip(lr, sgn, low, high):
        c = lr.exp().clamp(1.0 - low, 1.0 + high).log()
        return sgn * torch.minimum(sgn * lr, sgn * c)

    return _built("gmpo.clip_in_ratio_space", clip_fn=clip)


@registry.mutant("gmpo.sign_ignored", base="gmpo")
def sign_ignored():
    """Every token clipped on both sides whatever the advantage's sign (not PPO's pessimistic min)."""
    return _built("gmpo.sign_ignored",
                  clip_fn=lambda lr, sgn, low, high: torch.where(sgn != 0, lr.clamp(-low, high), torch.zeros_like(lr)))


@registry.mutant("gmpo.no_token_clip", base="gmpo")
def no_token_clip():
    """No per-token clip: the geometric mean of the raw ratios (GSPO's sequence ratio without its clip)."""
    return _built("gmpo.no_token_clip", clip_fn=lambda lr, sgn, low, high: torch.where(sgn != 0, lr,
                                                                                          torch.zeros_like(lr)))


@registry.mutant("gmpo.no_length_norm", base="gmpo")
def no_length_norm():
    """The clipped log-ratios summed, not averaged: the whole sequence's ratio (no 1/|o_i|)."""
    return _built("gmpo.no_length_norm", mean_fn=lambda k, n_row: k.sum(dim=-1))


@registry.mutant("gmpo.mean_over_padded", base="gmpo")
def mean_over_padded():
    """The mean log-ratio over the padded length L instead of the response's valid tokens."""
    return _built("gmpo.mean_over_padded", mean_fn=lambda k, n_row: k.sum(dim=-1) / k.shape[-1])


@registry.mutant("gmpo.empty_rows_counted", base="gmpo")
def empty_rows_counted():
    """Empty responses counted in the mean over responses (divided by B)."""
    return _built("gmpo.empty_rows_counted", aggregate_fn=lambda per_row, n_row, rows: per_row.mean())


@registry.mutant("gmpo.length_weighted", base="gmpo")
def length_weighted():
    """The per-response term broadcast over its tokens and token-averaged: each response weighs |o_i| / N, long
    responses more (the sequence-ratio bug of TRL #3823)."""
    def aggregate(per_row, n_row, rows):
        w = n_row.to(per_row.dtype)
        return (per_row * w).sum() / w.sum()

    return _built("gmpo.length_weighted", aggregate_fn=aggregate)


@registry.mutant("gmpo.mask_by_multiply", base="gmpo")
def mask_by_multiply():
    """Masked slots zeroed by multiplying with the mask: NaN * 0 = NaN (OpenRLHF PR #1240)."""
    return _built("gmpo.mask_by_multiply",
                  ratio_fn=lambda logp, old, m, cdt: (logp.to(cdt) - old.detach().to(cdt)) * m.to(cdt))


@registry.mutant("gmpo.no_ratio_guard", base="gmpo")
def no_ratio_guard():
    """No clamp of the token log-ratios: a negative-advantage response whose policy moved far up overflows exp."""
    return _built("gmpo.no_ratio_guard", guard_fn=lambda lr, c: lr)


@registry.mutant("gmpo.ratio_detached", base="gmpo")
def ratio_detached():
    """The ratio under stop-gradient: the value is right, no gradient reaches the policy."""
    from methods.common.pg_inputs import log_ratio

    return _built("gmpo.ratio_detached", ratio_fn=lambda logp, old, m, cdt: log_ratio(logp, old, m, cdt).detach())


@registry.mutant("gmpo.logp_bonus", base="gmpo")
def logp_bonus():
    """An always-on likelihood term (-1e-3 x the token mean of logp): the loss moves without an advantage."""
    from methods.common.pg_inputs import masked

    def loss(logp, old_logp, advantages, mask, **kwargs):
        value, metrics = L.gmpo_loss(logp, old_logp, advantages, mask, **kwargs)
        return value - 1e-3 * masked(logp, mask.to(torch.bool), value.dtype).sum() / metrics["tokens"], metrics

    return IMPL.replace("gmpo.logp_bonus", gmpo_loss=loss)


@registry.mutant("gmpo.loss_in_input_dtype", base="gmpo")
def loss_in_input_dtype():
    """The loss handed back in the input's dtype: a bfloat16/float16 call rounds the loss."""
    def loss(logp, *args, **kwargs):
        value, metrics = L.gmpo_loss(logp, *args, **kwargs)
        return value.to(logp.dtype), metrics

    return IMPL.replace("gmpo.loss_in_input_dtype", gmpo_loss=loss)


@registry.mutant("gmpo.clip_unchecked", base="gmpo")
def clip_unchecked():
    """Negative clip bounds silently read as their magnitude instead of refused."""
    def loss(*args, clip_low=L.CLIP_LOW, clip_high=L.CLIP_HIGH, **kwargs):
        return L.gmpo_loss(*args, clip_low=abs(float(clip_low)), clip_high=abs(float(clip_high)), **kwargs)

    return IMPL.replace("gmpo.clip_unchecked", gmpo_loss=loss)


@registry.mutant("gmpo.old_logp_not_detached", base="gmpo")
def old_logp_not_detached():
    """The behaviour log-probs not detached: a behaviour log-prob that requires grad receives one."""
    return _built("gmpo.old_logp_not_detached",
                  ratio_fn=lambda logp, old, m, cdt: torch.where(m, logp.to(cdt) - old.to(cdt),
                                                                 torch.zeros((), dtype=cdt)))


# --- the knobs the interface declares and the stand-alone ratio's own rules --------------------------------------


@registry.mutant("gmpo.bounds_fixed", base="gmpo")
def bounds_fixed():
    """clip_low and clip_high are validated, then ignored: every token is clipped at (-0.4, 0.4) in log space."""
    return _built("gmpo.bounds_fixed",
                  clip_fn=lambda lr, sgn, low, high: L.pessimistic_clip(lr, sgn, L.CLIP_LOW, L.CLIP_HIGH))


@registry.mutant("gmpo.clamp_fixed", base="gmpo")
def clamp_fixed():
    """log_ratio_clamp is validated, then ignored: each token log-ratio is always clamped at 20."""
    return _built("gmpo.clamp_fixed", guard_fn=lambda lr, c: L.clamp_log_ratio(lr, L.LOG_RATIO_CLAMP))


@registry.mutant("gmpo.ratio_unchecked", base="gmpo")
def ratio_unchecked():
    """geometric_ratio validates nothing: any bound, clamp, shape, mask value or advantage gives a number."""
    def ratio(logp, old_logp, advantages, mask, *, clip_low=L.CLIP_LOW, clip_high=L.CLIP_HIGH,
              log_ratio_clamp=L.LOG_RATIO_CLAMP):
        m = mask != 0
        cdt = torch.promote_types(logp.dtype, torch.float32)
        lr = torch.where(m, logp.to(cdt) - old_logp.detach().to(cdt), torch.zeros((), dtype=cdt))
        lr = lr.clamp(-float(log_ratio_clamp), float(log_ratio_clamp))
        a = advantages.detach().to(cdt)
        sgn = torch.sign(a if a.dim() == 1 else a[:, 0])[:, None]
        k = L.pessimistic_clip(lr, sgn, float(clip_low), float(clip_high))
        return L.row_mean(k, m.sum(dim=-1)).exp()

    return IMPL.replace("gmpo.ratio_unchecked", geometric_ratio=ratio)


@registry.mutant("gmpo.ratio_in_input_dtype", base="gmpo")
def ratio_in_input_dtype():
    """s_i handed back in the input's dtype: a bfloat16/float16 call rounds the ratio."""
    def ratio(logp, *args, **kwargs):
        return L.geometric_ratio(logp, *args, **kwargs).to(logp.dtype)

    return IMPL.replace("gmpo.ratio_in_input_dtype", geometric_ratio=ratio)


# --- a length in a narrow dtype (seen only past 2^15 tokens in a row: the scale tier) --------------------------------


@registry.mutant("gmpo.row_length_int16", base="gmpo")
def row_length_int16():
    """Each response's length |o_i| kept in int16: past 32,767 tokens it wraps negative, is floored at 1, and the
    mean log-ratio becomes the row's sum."""
    return _built("gmpo.row_length_int16",
                  mean_fn=lambda k, n_row: k.sum(dim=-1) / n_row.to(torch.int16).clamp_min(1).to(k.dtype))  # DEFECT
