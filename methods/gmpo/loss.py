"""GMPO (arXiv 2507.20673): geometric-mean policy optimization.

For response i with valid tokens t = 1..|o_i| and one advantage A_i,

    l_t     = clamp(logp_t - old_t, -C, C)                                         token log-ratio (declared clamp)
    k_t     = sgn(A) min(sgn(A) l_t, sgn(A) clip(l_t, -eps_low, eps_high))          PPO's pessimistic clip, per token,
                                                                                    in log space
    s_i     = exp( (1/|o_i|) sum_t k_t )                                            geometric mean of clipped ratios
    L       = -(1/G) sum_i A_i s_i                                                  G non-empty responses

In ratio space the clip range is (e^-eps_low, e^eps_high), the paper's (e^-0.4, e^0.4). For A > 0 a token is clipped
above only, for A < 0 below only; A = 0 gives s = 1 and no gradient. d L / d logp_t = -A_i s_i / (G |o_i|) at an
unclipped token, 0 at a clipped one.
"""

from __future__ import annotations

import torch

from methods.common.pg_inputs import check_clamp, check_logp, check_number, compute_dtype, log_ratio, row_advantages, \
    row_counts

CLIP_LOW, CLIP_HIGH = 0.4, 0.4
LOG_RATIO_CLAMP = 20.0

__all__ = ["build_gmpo", "gmpo_loss", "geometric_ratio", "pessimistic_clip", "row_mean", "response_mean"]


def pessimistic_clip(lr: torch.Tensor, sgn: torch.Tensor, low: float, high: float) -> torch.Tensor:
    """k = sgn min(sgn l, sgn clip(l, -low, high)): the clip only ever lowers the objective A s."""
    return sgn * torch.minimum(sgn * lr, sgn * lr.clamp(-low, high))


def row_mean(k: torch.Tensor, n_row: torch.Tensor) -> torch.Tensor:
    """Each response's mean over its valid tokens (0 for an empty one: s = 1, no gradient)."""
    return k.sum(dim=-1) / n_row.clamp_min(1).to(k.dtype)


def response_mean(per_row: torch.Tensor, n_row: torch.Tensor, rows: int) -> torch.Tensor:
    """The mean over the G non-empty responses: each response weighs 1/G whatever its length."""
    return per_row.sum() / rows


def clamp_log_ratio(lr: torch.Tensor, c: float) -> torch.Tensor:
    """The overflow guard: each token log-ratio clamped to [-C, C], so the mean, and s, stay finite."""
    return lr.clamp(-c, c)


def build_gmpo(ratio_fn=log_ratio, guard_fn=clamp_log_ratio, clip_fn=pessimistic_clip, mean_fn=row_mean,
               aggregate_fn=response_mean):
    """(geometric_ratio, gmpo_loss) assembled from their parts; the method uses the defaults, a mutant swaps one."""

    def parts(logp, old_logp, advantages, mask, clip_low, clip_high, log_ratio_clamp):
        m = check_logp(logp, mask, ("old_logp", old_logp))
        low = check_number("clip_low", clip_low)
        high = check_number("clip_high", clip_high)
        c = check_clamp(log_ratio_clamp)
        n_row, _, rows = row_counts(m)
        cdt = compute_dtype(logp.dtype)
        a = row_advantages(advantages, n_row > 0, cdt)
        k = clip_fn(guard_fn(ratio_fn(logp, old_logp, m, cdt), c), torch.sign(a)[:, None], low, high)
        return mean_fn(k, n_row).exp(), a, n_row, rows

    def geometric_ratio(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor, *,
                        clip_low: float = CLIP_LOW, clip_high: float = CLIP_HIGH,
                        log_ratio_clamp: float = LOG_RATIO_CLAMP) -> torch.Tensor:
        """s_i [B]: the geometric mean of each response's token ratios, each clipped pessimistically for the sign
        of its response's advantage; 1 for an empty response or a zero advantage."""
        return parts(logp, old_logp, advantages, mask, clip_low, clip_high, log_ratio_clamp)[0]

    def gmpo_loss(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor, *,
                  clip_low: float = CLIP_LOW, clip_high: float = CLIP_HIGH, log_ratio_clamp: float = LOG_RATIO_CLAMP):
        """-(1/G) sum_i A_i s_i. Returns (loss, metrics): tokens and rows (G)."""
        s, a, n_row, rows = parts(logp, old_logp, advantages, mask, clip_low, clip_high, log_ratio_clamp)
        return aggregate_fn(-a * s, n_row, rows), {"tokens": int(n_row.sum()), "rows": rows}

    return geometric_ratio, gmpo_loss


geometric_ratio, gmpo_loss = build_gmpo()
