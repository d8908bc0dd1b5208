"""GRPO (DeepSeekMath, arXiv 2402.03300) as the pages' control: group advantages and the clipped loss.

Notation: per response token t (prompt and padding excluded), r_t = exp(logp_t - old_t),

    A_i   = (R_i - mean_g R) / (std_g R + eps)                                    group-normalised advantage
    f_t   = -min(r_t A, clip(r_t, 1 - eps_low, 1 + eps_high) A)                   PPO clip, separate bounds
    f_t   = min(f_t, -c A)  where A < 0, when a dual clip c > 1 is given          dual clip (Ye et al. 2020)
    f_t  += beta * (exp(ref_t - logp_t) - (ref_t - logp_t) - 1)                   k3 KL to a reference policy

and the loss aggregates f over valid tokens in one of AGG_MODES (the names are verl's):

    token-mean               sum_t f_t / N                                        the pages' control, the default
    seq-mean-token-mean      mean over non-empty responses of (mean over their tokens)     the DeepSeekMath paper
    seq-mean-token-sum-norm  sum_t f_t / (non-empty responses * norm_length)      a token sum over a constant

Choices the paper leaves open (each stated in specs/grpo.yaml):

* Arithmetic in float32 or wider; float16/bfloat16 inputs are upcast and gradients come back in their dtype.
* The log-ratio is clamped to [-log_ratio_clamp, +log_ratio_clamp] (20, as verl) before exp, so the ratio
  cannot overflow; where the clamp binds the token's ratio is a constant (no gradient). How often it bound is
  reported (metrics["clamped_tokens"]), never silent.
* Junk in masked slots (NaN, +/-1e4) is removed with torch.where before any arithmetic, never by multiplying.
* Group statistics: population std (divide by n) over the group's responses that have at least one valid token;
  a fully masked response neither moves its group's mean or std nor gets an advantage (verl PR #6452). A group
  whose counted rewards are all equal (a group of one included) gets advantages of exactly 0, whatever eps.
* Empty rows count in no mean; a call with no valid token at all is refused (there is nothing to optimise).
"""

from __future__ import annotations

import math

import torch

AGG_MODES = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm")
DEFAULT_AGG = "token-mean"
LOG_RATIO_CLAMP = 20.0

__all__ = ["AGG_MODES", "DEFAULT_AGG", "LOG_RATIO_CLAMP", "group_advantages", "grpo_loss", "build_grpo_loss",
           "log_ratio", "clipped_surrogate", "fused_surrogate", "composed_surrogate", "k3_kl", "aggregate", "as_bool_mask", "compute_dtype", "check_clip"]


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """float32 or wider: float16/bfloat16 are upcast, float32/float64 kept."""
    return torch.promote_types(dtype, torch.float32)


def as_bool_mask(mask: torch.Tensor, shape: torch.Size) -> torch.Tensor:
    """The response mask as bool; a mask holding other values than 0/1 is refused (verl #2506)."""
    if mask.shape != shape:
        raise ValueError(f"mask has shape {tuple(mask.shape)}, expected {tuple(shape)} (same as logp)")
    if mask.dtype == torch.bool:
        return mask
    if not bool(((mask == 0) | (mask == 1)).all()):
        raise ValueError("mask must be boolean or hold only 0 and 1; it holds other values "
                         "(was an advantage or log-prob tensor passed as the mask?)")
    return mask != 0


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def check_clip(clip_low: float, clip_high: float) -> None:
    if not (0.0 <= float(clip_low) < 1.0) or not (float(clip_high) >= 0.0) or not math.isfinite(clip_high):
        raise ValueError(f"need 0 <= clip_low < 1 and a finite clip_high >= 0, got clip_low={clip_low}, "
                         f"clip_high={clip_high}")


def _check_clamp(log_ratio_clamp: float) -> None:
    if isinstance(log_ratio_clamp, bool) or not (float(log_ratio_clamp) > 0.0) or not math.isfinite(
            float(log_ratio_clamp)) or float(log_ratio_clamp) > 80.0:
        raise ValueError(f"log_ratio_clamp must be in (0, 80] (exp of it must stay finite in float32), "
                         f"got {log_ratio_clamp!r}")


def group_advantages(rewards: torch.Tensor, group_size: int, eps: float = 1e-6, *,
                     mask: torch.Tensor | None = None) -> torch.Tensor:
    """(R - group mean) / (group std + eps) per group of `group_size` consecutive rows, in float64.

    `mask` ([B, L] response mask or [B] row flags) excludes fully masked responses from their group's statistics;
    they get advantage 0. Two-pass variance: the one-pass E[x^2] - E[x]^2 form shrinks advantages in low-variance
    groups (verl PR #6348). Returned in the rewards' dtype.
    """
    if rewards.dim() != 1:
        raise ValueError(f"rewards must be [B], got shape {tuple(rewards.shape)}")
    B = rewards.shape[0]
    if not _is_int(group_size) or group_size < 1 or B % group_size:
        raise ValueError(f"group_size must be an integer >= 1 that divides the batch of {B}, got {group_size!r}")
    if isinstance(eps, bool) or not (float(eps) >= 0.0) or not math.isfinite(float(eps)):
        raise ValueError(f"eps must be a finite number >= 0, got {eps!r}")
    if mask is None:
        keep = torch.ones(B, dtype=torch.bool, device=rewards.device)
    else:
        if mask.dim() == 2:
            keep = as_bool_mask(mask, mask.shape).any(dim=-1)
        elif mask.shape == (B,):
            keep = as_bool_mask(mask, mask.shape)
        else:
            raise ValueError(f"mask must be [B, L] or [B] with B = {B}, got shape {tuple(mask.shape)}")
    r = rewards.detach().double()
    zero = torch.zeros((), dtype=torch.float64, device=r.device)
    r = torch.where(keep, r, zero)
    if not bool(torch.isfinite(r).all()):
        raise ValueError("rewards hold NaN or inf for a response that has valid tokens")
    r, k = r.reshape(-1, group_size), keep.reshape(-1, group_size)
    n = k.sum(dim=1, keepdim=True).clamp_min(1).double()
    mean = r.sum(dim=1, keepdim=True) / n
    d = torch.where(k, r - mean, zero)
    std = (d * d).sum(dim=1, keepdim=True).div(n).sqrt()
    inf = torch.tensor(math.inf, dtype=torch.float64, device=r.device)
    # all counted rewards equal: exactly 0 (a rounded mean would leave +-1e-17 / eps behind)
    flat = torch.where(k, r, inf).amin(dim=1, keepdim=True) == torch.where(k, r, -inf).amax(dim=1, keepdim=True)
    adv = torch.where(k & ~flat, d / (std + eps), zero)
    return adv.reshape(-1).to(rewards.dtype)


def aggregate(per_token: torch.Tensor, m: torch.Tensor, agg: str, n_row: torch.Tensor,
              norm_length: int | None) -> torch.Tensor:
    """Reduce a [B, L] per-token loss (0 at masked slots) as `agg` says; empty rows count in no mean."""
    cdt = per_token.dtype
    if agg == "token-mean":
        return per_token.sum() / n_row.sum().to(cdt)
    rows = (n_row > 0).sum().to(cdt)
    if agg == "seq-mean-token-mean":
        return (per_token.sum(dim=-1) / n_row.clamp_min(1).to(cdt)).sum() / rows
    length = m.shape[-1] if norm_length is None else norm_length
    return per_token.sum() / (rows * float(length))


def _check_agg(agg: str, norm_length) -> None:
    if agg not in AGG_MODES:
        raise ValueError(f"agg must be one of {', '.join(AGG_MODES)}; got {agg!r}")
    if norm_length is not None and (not _is_int(norm_length) or norm_length < 1):
        raise ValueError(f"norm_length must be an integer >= 1 or None, got {norm_length!r}")


def expand_advantages(advantages: torch.Tensor, shape: torch.Size) -> torch.Tensor:
    if advantages.dim() == 1 and advantages.shape[0] == shape[0]:
        return advantages[:, None].expand(shape)
    if advantages.shape == shape:
        return advantages
    raise ValueError(f"advantages must be [B] or [B, L] = {tuple(shape)}, got {tuple(advantages.shape)}")


def check_pair(logp: torch.Tensor, old_logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    if logp.dim() != 2:
        raise ValueError(f"logp must be [B, L], got shape {tuple(logp.shape)}")
    if old_logp.shape != logp.shape:
        raise ValueError(f"old_logp has shape {tuple(old_logp.shape)}, expected {tuple(logp.shape)}")
    return as_bool_mask(mask, logp.shape)


def masked_advantages(advantages: torch.Tensor, m: torch.Tensor, cdt: torch.dtype) -> torch.Tensor:
    """[B, L] advantages at valid tokens, 0 elsewhere (junk removed); a NaN/inf at a valid token is refused."""
    zero = torch.zeros((), dtype=cdt, device=m.device)
    a = torch.where(m, expand_advantages(advantages, m.shape).detach().to(cdt), zero)
    if not bool(torch.isfinite(a.sum())) and not bool(torch.isfinite(a).all()):
        raise ValueError("advantages hold NaN or inf at valid response positions")
    return a


def log_ratio(logp: torch.Tensor, old_logp: torch.Tensor, m: torch.Tensor, cdt: torch.dtype) -> torch.Tensor:
    """logp - old at valid tokens, 0 at masked ones (junk removed by torch.where); differentiable in logp."""
    zero = torch.zeros((), dtype=cdt, device=logp.device)
    return torch.where(m, logp.to(cdt) - old_logp.detach().to(cdt), zero)


def clipped_surrogate(ratio: torch.Tensor, a: torch.Tensor, lo: float, hi: float, dual_clip: float | None):
    """Per-token -min(r A, clip(r, lo, hi) A), capped at -c A where A < 0 with a dual clip c; 0 where A = 0
    (composed from autograd operations: GSPO's surrogate, and the one GRPO's fused node must equal)."""
    # max(-rA, -clip(r)A) = -min(rA, clip(r)A)
    per_token = torch.maximum(ratio * -a, ratio.clamp(lo, hi) * -a)
    if dual_clip is not None:
        per_token = torch.where(a < 0, torch.minimum(per_token, a * -float(dual_clip)), per_token)
    return per_token


def surrogate_stats(lr: torch.Tensor, r: torch.Tensor, per_token: torch.Tensor, a: torch.Tensor, m: torch.Tensor,
                    lo: float, hi: float, dual_clip: float | None, clamp: float) -> torch.Tensor:
    """[ratio min, ratio max, tokens below lo, above hi, capped by the dual clip, clamped] over valid tokens.
    Masked slots hold lr = 0, r = 1 and A = 0, inside every bound, so only the extremes need hiding."""
    with torch.no_grad():
        cdt = r.dtype
        inf = torch.tensor(math.inf, dtype=cdt, device=r.device)
        dual = (torch.zeros((), dtype=cdt, device=r.device) if dual_clip is None else
                ((a < 0) & (torch.maximum(r * -a, r.clamp(lo, hi) * -a) > a * -float(dual_clip))).sum().to(cdt))
        return torch.stack([torch.where(m, r, inf).amin(), torch.where(m, r, -inf).amax(), (r < lo).sum().to(cdt),
                            (r > hi).sum().to(cdt), dual, (lr.abs() > clamp).sum().to(cdt)])


class _ClippedTerm(torch.autograd.Function):
    """The per-token clipped surrogate of the log-ratio as one autograd node.

    Its value is `clipped_surrogate(exp(clamp(lr)), A, ...)` computed once; its backward is the analytic gradient
    d f / d lr = -A r where the unclipped branch is the larger loss, the dual cap does not bind and the clamp does
    not bind, 0 elsewhere: one multiply instead of the clamp/exp/mul/maximum/where graph, which cost more than
    verl's whole loss at 8 x 16k tokens (benchmarks/family_loss.py). Ties (u == v) happen inside the bounds, where
    both branches carry the same gradient, or at A = 0, where it is 0.
    """

    @staticmethod
    def forward(ctx, lr, a, lo, hi, dual_clip, clamp):
        bound = lr.abs() > clamp  # the clamp binds: a constant ratio, no gradient
        r = lr.clamp(-clamp, clamp).exp_()
        na = a.neg()
        u = r * na
        v = r.clamp(lo, hi).mul_(na)
        clipped = u < v  # the clipped branch is the larger loss: a constant
        f = torch.maximum(u, v, out=v)
        coef = u.masked_fill_(clipped.logical_or_(bound), 0.0)  # -A r on the unclipped branch
        if dual_clip is not None:
            cap = na.mul_(float(dual_clip))
            capped = (a < 0).logical_and_(f > cap)
            f = torch.where(capped, cap, f)
            coef = coef.masked_fill_(capped, 0.0)
        ctx.save_for_backward(coef)
        ctx.mark_non_differentiable(r)
        return f, r

    @staticmethod
    def backward(ctx, grad, _grad_r):
        (coef,) = ctx.saved_tensors
        return grad * coef, None, None, None, None, None


def fused_surrogate(lr: torch.Tensor, a: torch.Tensor, m: torch.Tensor, lo: float, hi: float,
                    dual_clip: float | None, clamp: float):
    """(per-token loss [B, L], stats) from the masked log-ratio: the clamp, the ratio, the clip, the dual clip."""
    f, r = _ClippedTerm.apply(lr, a, lo, hi, dual_clip, clamp)
    return f, surrogate_stats(lr.detach(), r, f.detach(), a, m, lo, hi, dual_clip, clamp)


def composed_surrogate(lr: torch.Tensor, a: torch.Tensor, m: torch.Tensor, lo: float, hi: float,
                       dual_clip: float | None, clamp: float, surrogate=clipped_surrogate, guard: bool = True):
    """The same as fused_surrogate from autograd operations (how mutants swap one piece)."""
    r = (lr.clamp(-clamp, clamp) if guard else lr).exp()
    f = surrogate(r, a, lo, hi, dual_clip)
    return f, surrogate_stats(lr.detach(), r.detach(), f.detach(), a, m, lo, hi, dual_clip, clamp)


def k3_kl(logp: torch.Tensor, ref_logp: torch.Tensor, m: torch.Tensor, cdt: torch.dtype) -> torch.Tensor:
    """k3 = pi_ref/pi - log(pi_ref/pi) - 1 per token (0 at masked slots), differentiable in logp."""
    zero = torch.zeros((), dtype=cdt, device=logp.device)
    d = torch.where(m, ref_logp.detach().to(cdt) - logp.to(cdt), zero)
    return d.exp() - d - 1.0


def build_grpo_loss(ratio_fn=log_ratio, surrogate_fn=fused_surrogate, aggregate_fn=None, kl_fn=k3_kl):
    """The GRPO loss assembled from its parts; the method uses the defaults, a mutant swaps exactly one."""
    aggregate_fn = aggregate_fn or aggregate

    def grpo_loss(
        logp: torch.Tensor,
        old_logp: torch.Tensor,
        advantages: torch.Tensor,
        mask: torch.Tensor,
        *,
        clip_low: float = 0.2,
        clip_high: float = 0.2,
        dual_clip: float | None = None,
        ref_logp: torch.Tensor | None = None,
        beta: float = 0.0,
        agg: str = DEFAULT_AGG,
        norm_length: int | None = None,
        log_ratio_clamp: float = LOG_RATIO_CLAMP,
    ):
        """GRPO's clipped surrogate with the per-token ratio, aggregated as `agg` (see the module docstring).

        Returns (loss, metrics); metrics are plain numbers: tokens, rows (non-empty responses), ratio_min,
        ratio_max, clip_fraction (valid tokens whose ratio lies outside [1 - clip_low, 1 + clip_high]),
        clip_low_fraction, clip_high_fraction, dual_clip_fraction (A < 0 tokens capped by the dual clip),
        clamped_tokens (log-ratios the clamp changed) and kl (token mean of the k3 term; 0 without a reference).
        """
        m = check_pair(logp, old_logp, mask)
        check_clip(clip_low, clip_high)
        if dual_clip is not None and (isinstance(dual_clip, bool) or not float(dual_clip) > 1.0
                                      or not math.isfinite(float(dual_clip))):
            raise ValueError(f"dual_clip must be None or a finite c > 1, got {dual_clip!r}")
        if isinstance(beta, bool) or not (float(beta) >= 0.0) or not math.isfinite(float(beta)):
            raise ValueError(f"beta must be a finite number >= 0, got {beta!r}")
        if ref_logp is not None and ref_logp.shape != logp.shape:
            raise ValueError(f"ref_logp has shape {tuple(ref_logp.shape)}, expected {tuple(logp.shape)}")
        if float(beta) > 0.0 and ref_logp is None:
            raise ValueError("beta > 0 needs ref_logp, the reference policy's log-probs")
        _check_agg(agg, norm_length)
        _check_clamp(log_ratio_clamp)
        n_row = m.sum(dim=-1)
        n = int(n_row.sum())
        if n == 0:
            raise ValueError("the mask selects no response token: there is nothing to optimise")

        cdt = compute_dtype(logp.dtype)
        zero = torch.zeros((), dtype=cdt, device=logp.device)
        a = masked_advantages(advantages, m, cdt)
        C = float(log_ratio_clamp)
        lo, hi = 1.0 - float(clip_low), 1.0 + float(clip_high)
        lr = ratio_fn(logp, old_logp, m, cdt)
        per_token, stats = surrogate_fn(lr, a, m, lo, hi, dual_clip, C)
        kl = None
        if float(beta) > 0.0:
            kl = kl_fn(logp, ref_logp, m, cdt)
            per_token = per_token + float(beta) * kl
        loss = aggregate_fn(per_token, m, agg, n_row, norm_length)
        nf = float(n)
        if kl is not None:
            with torch.no_grad():
                stats = torch.cat([stats, (torch.where(m, kl.detach(), zero).sum() / nf)[None]])
        stats = stats.tolist() + ([] if kl is not None else [0.0])
        metrics = {"tokens": n, "rows": int((n_row > 0).sum()), "ratio_min": stats[0], "ratio_max": stats[1],
                   "clip_fraction": (stats[2] + stats[3]) / nf, "clip_low_fraction": stats[2] / nf,
                   "clip_high_fraction": stats[3] / nf, "dual_clip_fraction": stats[4] / nf,
                   "clamped_tokens": int(stats[5]), "kl": stats[6]}
        return loss, metrics

    return grpo_loss


grpo_loss = build_grpo_loss()
