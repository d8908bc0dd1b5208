"""Known-bad Dr. GRPO variants, one deliberate defect each (mostly the two biases the paper removes, put back);
every one must be killed by the contracts specs/dr-grpo.yaml names."""

from __future__ import annotations

import torch

from engine.spec import registry
from methods.dr_grpo import loss as L
from methods.dr_grpo.impl import IMPL


def _loss(name, **parts):
    return IMPL.replace(name, dr_grpo_loss=L.build_dr_grpo(**parts))


@registry.mutant("dr_grpo.std_normalised", base="dr_grpo")
def std_normalised():
    """The advantages divided by the group std (+1e-6): GRPO's question-level difficulty bias put back."""
    def advantages(rewards, group_size, *, mask=None):
        a = L.group_advantages(rewards, group_size, mask=mask).double().reshape(-1, group_size)
        std = a.pow(2).mean(dim=1, keepdim=True).sqrt()
        return (a / (std + 1e-6)).reshape(-1).to(rewards.dtype)

    return IMPL.replace("dr_grpo.std_normalised", group_advantages=advantages)


@registry.mutant("dr_grpo.adv_counts_masked_rows", base="dr_grpo")
def adv_counts_masked_rows():
    """Fully masked responses still move their group's mean (verl PR #6452)."""
    return IMPL.replace("dr_grpo.adv_counts_masked_rows",
                        group_advantages=lambda rewards, group_size, *, mask=None: L.group_advantages(rewards,
                                                                                                     group_size))


@registry.mutant("dr_grpo.length_normalised", base="dr_grpo")
def length_normalised():
    """Each response's token mean, then the mean over responses: GRPO's 1/|o_i| length bias put back."""
    def aggregate(per_token, n_row, rows, length):
        return (per_token.sum(dim=-1) / n_row.clamp_min(1).to(per_token.dtype)).sum() / rows

    return _loss("dr_grpo.length_normalised", aggregate_fn=aggregate)


@registry.mutant("dr_grpo.token_mean", base="dr_grpo")
def token_mean():
    """The token sum divided by the number of tokens N instead of the constant G x C_L."""
    return _loss("dr_grpo.token_mean", aggregate_fn=lambda per_token, n_row, rows, length: per_token.sum()
                 / n_row.sum().to(per_token.dtype))


@registry.mutant("dr_grpo.ignores_norm_length", base="dr_grpo")
def ignores_norm_length():
    """norm_length ignored: always the padded length of the call."""
    return _loss("dr_grpo.ignores_norm_length",
                 aggregate_fn=lambda per_token, n_row, rows, length: per_token.sum() / (rows * per_token.shape[-1]))


@registry.mutant("dr_grpo.empty_rows_counted", base="dr_grpo")
def empty_rows_counted():
    """Empty responses counted in G (the token sum divided by B x C_L)."""
    return _loss("dr_grpo.empty_rows_counted",
                 aggregate_fn=lambda per_token, n_row, rows, length: per_token.sum() / (n_row.shape[0] * length))


@registry.mutant("dr_grpo.max_not_min", base="dr_grpo")
def max_not_min():
    """Optimistic max instead of the pessimistic min."""
    return _loss("dr_grpo.max_not_min",
                 surrogate_fn=lambda r, a, lo, hi: torch.minimum(r * -a, r.clamp(lo, hi) * -a))


@registry.mutant("dr_grpo.mask_by_multiply", base="dr_grpo")
def mask_by_multiply():
    """Masked slots zeroed by multiplying with the mask: NaN * 0 = NaN (OpenRLHF PR #1240)."""
    return _loss("dr_grpo.mask_by_multiply",
                 ratio_fn=lambda logp, old, m, cdt: (logp.to(cdt) - old.detach().to(cdt)) * m.to(cdt))


@registry.mutant("dr_grpo.no_ratio_guard", base="dr_grpo")
def no_ratio_guard():
    """No clamp of the log-ratio before exp: a large drift overflows float32 (OpenRLHF PR #1293)."""
    return _loss("dr_grpo.no_ratio_guard", guard_fn=lambda lr, c: lr)


@registry.mutant("dr_grpo.logp_bonus", base="dr_grpo")
def logp_bonus():
    """An always-on regulariser (-1e-3 log r per token): the loss moves without an advantage."""
    return _loss("dr_grpo.logp_bonus",
                 surrogate_fn=lambda r, a, lo, hi: L.clipped_surrogate(r, a, lo, hi) - 1e-3 * r.log())


@registry.mutant("dr_grpo.loss_in_input_dtype", base="dr_grpo")
def loss_in_input_dtype():
    """The loss handed back in the input's dtype: a bfloat16/float16 call rounds the loss."""
    def loss(logp, *args, **kwargs):
        value, metrics = L.dr_grpo_loss(logp, *args, **kwargs)
        return value.to(logp.dtype), metrics

    return IMPL.replace("dr_grpo.loss_in_input_dtype", dr_grpo_loss=loss)


@registry.mutant("dr_grpo.clip_unchecked", base="dr_grpo")
def clip_unchecked():
    """Out-of-range clip bounds and norm_length silently clamped into range instead of refused."""
    def loss(*args, clip_low=0.2, clip_high=0.2, norm_length=None, **kwargs):
        nl = None if norm_length is None else max(int(norm_length), 1)
        return L.dr_grpo_loss(*args, clip_low=min(max(float(clip_low), 0.0), 0.999),
                              clip_high=max(float(clip_high), 0.0), norm_length=nl, **kwargs)

    return IMPL.replace("dr_grpo.clip_unchecked", dr_grpo_loss=loss)


@registry.mutant("dr_grpo.old_logp_not_detached", base="dr_grpo")
def old_logp_not_detached():
    """The behaviour log-probs not detached: a behaviour log-prob that requires grad receives one."""
    return _loss("dr_grpo.old_logp_not_detached",
                 ratio_fn=lambda logp, old, m, cdt: torch.where(m, logp.to(cdt) - old.to(cdt), torch.zeros((),
                                                                                                        dtype=cdt)))


@registry.mutant("dr_grpo.group_size_unchecked", base="dr_grpo")
def group_size_unchecked():
    """group_advantages takes any group_size that divides B, a bool or a float included."""
    def advantages(rewards, group_size, *, mask=None):
        return L.group_advantages(rewards, int(group_size), mask=mask)

    return IMPL.replace("dr_grpo.group_size_unchecked", group_advantages=advantages)


# --- the mask forms, the precision and the knobs the interface declares --------------------------------------------


@registry.mutant("dr_grpo.adv_none_counts_nothing", base="dr_grpo")
def adv_none_counts_nothing():
    """mask=None read as 'no row counts' instead of 'every row counts': every advantage is 0."""
    def advantages(rewards, group_size, *, mask=None):
        if mask is None:
            mask = torch.zeros(rewards.shape[0], dtype=torch.bool, device=rewards.device)
        return L.group_advantages(rewards, group_size, mask=mask)

    return IMPL.replace("dr_grpo.adv_none_counts_nothing", group_advantages=advantages)


@registry.mutant("dr_grpo.adv_row_flags_ignored", base="dr_grpo")
def adv_row_flags_ignored():
    """A [B] mask of row flags is dropped (only a [B, L] response mask is read): every row counts."""
    def advantages(rewards, group_size, *, mask=None):
        return L.group_advantages(rewards, group_size, mask=mask if mask is not None and mask.dim() == 2 else None)

    return IMPL.replace("dr_grpo.adv_row_flags_ignored", group_advantages=advantages)


@registry.mutant("dr_grpo.adv_mask_bool_only", base="dr_grpo")
def adv_mask_bool_only():
    """group_advantages refuses a mask that is not bool, where the interface accepts 0/1 of any real dtype."""
    def advantages(rewards, group_size, *, mask=None):
        if mask is not None and mask.dtype != torch.bool:
            raise ValueError(f"mask must be bool, got {mask.dtype}")
        return L.group_advantages(rewards, group_size, mask=mask)

    return IMPL.replace("dr_grpo.adv_mask_bool_only", group_advantages=advantages)


@registry.mutant("dr_grpo.adv_in_input_dtype", base="dr_grpo")
def adv_in_input_dtype():
    """The group mean taken in the rewards' own dtype instead of float64: a half-precision group sum rounds."""
    def advantages(rewards, group_size, *, mask=None):
        keep = torch.ones(rewards.shape[0], dtype=torch.bool, device=rewards.device)
        if mask is not None:
            keep = mask.to(torch.bool)
            keep = keep.any(dim=-1) if keep.dim() == 2 else keep
        zero = torch.zeros((), dtype=rewards.dtype, device=rewards.device)
        r = torch.where(keep, rewards.detach(), zero).reshape(-1, group_size)
        k = keep.reshape(-1, group_size)
        mean = r.sum(dim=1, keepdim=True) / k.sum(dim=1, keepdim=True).clamp_min(1).to(rewards.dtype)  # DEFECT
        return torch.where(k, r - mean, zero).reshape(-1)

    return IMPL.replace("dr_grpo.adv_in_input_dtype", group_advantages=advantages)


@registry.mutant("dr_grpo.bounds_fixed", base="dr_grpo")
def bounds_fixed():
    """clip_low and clip_high are validated, then ignored: the loss always clips at [1 - 0.2, 1 + 0.2]."""
    return _loss("dr_grpo.bounds_fixed",
                 surrogate_fn=lambda r, a, lo, hi: L.clipped_surrogate(r, a, 1.0 - L.CLIP_LOW, 1.0 + L.CLIP_HIGH))


@registry.mutant("dr_grpo.clamp_fixed", base="dr_grpo")
def clamp_fixed():
    """log_ratio_clamp is validated, then ignored: the log-ratio is always clamped at 20."""
    return _loss("dr_grpo.clamp_fixed", guard_fn=lambda lr, c: L.clamp_log_ratio(lr, L.LOG_RATIO_CLAMP))


# --- a length in a narrow dtype (seen only past 2^15 slots a row: the scale tier) ------------------------------------


@registry.mutant("dr_grpo.length_int16", base="dr_grpo")
def length_int16():
    """The constant length C_L kept in int16: a padded length past 32,767 wraps negative, and so does the loss."""
    def aggregate(per_token, n_row, rows, length):
        return per_token.sum() / (rows * torch.tensor(length).to(torch.int16).to(per_token.dtype))  # DEFECT

    return _loss("dr_grpo.length_int16", aggregate_fn=aggregate)
