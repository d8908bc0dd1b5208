"""DAPO (arXiv 2503.14476): the clip-higher, token-level policy loss and the two data-side rules of the paper.

For response tokens t of the G responses o_i of a batch (prompt, padding and holes excluded),

    r_i,t = exp(clamp(logp_i,t - old_i,t, -C, C))                                   per-token ratio
    f_i,t = -min(r A, clip(r, 1 - eps_low, 1 + eps_high) A)                          clip-higher: 0.2 / 0.28
    L     = (1 / sum_i |o_i|) sum_i sum_t f_i,t                                      token-level aggregation

    R_length(|y|) = 0                               if |y| <= L_max - L_cache        soft overlong punishment
                  = ((L_max - L_cache) - |y|) / L_cache   if L_max - L_cache < |y| <= L_max
                  = -1                              if |y| > L_max
    keep group g  iff  0 < |{o_i in g : correct}| < G                                 dynamic sampling

The two data-side rules are functions of their own (the reward and the sampler apply them, not the loss): a
framework's policy loss is not expected to contain them (specs/dapo.yaml, assumption `scope`).
"""

from __future__ import annotations

import torch

from methods.common.pg_inputs import check_clamp, check_length, check_logp, check_number, compute_dtype, log_ratio, \
    row_counts, token_advantages

CLIP_LOW, CLIP_HIGH = 0.2, 0.28
LOG_RATIO_CLAMP = 20.0

__all__ = ["CLIP_LOW", "CLIP_HIGH", "LOG_RATIO_CLAMP", "build_dapo", "dapo_loss", "overlong_penalty",
           "dynamic_sampling_mask", "clipped_surrogate", "clamp_log_ratio", "token_mean"]


def clipped_surrogate(r: torch.Tensor, a: torch.Tensor, lo: float, hi: float) -> torch.Tensor:
    """-min(r A, clip(r, lo, hi) A) per token: where the clipped branch is strictly the larger loss it is a
    constant and the token passes no gradient; 0 where A = 0 (masked slots)."""
    return torch.maximum(r * -a, r.clamp(lo, hi) * -a)


def token_mean(per_token: torch.Tensor, n_row: torch.Tensor, n: int) -> torch.Tensor:
    """The token-level aggregation: every valid token of the batch weighs 1/N, whatever its response's length."""
    return per_token.sum() / n


def clamp_log_ratio(lr: torch.Tensor, c: float) -> torch.Tensor:
    """The overflow guard: the log-ratio clamped to [-C, C] before exp (a binding clamp passes no gradient)."""
    return lr.clamp(-c, c)


def build_dapo(ratio_fn=log_ratio, guard_fn=clamp_log_ratio, surrogate_fn=clipped_surrogate, aggregate_fn=token_mean):
    """`dapo_loss` assembled from its parts; the method uses the defaults, a mutant swaps one."""

    def dapo_loss(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor, *,
                  clip_low: float = CLIP_LOW, clip_high: float = CLIP_HIGH,
                  log_ratio_clamp: float = LOG_RATIO_CLAMP):
        """The DAPO loss (module docstring). Returns (loss, metrics): tokens (N) and rows (non-empty responses)."""
        m = check_logp(logp, mask, ("old_logp", old_logp))
        lo = 1.0 - check_number("clip_low", clip_low, below=1.0)
        hi = 1.0 + check_number("clip_high", clip_high)
        c = check_clamp(log_ratio_clamp)
        n_row, n, rows = row_counts(m)
        cdt = compute_dtype(logp.dtype)
        a = token_advantages(advantages, m, cdt)
        r = guard_fn(ratio_fn(logp, old_logp, m, cdt), c).exp()
        loss = aggregate_fn(surrogate_fn(r, a, lo, hi), n_row, n)
        return loss, {"tokens": n, "rows": rows}

    return dapo_loss


dapo_loss = build_dapo()


def overlong_penalty(lengths: torch.Tensor, max_length: int, cache_length: int) -> torch.Tensor:
    """R_length per response [B] (float64) from integer response lengths: 0 up to L_max - L_cache, then a linear
    ramp to -1 at L_max, -1 past it."""
    if lengths.dtype.is_floating_point or lengths.dtype.is_complex or lengths.dtype == torch.bool:
        raise TypeError(f"lengths must be integer token counts, got {lengths.dtype}")
    check_length("max_length", max_length)
    check_length("cache_length", cache_length)
    if cache_length > max_length:
        raise ValueError(f"cache_length must be <= max_length, got {cache_length} > {max_length}")
    if bool((lengths < 0).any()):
        raise ValueError("lengths must be >= 0")
    expected = max_length - cache_length
    y = lengths.to(torch.float64)
    ramp = (expected - y) / cache_length
    return torch.where(y <= expected, torch.zeros_like(y), torch.where(y <= max_length, ramp, -torch.ones_like(y)))


def dynamic_sampling_mask(correct: torch.Tensor, group_size: int) -> torch.Tensor:
    """[B] bool: True for every response of a group whose number of correct responses is neither 0 nor G (a group
    all right or all wrong has zero advantages and is filtered out and resampled)."""
    if correct.dim() != 1:
        raise ValueError(f"correct must be [B], got shape {tuple(correct.shape)}")
    ok = correct.dtype == torch.bool or not (correct.dtype.is_floating_point or correct.dtype.is_complex)
    if not ok:
        raise TypeError(f"correct must be bool (or 0/1 integers), got {correct.dtype}")
    check_length("group_size", group_size)
    if correct.shape[0] % group_size:
        raise ValueError(f"group_size must divide the batch of {correct.shape[0]}, got {group_size}")
    if bool(((correct != 0) & (correct != 1)).any()):
        raise ValueError("correct must hold only 0 and 1")
    hits = (correct != 0).reshape(-1, group_size).sum(dim=1, keepdim=True)
    keep = (hits > 0) & (hits < group_size)
    return keep.expand(-1, group_size).reshape(-1)
