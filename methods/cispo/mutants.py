"""Known-bad CISPO variants, one deliberate defect each; every one must be killed by the contracts
specs/cispo.yaml names."""

from __future__ import annotations

import torch

from engine.spec import registry
from methods.cispo import loss as L
from methods.common.pg_inputs import check_logp, compute_dtype, log_ratio, masked, token_advantages
from methods.cispo.impl import IMPL


def _loss(name, **parts):
    return IMPL.replace(name, cispo_loss=L.build_cispo(**parts))


@registry.mutant("cispo.no_stop_gradient", base="cispo")
def no_stop_gradient():
    """The clipped weight not detached: inside the bounds its own gradient A logp dr/dlogp joins the REINFORCE
    term (the loss is no longer CISPO's estimator)."""
    return _loss("cispo.no_stop_gradient", weight_fn=lambda lr, lo, hi: lr.exp().clamp(min=lo, max=hi))


@registry.mutant("cispo.no_clip", base="cispo")
def no_clip():
    """The importance weight left unclipped: plain off-policy REINFORCE, unbounded weights."""
    return _loss("cispo.no_clip", weight_fn=lambda lr, lo, hi: lr.exp().detach())


@registry.mutant("cispo.default_lower_bound", base="cispo")
def default_lower_bound():
    """A lower bound 1 - 0.2 imposed when none is asked for (the paper sets eps_low large: no lower bound)."""
    return _loss("cispo.default_lower_bound",
                 weight_fn=lambda lr, lo, hi: L.clipped_weight(lr, 0.8 if lo is None else lo, hi))


@registry.mutant("cispo.ignores_clip_low", base="cispo")
def ignores_clip_low():
    """A given eps_low ignored: the weight is clipped from above only."""
    return _loss("cispo.ignores_clip_low", weight_fn=lambda lr, lo, hi: L.clipped_weight(lr, None, hi))


@registry.mutant("cispo.ratio_inverted", base="cispo")
def ratio_inverted():
    """The ratio the wrong way up, pi_old / pi_theta."""
    return _loss("cispo.ratio_inverted", weight_fn=lambda lr, lo, hi: L.clipped_weight(-lr, lo, hi))


@registry.mutant("cispo.drops_clipped_tokens", base="cispo")
def drops_clipped_tokens():
    """PPO's token dropping put back: a token whose ratio is outside the bounds on its advantage's side gets weight
    0, so its gradient is lost (what CISPO exists to avoid)."""
    def weight(lr, lo, hi):
        r = lr.exp()
        return torch.where((r > hi) | (r < (lo or 0.0)), torch.zeros_like(r), r).detach()

    return _loss("cispo.drops_clipped_tokens", weight_fn=weight)


@registry.mutant("cispo.sequence_mean", base="cispo")
def sequence_mean():
    """Each response's token mean, then the mean over responses, instead of the token-level normaliser."""
    def build():
        def cispo_loss(logp, old_logp, advantages, mask, *, clip_low=None, clip_high=L.CLIP_HIGH):
            m = check_logp(logp, mask, ("old_logp", old_logp))
            cdt = compute_dtype(logp.dtype)
            lo = None if clip_low is None else 1.0 - float(clip_low)
            w = L.clipped_weight(log_ratio(logp, old_logp, m, cdt), lo, 1.0 + float(clip_high))
            per_token = -(w * token_advantages(advantages, m, cdt)) * masked(logp, m, cdt)
            n_row = m.sum(dim=-1)
            has = n_row > 0
            loss = (per_token.sum(dim=-1)[has] / n_row[has].to(cdt)).mean()
            return loss, {"tokens": int(n_row.sum()), "rows": int(has.sum())}

        return cispo_loss

    return IMPL.replace("cispo.sequence_mean", cispo_loss=build())


@registry.mutant("cispo.mask_by_multiply", base="cispo")
def mask_by_multiply():
    """Masked slots zeroed by multiplying with the mask: NaN * 0 = NaN (OpenRLHF PR #1240)."""
    return _loss("cispo.mask_by_multiply",
                 ratio_fn=lambda logp, old, m, cdt: (logp.to(cdt) - old.detach().to(cdt)) * m.to(cdt))


@registry.mutant("cispo.logp_bonus", base="cispo")
def logp_bonus():
    """An always-on likelihood term (-1e-3 x the token mean of logp): the loss moves without an advantage."""
    def cispo_loss(logp, old_logp, advantages, mask, **kwargs):
        loss, metrics = L.cispo_loss(logp, old_logp, advantages, mask, **kwargs)
        bonus = masked(logp, mask.to(torch.bool), loss.dtype).sum() / metrics["tokens"]
        return loss - 1e-3 * bonus, metrics

    return IMPL.replace("cispo.logp_bonus", cispo_loss=cispo_loss)


@registry.mutant("cispo.loss_in_input_dtype", base="cispo")
def loss_in_input_dtype():
    """The loss handed back in the input's dtype: a bfloat16/float16 call rounds the loss."""
    def loss(logp, *args, **kwargs):
        value, metrics = L.cispo_loss(logp, *args, **kwargs)
        return value.to(logp.dtype), metrics

    return IMPL.replace("cispo.loss_in_input_dtype", cispo_loss=loss)


@registry.mutant("cispo.clip_unchecked", base="cispo")
def clip_unchecked():
    """Out-of-range clip bounds silently clamped into range instead of refused."""
    def loss(*args, clip_low=None, clip_high=L.CLIP_HIGH, **kwargs):
        low = None if clip_low is None else min(max(float(clip_low), 0.0), 0.999)
        return L.cispo_loss(*args, clip_low=low, clip_high=max(float(clip_high), 0.0), **kwargs)

    return IMPL.replace("cispo.clip_unchecked", cispo_loss=loss)


@registry.mutant("cispo.adv_not_detached", base="cispo")
def adv_not_detached():
    """The advantages not detached: an advantage that requires grad receives -w logp / N."""
    def build():
        def cispo_loss(logp, old_logp, advantages, mask, *, clip_low=None, clip_high=L.CLIP_HIGH):
            m = check_logp(logp, mask, ("old_logp", old_logp))
            cdt = compute_dtype(logp.dtype)
            lo = None if clip_low is None else 1.0 - float(clip_low)
            w = L.clipped_weight(log_ratio(logp, old_logp, m, cdt), lo, 1.0 + float(clip_high))
            a = advantages[:, None].expand(m.shape) if advantages.dim() == 1 else advantages
            a = torch.where(m, a.to(cdt), torch.zeros((), dtype=cdt))
            n = int(m.sum())
            return (-(w * a) * masked(logp, m, cdt)).sum() / n, {"tokens": n, "rows": int(m.any(-1).sum())}

        return cispo_loss

    return IMPL.replace("cispo.adv_not_detached", cispo_loss=build())


# --- a count in a narrow dtype (seen only past 65,504 tokens in a call: the scale tier) ------------------------------


@registry.mutant("cispo.token_count_float16", base="cispo")
def token_count_float16():
    """The call's token count N kept in float16: past 65,504 tokens it is inf, and the loss 0."""
    return _loss("cispo.token_count_float16",
                 aggregate_fn=lambda per_token, n: per_token.sum() / torch.tensor(float(n)).to(torch.float16))  # DEFECT
