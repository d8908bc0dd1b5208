"""Known-bad GPG variants, one deliberate defect each; every one must be killed by the contracts specs/gpg.yaml
names."""

from __future__ import annotations

import torch

from engine.spec import registry
from methods.common.pg_inputs import masked
from methods.gpg import loss as L
from methods.gpg.impl import IMPL


def _loss(name, **parts):
    return IMPL.replace(name, gpg_loss=L.build_gpg(**parts))


@registry.mutant("gpg.sequence_mean", base="gpg")
def sequence_mean():
    """Each response's token mean, then the mean over responses, instead of the token-level normaliser."""
    def aggregate(per_token, n):
        rows = per_token.ne(0).sum(dim=-1).clamp_min(1).to(per_token.dtype)
        return (per_token.sum(dim=-1) / rows).mean()

    return _loss("gpg.sequence_mean", aggregate_fn=aggregate)


@registry.mutant("gpg.mean_over_padded", base="gpg")
def mean_over_padded():
    """The token mean over all B x L slots, padding included."""
    return _loss("gpg.mean_over_padded", aggregate_fn=lambda per_token, n: per_token.mean())


@registry.mutant("gpg.mask_by_multiply", base="gpg")
def mask_by_multiply():
    """Masked slots zeroed by multiplying with the mask: NaN * 0 = NaN (OpenRLHF PR #1240)."""
    return _loss("gpg.mask_by_multiply", logp_fn=lambda logp, m, cdt: logp.to(cdt) * m.to(cdt))


@registry.mutant("gpg.sign_flipped", base="gpg")
def sign_flipped():
    """The loss is +A logp: gradient ascent on the loss pushes down good responses."""
    return _loss("gpg.sign_flipped", logp_fn=lambda logp, m, cdt: -masked(logp, m, cdt))


@registry.mutant("gpg.logp_detached", base="gpg")
def logp_detached():
    """logp under stop-gradient: the value is right, no gradient reaches the policy."""
    return _loss("gpg.logp_detached", logp_fn=lambda logp, m, cdt: masked(logp, m, cdt).detach())


@registry.mutant("gpg.logp_bonus", base="gpg")
def logp_bonus():
    """An always-on likelihood term (-1e-3 x the token mean of logp): the loss moves without an advantage."""
    def gpg_loss(logp, advantages, mask):
        loss, metrics = L.gpg_loss(logp, advantages, mask)
        return loss - 1e-3 * masked(logp, mask.to(torch.bool), loss.dtype).sum() / metrics["tokens"], metrics

    return IMPL.replace("gpg.logp_bonus", gpg_loss=gpg_loss)


@registry.mutant("gpg.loss_in_input_dtype", base="gpg")
def loss_in_input_dtype():
    """The loss handed back in the input's dtype: a bfloat16/float16 call rounds the loss."""
    def gpg_loss(logp, advantages, mask):
        loss, metrics = L.gpg_loss(logp, advantages, mask)
        return loss.to(logp.dtype), metrics

    return IMPL.replace("gpg.loss_in_input_dtype", gpg_loss=gpg_loss)


@registry.mutant("gpg.adv_not_detached", base="gpg")
def adv_not_detached():
    """The advantages not detached: an advantage that requires grad receives -logp / N."""
    def gpg_loss(logp, advantages, mask):
        m = mask.to(torch.bool)
        cdt = torch.promote_types(logp.dtype, torch.float32)
        a = advantages[:, None].expand(m.shape) if advantages.dim() == 1 else advantages
        n = int(m.sum())
        per_token = -masked(a, m, cdt) * masked(logp, m, cdt)
        return per_token.sum() / n, {"tokens": n, "rows": int(m.any(-1).sum())}

    return IMPL.replace("gpg.adv_not_detached", gpg_loss=gpg_loss)


@registry.mutant("gpg.no_alpha", base="gpg")
def no_alpha():
    """alpha = 1: the batch mean keeps counting the flat groups' responses (the estimation bias GPG corrects)."""
    def advantages(rewards, group_size, *, f_norm=1.0):
        out = L.gpg_advantages(rewards, group_size, f_norm=f_norm).double().reshape(-1, group_size)
        g = rewards.double().reshape(-1, group_size)
        flat = g.amin(dim=1) == g.amax(dim=1)
        m_rows = int(flat.sum()) * group_size
        alpha = rewards.shape[0] / (rewards.shape[0] - m_rows) if m_rows < rewards.shape[0] else 1.0
        return (out / alpha).reshape(-1).to(rewards.dtype)

    return IMPL.replace("gpg.no_alpha", gpg_advantages=advantages)


@registry.mutant("gpg.alpha_counts_nonzero_rewards", base="gpg")
def alpha_counts_nonzero_rewards():
    """alpha = B / (responses with a non-zero reward) instead of B / (B - M), M the responses of flat groups."""
    def advantages(rewards, group_size, *, f_norm=1.0):
        base = no_alpha().gpg_advantages(rewards, group_size, f_norm=f_norm).double()
        nonzero = int((rewards != 0).sum())
        return (base * rewards.shape[0] / max(nonzero, 1)).to(rewards.dtype)

    return IMPL.replace("gpg.alpha_counts_nonzero_rewards", gpg_advantages=advantages)


@registry.mutant("gpg.std_normalised", base="gpg")
def std_normalised():
    """F_norm taken as the group std (+1e-6) whatever f_norm says: GRPO's normalisation."""
    def advantages(rewards, group_size, *, f_norm=1.0):
        a = L.gpg_advantages(rewards, group_size, f_norm=f_norm).double().reshape(-1, group_size)
        g = rewards.double().reshape(-1, group_size)
        std = g.std(dim=1, unbiased=False, keepdim=True)
        return (a * f_norm / (std + 1e-6)).reshape(-1).to(rewards.dtype)

    return IMPL.replace("gpg.std_normalised", gpg_advantages=advantages)


@registry.mutant("gpg.group_size_unchecked", base="gpg")
def group_size_unchecked():
    """gpg_advantages takes a bool or a float group_size and any f_norm."""
    def advantages(rewards, group_size, *, f_norm=1.0):
        return L.gpg_advantages(rewards, int(group_size), f_norm=abs(float(f_norm)) or 1.0)

    return IMPL.replace("gpg.group_size_unchecked", gpg_advantages=advantages)


@registry.mutant("gpg.adv_unchecked", base="gpg")
def adv_unchecked():
    """A NaN or inf advantage at a valid token silently read as 0 instead of refused."""
    def gpg_loss(logp, advantages, mask):
        return L.gpg_loss(logp, torch.nan_to_num(advantages, nan=0.0, posinf=0.0, neginf=0.0), mask)

    return IMPL.replace("gpg.adv_unchecked", gpg_loss=gpg_loss)


@registry.mutant("gpg.adv_in_input_dtype", base="gpg")
def adv_in_input_dtype():
    """The group mean taken in the rewards' own dtype instead of float64: a half-precision group sum rounds."""
    def advantages(rewards, group_size, *, f_norm=1.0):
        out = L.gpg_advantages(rewards, group_size, f_norm=f_norm).double().reshape(-1, group_size)
        g = rewards.detach().reshape(-1, group_size)
        exact = g.double() - g.double().mean(dim=1, keepdim=True)
        rounded = g - g.sum(dim=1, keepdim=True) / group_size  # DEFECT: the sum in the rewards' dtype
        scale = torch.where(exact != 0, out / exact, torch.zeros_like(out))  # alpha / F_norm, 0 for flat groups
        return (scale * rounded.double()).reshape(-1).to(rewards.dtype)

    return IMPL.replace("gpg.adv_in_input_dtype", gpg_advantages=advantages)


# --- a count in a narrow dtype (seen only past 2^15 tokens in a call: the scale tier) --------------------------------


@registry.mutant("gpg.token_count_int16", base="gpg")
def token_count_int16():
    """The call's token count N kept in int16: past 32,767 tokens it wraps, and the token mean divides by it."""
    return _loss("gpg.token_count_int16",
                 aggregate_fn=lambda per_token, n: per_token.sum() / torch.tensor(n).to(torch.int16))  # DEFECT
