"""Known-bad DAPO variants, one deliberate defect each; every one must be killed by the contracts
specs/dapo.yaml names."""

from __future__ import annotations

import torch

from engine.spec import registry
from methods.common.pg_inputs import log_ratio
from methods.dapo import loss as L
from methods.dapo.impl import IMPL


def _loss(name, **parts):
    return IMPL.replace(name, dapo_loss=L.build_dapo(**parts))


@registry.mutant("dapo.symmetric_clip", base="dapo")
def symmetric_clip():
    """Both bounds from eps_low, [1 - 0.2, 1 + 0.2]: the clip-higher bound 0.28 ignored (GRPO's symmetric clip)."""
    return _loss("dapo.symmetric_clip", surrogate_fn=lambda r, a, lo, hi: L.clipped_surrogate(r, a, lo, 2.0 - lo))


@registry.mutant("dapo.clip_no_upper", base="dapo")
def clip_no_upper():
    """The clip drops its upper bound."""
    return _loss("dapo.clip_no_upper", surrogate_fn=lambda r, a, lo, hi: L.clipped_surrogate(r, a, lo, float("inf")))


@registry.mutant("dapo.max_not_min", base="dapo")
def max_not_min():
    """Optimistic max instead of the pessimistic min."""
    return _loss("dapo.max_not_min", surrogate_fn=lambda r, a, lo, hi: torch.minimum(r * -a, r.clamp(lo, hi) * -a))


@registry.mutant("dapo.sequence_mean", base="dapo")
def sequence_mean():
    """Each response's token mean, then the mean over responses (GRPO's sample-level loss, the bias DAPO's
    token-level loss removes): a long response's tokens weigh less."""
    def aggregate(per_token, n_row, n):
        has = n_row > 0
        return (per_token.sum(dim=-1)[has] / n_row[has].to(per_token.dtype)).mean()

    return _loss("dapo.sequence_mean", aggregate_fn=aggregate)


@registry.mutant("dapo.mean_over_padded", base="dapo")
def mean_over_padded():
    """The token mean over all B x L slots, padding and prompt included."""
    return _loss("dapo.mean_over_padded", aggregate_fn=lambda per_token, n_row, n: per_token.mean())


@registry.mutant("dapo.mask_by_multiply", base="dapo")
def mask_by_multiply():
    """Masked slots zeroed by multiplying with the mask: NaN * 0 = NaN (OpenRLHF PR #1240)."""
    return _loss("dapo.mask_by_multiply",
                 ratio_fn=lambda logp, old, m, cdt: (logp.to(cdt) - old.detach().to(cdt)) * m.to(cdt))


@registry.mutant("dapo.no_ratio_guard", base="dapo")
def no_ratio_guard():
    """No clamp before exp: a large log-ratio overflows float32 to inf and the loss to NaN (OpenRLHF PR #1293)."""
    return _loss("dapo.no_ratio_guard", guard_fn=lambda lr, c: lr)


@registry.mutant("dapo.ratio_detached", base="dapo")
def ratio_detached():
    """The ratio under stop-gradient: the value is right, no gradient reaches the policy."""
    return _loss("dapo.ratio_detached", ratio_fn=lambda logp, old, m, cdt: log_ratio(logp, old, m, cdt).detach())


@registry.mutant("dapo.logp_bonus", base="dapo")
def logp_bonus():
    """An always-on regulariser, -1e-3 log r per token (a KL or entropy term left on by default): the loss and its
    gradient move without any advantage."""
    return _loss("dapo.logp_bonus",
                 surrogate_fn=lambda r, a, lo, hi: L.clipped_surrogate(r, a, lo, hi) - 1e-3 * r.log())


def _in_input_dtype(fn):
    def wrapped(logp, *args, **kwargs):
        loss, metrics = fn(logp, *args, **kwargs)
        return loss.to(logp.dtype), metrics

    return wrapped


@registry.mutant("dapo.loss_in_input_dtype", base="dapo")
def loss_in_input_dtype():
    """The loss handed back in the input's dtype: a bfloat16/float16 call rounds the loss."""
    return IMPL.replace("dapo.loss_in_input_dtype", dapo_loss=_in_input_dtype(L.dapo_loss))


@registry.mutant("dapo.clip_unchecked", base="dapo")
def clip_unchecked():
    """Out-of-range clip bounds silently clamped into range instead of refused."""
    def loss(*args, clip_low=L.CLIP_LOW, clip_high=L.CLIP_HIGH, **kwargs):
        return L.dapo_loss(*args, clip_low=min(max(float(clip_low), 0.0), 0.999),
                           clip_high=max(float(clip_high), 0.0), **kwargs)

    return IMPL.replace("dapo.clip_unchecked", dapo_loss=loss)


@registry.mutant("dapo.old_logp_not_detached", base="dapo")
def old_logp_not_detached():
    """The behaviour log-probs not detached: a behaviour log-prob that requires grad receives one."""
    def ratio(logp, old, m, cdt):
        return torch.where(m, logp.to(cdt) - old.to(cdt), torch.zeros((), dtype=cdt))

    return _loss("dapo.old_logp_not_detached", ratio_fn=ratio)


@registry.mutant("dapo.overlong_hard", base="dapo")
def overlong_hard():
    """No soft ramp: every response past L_max - L_cache gets -1 (the hard punishment the paper replaces)."""
    def penalty(lengths, max_length, cache_length):
        out = L.overlong_penalty(lengths, max_length, cache_length)
        return torch.where(out < 0, -torch.ones_like(out), out)

    return IMPL.replace("dapo.overlong_hard", overlong_penalty=penalty)


@registry.mutant("dapo.overlong_off_by_one", base="dapo")
def overlong_off_by_one():
    """The ramp starts one token early: a response of exactly L_max - L_cache tokens is punished."""
    def penalty(lengths, max_length, cache_length):
        return L.overlong_penalty(lengths + 1, max_length, cache_length)

    return IMPL.replace("dapo.overlong_off_by_one", overlong_penalty=penalty)


@registry.mutant("dapo.overlong_unchecked", base="dapo")
def overlong_unchecked():
    """A cache longer than L_max (or a zero cache) silently accepted: the ramp divides by a bad L_cache."""
    def penalty(lengths, max_length, cache_length):
        cache = min(max(int(cache_length), 1), int(max_length))
        return L.overlong_penalty(lengths, max_length, cache)

    return IMPL.replace("dapo.overlong_unchecked", overlong_penalty=penalty)


@registry.mutant("dapo.keeps_solved_groups", base="dapo")
def keeps_solved_groups():
    """Dynamic sampling keeps groups whose responses are all correct (only all-wrong groups are dropped)."""
    def keep(correct, group_size):
        out = L.dynamic_sampling_mask(correct, group_size)
        solved = (correct != 0).reshape(-1, group_size).all(dim=1, keepdim=True).expand(-1, group_size).reshape(-1)
        return out | solved

    return IMPL.replace("dapo.keeps_solved_groups", dynamic_sampling_mask=keep)


# --- knobs the interface declares, and the forms of correctness it accepts ----------------------------------------


@registry.mutant("dapo.bounds_fixed", base="dapo")
def bounds_fixed():
    """clip_low and clip_high are validated, then ignored: the loss always clips at [1 - 0.2, 1 + 0.28]."""
    return _loss("dapo.bounds_fixed",
                 surrogate_fn=lambda r, a, lo, hi: L.clipped_surrogate(r, a, 1.0 - L.CLIP_LOW, 1.0 + L.CLIP_HIGH))


@registry.mutant("dapo.clamp_fixed", base="dapo")
def clamp_fixed():
    """log_ratio_clamp is validated, then ignored: the log-ratio is always clamped at 20."""
    return _loss("dapo.clamp_fixed", guard_fn=lambda lr, c: L.clamp_log_ratio(lr, L.LOG_RATIO_CLAMP))


@registry.mutant("dapo.sampling_bool_only", base="dapo")
def sampling_bool_only():
    """dynamic_sampling_mask takes bool correctness only: 0/1 integers, which the interface accepts, are refused."""
    def keep(correct, group_size):
        if correct.dtype != torch.bool:
            raise TypeError(f"correct must be bool, got {correct.dtype}")
        return L.dynamic_sampling_mask(correct, group_size)

    return IMPL.replace("dapo.sampling_bool_only", dynamic_sampling_mask=keep)


# --- a count in a narrow dtype (seen only past 2^15 tokens in a row: the scale tier) ---------------------------------


@registry.mutant("dapo.token_count_int16", base="dapo")
def token_count_int16():
    """Each response's valid-token count kept in int16 and summed into N: a response past 32,767 tokens wraps
    negative, and the token mean divides by the wrong N."""
    return _loss("dapo.token_count_int16",
                 aggregate_fn=lambda per_token, n_row, n: per_token.sum() / n_row.to(torch.int16).sum())  # DEFECT
