"""Known-bad GSPO variants, one deliberate defect each; every one must be killed. Each rebuilds both functions from
one broken part with `build_gspo`, so the ratio and the loss carry the same defect."""

from __future__ import annotations

import torch

from engine.spec import registry
from methods.grpo.loss import clipped_surrogate, log_ratio as masked_log_ratio
from methods.grpo.mutants import clip_clamped, in_input_dtype
from methods.gspo import loss as L
from methods.gspo.impl import IMPL


def _built(name, **parts):
    sequence_ratio, gspo_loss = L.build_gspo(**parts)
    return IMPL.replace(name, sequence_ratio=sequence_ratio, gspo_loss=gspo_loss)


def _log_ratio(divide):
    """L.sequence_log_ratio with each row's sum divided by divide(valid tokens per row, mask) instead."""
    def log_ratio(logp, old_logp, m, cdt):
        n_row = m.sum(dim=-1)
        return masked_log_ratio(logp, old_logp, m, cdt).sum(dim=-1) / divide(n_row, m).to(cdt), n_row

    return log_ratio


@registry.mutant("gspo.no_length_norm", base="gspo")
def no_length_norm():
    """The sequence log-ratio summed, not averaged: s_i = pi/pi_old of the whole sequence (no 1/|y_i|)."""
    return _built("gspo.no_length_norm", log_ratio_fn=_log_ratio(lambda n, m: torch.ones_like(n)))


@registry.mutant("gspo.mean_over_padded", base="gspo")
def mean_over_padded():
    """The mean log-ratio taken over the padded length L instead of the response's valid tokens."""
    return _built("gspo.mean_over_padded", log_ratio_fn=_log_ratio(lambda n, m: torch.full_like(n, m.shape[-1])))


def _by_multiply(logp, old_logp, m, cdt):
    lr = (logp.to(cdt) - old_logp.detach().to(cdt)) * m.to(cdt)
    n_row = m.sum(dim=-1)
    return lr.sum(dim=-1) / n_row.clamp_min(1).to(cdt), n_row


@registry.mutant("gspo.mask_by_multiply", base="gspo")
def mask_by_multiply():
    """Masked slots zeroed by multiplying with the mask: NaN * 0 = NaN poisons the row (OpenRLHF PR #1240)."""
    return _built("gspo.mask_by_multiply", log_ratio_fn=_by_multiply)


@registry.mutant("gspo.no_ratio_guard", base="gspo")
def no_ratio_guard():
    """No clamp before exp: a large mean log-ratio overflows to inf."""
    return _built("gspo.no_ratio_guard", clamp_fn=lambda log_s, clamp: log_s)


@registry.mutant("gspo.symmetric_clip", base="gspo")
def symmetric_clip():
    """Both bounds from eps_low: [1 - 3e-4, 1 + 3e-4] instead of the paper's 3e-4 / 4e-4."""
    return _built("gspo.symmetric_clip",
                  surrogate_fn=lambda r, a, lo, hi, dual: clipped_surrogate(r, a, lo, 2.0 - lo, dual))


@registry.mutant("gspo.clip_no_upper", base="gspo")
def clip_no_upper():
    """The clip drops its upper bound."""
    return _built("gspo.clip_no_upper",
                  surrogate_fn=lambda r, a, lo, hi, dual: clipped_surrogate(r, a, lo, float("inf"), dual))


@registry.mutant("gspo.max_not_min", base="gspo")
def max_not_min():
    """Optimistic max instead of the pessimistic min."""
    return _built("gspo.max_not_min",
                  surrogate_fn=lambda r, a, lo, hi, dual: torch.minimum(r * -a, r.clamp(lo, hi) * -a))


@registry.mutant("gspo.token_summed", base="gspo")
def token_summed():
    """Token form: the per-token terms summed over the response instead of averaged, weighting GSPO by length
    (TRL #3823)."""
    return _built("gspo.token_summed", row_fn=lambda per_token, n_row: per_token.sum(dim=-1))


@registry.mutant("gspo.token_no_stop_gradient", base="gspo")
def token_no_stop_gradient():
    """Token form without sg on s_i: s_i,t = s_i * pi/sg[pi] passes s_i's own gradient too (s_i (1 + 1/|y_i|))."""
    def token_ratio(logp, log_s, m, cdt):
        zero = torch.zeros((), dtype=cdt, device=logp.device)
        lp = logp.to(cdt)
        return torch.where(m, lp - lp.detach(), zero) + log_s[:, None]

    return _built("gspo.token_no_stop_gradient", token_ratio_fn=token_ratio)


@registry.mutant("gspo.empty_row_nan", base="gspo")
def empty_row_nan():
    """The mean over responses divides by B and each row by its unguarded count: an empty row gives NaN."""
    return _built("gspo.empty_row_nan", log_ratio_fn=_log_ratio(lambda n_row, m: n_row),
                  row_fn=lambda per_token, n_row: per_token.sum(dim=-1) / n_row.to(per_token.dtype),
                  mean_fn=lambda per_row, has, rows: per_row.mean())


@registry.mutant("gspo.empty_rows_counted", base="gspo")
def empty_rows_counted():
    """Empty responses count in the mean over responses (divided by B)."""
    return _built("gspo.empty_rows_counted", mean_fn=lambda per_row, has, rows: per_row.mean())


@registry.mutant("gspo.loss_in_input_dtype", base="gspo")
def loss_in_input_dtype():
    """The loss handed back in the input's dtype: a bfloat16/float16 call rounds the loss."""
    return IMPL.replace("gspo.loss_in_input_dtype", gspo_loss=in_input_dtype(L.gspo_loss))


@registry.mutant("gspo.clip_unchecked", base="gspo")
def clip_unchecked():
    """Out-of-range clip bounds are silently clamped into range instead of refused."""
    return IMPL.replace("gspo.clip_unchecked", gspo_loss=clip_clamped(L.gspo_loss, 3e-4, 4e-4))


@registry.mutant("gspo.old_logp_not_detached", base="gspo")
def old_logp_not_detached():
    """The sequence log-ratio without old_logp.detach(): a behaviour log-prob that requires grad receives one."""
    def log_ratio(logp, old_logp, m, cdt):
        lr = torch.where(m, logp.to(cdt) - old_logp.to(cdt), torch.zeros((), dtype=cdt))
        n_row = m.sum(dim=-1)
        return lr.sum(dim=-1) / n_row.clamp_min(1).to(cdt), n_row

    return _built("gspo.old_logp_not_detached", log_ratio_fn=log_ratio)


@registry.mutant("gspo.row_length_int16", base="gspo")
def row_length_int16():
    """Each response's length |y_i| kept in int16: past 32,767 tokens it wraps negative, and the mean log-ratio is
    the row's sum (only a scale contract has such a response)."""
    return _built("gspo.row_length_int16", log_ratio_fn=_log_ratio(lambda n, m: n.to(torch.int16).clamp_min(1)))


# --- promises the interface declares (each found surviving a held-out batch of realistic bugs) --------------------


@registry.mutant("gspo.seq_adv_checked_on_empty_rows", base="gspo")
def seq_adv_checked_on_empty_rows():
    """The sequence form validates the advantages before masking: an empty response's NaN advantage is refused."""
    def gspo_loss(logp, old_logp, advantages, mask, *, form="sequence", **kwargs):
        if form == "sequence" and not bool(torch.isfinite(advantages).all()):
            raise ValueError("advantages hold NaN or inf")
        return L.gspo_loss(logp, old_logp, advantages, mask, form=form, **kwargs)

    return IMPL.replace("gspo.seq_adv_checked_on_empty_rows", gspo_loss=gspo_loss)


@registry.mutant("gspo.ratio_no_clamp", base="gspo")
def ratio_no_clamp():
    """The stand-alone sequence_ratio without its overflow clamp (the loss keeps its own)."""
    sequence_ratio, _ = L.build_gspo(clamp_fn=lambda log_s, clamp: log_s)
    return IMPL.replace("gspo.ratio_no_clamp", sequence_ratio=sequence_ratio)


@registry.mutant("gspo.clamp_fixed", base="gspo")
def clamp_fixed():
    """log_ratio_clamp validated, then ignored: log s is always clamped at 10."""
    def sequence_ratio(logp, old_logp, mask, *, log_ratio_clamp=L.LOG_RATIO_CLAMP):
        L.sequence_ratio(logp, old_logp, mask, log_ratio_clamp=log_ratio_clamp)  # its refusals
        return L.sequence_ratio(logp, old_logp, mask)

    def gspo_loss(logp, old_logp, advantages, mask, *, log_ratio_clamp=L.LOG_RATIO_CLAMP, **kwargs):
        L.gspo_loss(logp, old_logp, advantages, mask, log_ratio_clamp=log_ratio_clamp, **kwargs)
        return L.gspo_loss(logp, old_logp, advantages, mask, **kwargs)

    return IMPL.replace("gspo.clamp_fixed", sequence_ratio=sequence_ratio, gspo_loss=gspo_loss)


@registry.mutant("gspo.ratio_unchecked", base="gspo")
def ratio_unchecked():
    """sequence_ratio checks nothing: a 1-D logp, a mask of another shape or of other values, any clamp."""
    def sequence_ratio(logp, old_logp, mask, *, log_ratio_clamp=L.LOG_RATIO_CLAMP):
        m = mask.to(torch.bool)
        log_s, _ = L.sequence_log_ratio(logp, old_logp, m, L.compute_dtype(logp.dtype))
        return L.clamp_log_ratio(log_s, float(log_ratio_clamp)).exp()

    return IMPL.replace("gspo.ratio_unchecked", sequence_ratio=sequence_ratio)


@registry.mutant("gspo.mask_bool_only", base="gspo")
def mask_bool_only():
    """Only a bool mask is taken: a 0/1 float or integer mask, which the interface accepts, is refused."""
    def bool_only(fn):
        def call(*args, **kwargs):
            mask = args[-1] if len(args) in (3, 4) else kwargs.get("mask")
            if mask is not None and mask.dtype != torch.bool:
                raise ValueError("mask must be a bool tensor")
            return fn(*args, **kwargs)
        return call

    return IMPL.replace("gspo.mask_bool_only", sequence_ratio=bool_only(L.sequence_ratio),
                        gspo_loss=bool_only(L.gspo_loss))


@registry.mutant("gspo.ties_counted_outside", base="gspo")
def ties_counted_outside():
    """A row exactly on a clip bound, or whose mean log-ratio equals the clamp, counted as clipped or clamped
    (<= and >= where the interface says below, above, exceeds)."""
    return _built("gspo.ties_counted_outside",
                  outside_fn=lambda s, log_s, lo, hi, clamp: (s <= lo, s >= hi, log_s >= clamp))
